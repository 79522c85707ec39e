#!/usr/bin/env bash
# session 8, call 4: keep8 (gdn-cluster + attn_prep loads before the wait) against 9899709, ABBA on the
# 35B-A3B step; 27B step base / keep8; keep8's cuda tests (ops, engine, engine with LAMPO_DECODE_FUSION=none); its timeline
export LAMPO_COMMIT=${LAMPO_COMMIT:-9899709}
O=$OUT
OUT=$O/ab VARIANTS="keep8 keep8" bash tests/gpu/run.sh ab >/dev/null 2>&1
cat $O/ab/summary.txt
export PYTHONPATH=$PWD/.gpu/pylib
mkdir -p $O/more
b27() { LAMPO_COMMIT="$LAMPO_COMMIT$2" timeout 90 python3 -m lampo.bench --preset qwen3.6-27b --random-weights --prompt 512 --depths 0,8192 --fast-depth --profile-steps 0 \
  --json $O/more/27b-$1.json > $O/more/27b-$1.txt 2>&1; echo "27b $1: $(grep -E '^ +(1|8,192) ' $O/more/27b-$1.txt | awk '{printf "depth %s: %s tok/s %s ms %s; ", $1, $(NF-3), $(NF-2), $NF}')"; }
b27 base ""
git apply .gpu/keep8.patch && cmake --build /tmp/lampo-gpu/build -j14 >$O/more/build.log 2>&1 && cp /tmp/lampo-gpu/build/_native*.so app/lampo/ || { echo keep8 build failed; exit 1; }
b27 keep8 " + keep8"
timeout 240 python3 -m pytest -m cuda tests/cuda -q -rs -p no:cacheprovider >$O/more/pytest-keep8.log 2>&1
echo "pytest -m cuda tests/cuda (keep8) exit $?: $(tail -1 $O/more/pytest-keep8.log)"
LAMPO_DECODE_FUSION=none timeout 150 python3 -m pytest -m cuda tests/cuda/test_engine.py -q -rs -p no:cacheprovider >$O/more/pytest-keep8-none.log 2>&1
echo "pytest engine LAMPO_DECODE_FUSION=none (keep8) exit $?: $(tail -1 $O/more/pytest-keep8-none.log)"
OUT=$O/tl LAMPO_COMMIT="$LAMPO_COMMIT + keep8" timeout 100 bash tests/gpu/run.sh timeline >/dev/null 2>&1
cat $O/tl/summary.txt
cd $O && tar czf /tmp/more.tgz more && rm -rf more && mv /tmp/more.tgz $O/
