#!/usr/bin/env bash
# session 8, call 3: A/B of attn-early, gdn-cluster, l2-ahead (evict_first experts + 8 MiB of the next matrix into L2);
# then the full combination's tests and its timeline
export LAMPO_COMMIT=${LAMPO_COMMIT:-9899709}
export LAMPO_EXPERT_EVICT_FIRST=1 LAMPO_L2_AHEAD_MB=8
O=$OUT
ALL=gdn-cluster+attn-early+l2-ahead
OUT=$O/ab VARIANTS="attn-early gdn-cluster+attn-early $ALL" bash tests/gpu/run.sh ab >/dev/null 2>&1
cat $O/ab/summary.txt
{ git apply .gpu/gdn-cluster.patch && git apply .gpu/attn-early.patch && git apply .gpu/l2-ahead.patch; } || { echo combo does not apply; exit 1; }
mkdir -p $O/tests
cmake --build /tmp/lampo-gpu/build -j14 >$O/tests/build.log 2>&1 && cp /tmp/lampo-gpu/build/_native*.so app/lampo/ || { echo combo build failed; exit 1; }
PYTHONPATH=$PWD/.gpu/pylib timeout 300 python3 -m pytest -m cuda tests/cuda/test_ops_core.py tests/cuda/test_ops_gdn_moe.py tests/cuda/test_engine.py \
  -q -rs -p no:cacheprovider >$O/tests/pytest-combo.log 2>&1
echo "pytest combo exit $?: $(tail -1 $O/tests/pytest-combo.log)"
OUT=$O/tl LAMPO_COMMIT="$LAMPO_COMMIT + $ALL" timeout 120 bash tests/gpu/run.sh timeline >/dev/null 2>&1
cat $O/tl/summary.txt
