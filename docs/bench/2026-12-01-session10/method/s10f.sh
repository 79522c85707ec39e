#!/usr/bin/env bash
# session 10, call 6: the down launch with act / routing staged in shared memory (78 registers, 3 blocks per SM
# allowed) A/B'd; then the engine tests with LAMPO_DECODE_FUSION=none and =all on the base
O=$OUT
OUT=$O/ab VARIANTS="dn-smem" AB_REPEAT=5 VARIANT_TESTS="tests/cuda/test_ops_gdn_moe.py -k experts_decode" \
  KEEP_MS=0.005 timeout 170 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A2 "median of" $O/ab-stdout.txt | head -3; grep "pytest (" $O/ab/summary.txt
export PYTHONPATH=$PWD/.gpu/pylib
MOD=app/lampo/$(basename /tmp/lampo-gpu/build/_native*.so)
if grep -q "pytest (dn-smem) exit 0" $O/ab/summary.txt; then
  cp /tmp/lampo-gpu/so/dn-smem.so $MOD
  timeout 60 python3 -m pytest -m cuda tests/cuda/test_engine.py -k "logits or greedy" -q -p no:cacheprovider > $O/pytest-dn-smem-engine.log 2>&1
  echo "dn-smem engine logits/greedy: $(tail -1 $O/pytest-dn-smem-engine.log)"
  cp /tmp/lampo-gpu/so/base.so $MOD
fi
for f in none all; do
  LAMPO_DECODE_FUSION=$f timeout 100 python3 -m pytest -m cuda tests/cuda/test_engine.py -q -rs -p no:cacheprovider > $O/pytest-fusion-$f.log 2>&1
  echo "engine tests, LAMPO_DECODE_FUSION=$f: $(tail -1 $O/pytest-fusion-$f.log)"
done
