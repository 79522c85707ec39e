#!/usr/bin/env bash
# session 10, call 5: final benches of the final commit + the attention and engine tests on it
O=$OUT
OUT=$O/final TESTS=0 bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
cat $O/final/summary.txt
export PYTHONPATH=$PWD/.gpu/pylib
timeout 140 python3 -m pytest -m cuda tests/cuda/test_engine.py tests/cuda/test_ops_core.py -k "engine or attn_decode" -q -rs -p no:cacheprovider > $O/pytest-engine.log 2>&1
echo "pytest engine + attention: $(tail -1 $O/pytest-engine.log)"
