#!/usr/bin/env bash
# session 8, call 2: gdn-cluster A/B with its tests; the l2-ahead sweep (evict_first experts, L2 prefetch of the next matrix)
export LAMPO_COMMIT=${LAMPO_COMMIT:-9899709}
O=$OUT
OUT=$O/ab KEEP_MS=-1 VARIANTS="gdn-cluster" VARIANT_TESTS="tests/cuda/test_ops_gdn_moe.py tests/cuda/test_engine.py" \
  bash tests/gpu/run.sh ab >/dev/null 2>&1
cat $O/ab/summary.txt
export PYTHONPATH=$PWD/.gpu/pylib
mkdir -p $O/l2
git apply .gpu/l2-ahead.patch && cmake --build /tmp/lampo-gpu/build -j14 >$O/l2/build.log 2>&1 && cp /tmp/lampo-gpu/build/_native*.so app/lampo/ || { echo l2 build failed; tail $O/l2/build.log; exit 1; }
for cfg in "0 0" "1 0" "1 8" "1 16" "1 24" "0 16" "0 0"; do
  set -- $cfg
  LAMPO_COMMIT="$LAMPO_COMMIT + l2-ahead (LAMPO_EXPERT_EVICT_FIRST=$1 LAMPO_L2_AHEAD_MB=$2)" LAMPO_EXPERT_EVICT_FIRST=$1 LAMPO_L2_AHEAD_MB=$2 \
    timeout 60 python3 -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0,8192 --fast-depth --profile-steps 0 \
    --json $O/l2/ef$1-mb$2.json > $O/l2/ef$1-mb$2.txt 2>&1
  echo "ef$1 mb$2: $(grep -E '^ +(1|8,192) ' $O/l2/ef$1-mb$2.txt | awk '{printf "depth %s: %s ms; ", $1, $(NF-2)}')" | tee -a $O/l2/summary.txt
done
cd $O && tar czf /tmp/l2.tgz l2 && rm -rf l2 && mv /tmp/l2.tgz $O/
