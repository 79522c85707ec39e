#!/usr/bin/env bash
# session 15, call 7 (main's engine = 310c7ba's): what limits the prefill attention (most of a
# 262,000-token prompt's TTFT): Nsight Compute's full set on one launch of attn_int8_kernel, for the
# 35B-A3B's shape (nq 16, nkv 2) and the 27B's (nq 24, nkv 4), 8,192 tokens from position 0, through
# the per-op bench binding (constant inputs). The build comes from run.sh final with no model.
O=$OUT
OUT=$O/final TESTS=0 FINAL_MODELS=none bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
export PYTHONPATH=$(pwd)/.gpu/pylib:/tmp/lampo-gpu/py
for shape in "16 2" "24 4"; do
  set -- $shape
  timeout 70 ncu --clock-control none --kernel-name regex:attn_int8 --launch-count 1 --set full \
    python3 -c "from lampo import _native; print(_native.ops.bench_attn_prefill($1, $2, 8192, 0, 1))" \
    > $O/ncu-attn-prefill-nq$1-nkv$2.txt 2>&1
  echo "ncu nq=$1 nkv=$2 exit $?"
done
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Shared Memory Configuration Size|One or More Eligible|No Eligible|Warp Cycles Per Issued|L1/TEX Hit|Executed Ipc A" $O/ncu-attn-prefill-*.txt | head -40
