#!/usr/bin/env bash
# session 10, call 4: final benches of 66e2770 (real prefill, both models), the engine tests, and the
# early-load combine (comb16) A/B'd on top of the two-stage attention
O=$OUT
OUT=$O/final TESTS=0 bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
cat $O/final/summary.txt
export PYTHONPATH=$PWD/.gpu/pylib
timeout 150 python3 -m pytest -m cuda tests/cuda/test_engine.py tests/cuda/test_ops_core.py -k "engine or attn_decode or Engine or queued" -q -rs -p no:cacheprovider > $O/pytest-engine.log 2>&1
echo "pytest engine + attention: $(tail -1 $O/pytest-engine.log)"
OUT=$O/ab VARIANTS="comb16" AB_REPEAT=5 timeout 150 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A3 "median of" $O/ab-stdout.txt | head -4
