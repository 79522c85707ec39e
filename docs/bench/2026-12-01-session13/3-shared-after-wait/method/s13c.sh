#!/usr/bin/env bash
# session 13, call 3 (branch s13 = main's engine): is DRAM traffic in the router / top-k window on
# the critical path? gate_up's shared-slot blocks loading their first batch after the wait instead
# of before it (shq), 5 rounds.
O=$OUT
OUT=$O/ab VARIANTS="shq" AB_REPEAT=5 VARIANT_TESTS="tests/cuda/test_engine.py" bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A4 "median of" $O/ab-stdout.txt | head -4
