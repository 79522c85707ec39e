#!/usr/bin/env bash
# session 11, call 1: f132378 under pytest -m cuda tests/cuda (TESTS=1), and the pass rule
# (embedding waits before it triggers) with the GDN states / the decode attention's first tile read
# before the PDL wait, A/B'd; then the engine, attention and GDN tests on the combined variant.
O=$OUT
OUT=$O/ab TESTS=1 VARIANTS="pass-gdn pass-attn pass-both" AB_REPEAT=5 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
cat $O/ab/summary.txt; grep -A12 "median of" $O/ab-stdout.txt | head -14
tar xzf $O/ab/results.tgz -C /tmp ./pytest.log 2>/dev/null && { echo "base pytest: $(tail -1 /tmp/pytest.log)"; grep -E "^FAILED" /tmp/pytest.log | head; }
export PYTHONPATH=$PWD/.gpu/pylib
MOD=$(ls app/lampo/_native*.so)
cp $MOD /tmp/base.so && cp /tmp/lampo-gpu/so/pass-both.so $MOD
timeout 200 python3 -m pytest -m cuda tests/cuda/test_engine.py tests/cuda/test_ops_core.py tests/cuda/test_ops_gdn_moe.py \
  -q -rs -p no:cacheprovider > $O/pytest-pass-both.log 2>&1
echo "pass-both tests: $(tail -1 $O/pytest-pass-both.log)"; grep -E "^FAILED" $O/pytest-pass-both.log | head
cp /tmp/base.so $MOD
