#!/usr/bin/env bash
# session 14, call 7 (main 24ab3c9, dn-ids committed): the final real-prefill benches of the
# 35B-A3B alone (the change touches only the MoE down launch; its GPU suite ran in call 6), then the
# engine tests with LAMPO_DECODE_FUSION=none and =all on the same build.
O=$OUT
OUT=$O/final TESTS=0 FINAL_MODELS=35b-a3b bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
cat $O/final/summary.txt
export PYTHONPATH=$(pwd)/.gpu/pylib:/tmp/lampo-gpu/py
for f in none all; do
  LAMPO_DECODE_FUSION=$f timeout 90 python3 -m pytest -m cuda tests/cuda/test_engine.py -q -rs -p no:cacheprovider > $O/pytest-fusion-$f.log 2>&1
  echo "engine tests LAMPO_DECODE_FUSION=$f exit $?: $(tail -1 $O/pytest-fusion-$f.log)"
done
