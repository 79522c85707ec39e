#!/usr/bin/env bash
# session 10, call 3: af5fe68 (queued decode) under pytest -m cuda tests/cuda, and three attention variants A/B'd
O=$OUT
OUT=$O/ab VARIANTS="comb9 comb16 attn-st2" AB_REPEAT=5 VARIANT_TESTS="tests/cuda/test_ops_core.py -k attn_decode" \
  KEEP_MS=0.005 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
cat $O/ab/summary.txt; grep -A12 "median of" $O/ab-stdout.txt | head -14
export PYTHONPATH=$PWD/.gpu/pylib
timeout 300 python3 -m pytest -m cuda tests/cuda -q -rs -p no:cacheprovider > $O/pytest.log 2>&1
echo "pytest -m cuda tests/cuda: $(tail -1 $O/pytest.log)"; grep -E "^FAILED" $O/pytest.log | head
