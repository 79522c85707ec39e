#!/usr/bin/env bash
# session 13, call 6 (branch s13 = main's engine, run.sh building from an empty folder): carve72
# again (every decode kernel asks for 72 % of 228 KiB of shared memory), 7 rounds.
O=$OUT
OUT=$O/ab VARIANTS="carve72" AB_REPEAT=7 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A4 "median of" $O/ab-stdout.txt | head -4
