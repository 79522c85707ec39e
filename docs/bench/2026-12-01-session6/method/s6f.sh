# Session 6, call 6 (run inline on the warm machine, as `bash .gpu/s6f.sh` after writing it there):
# in-graph cost of each op family at bbd0375 (LAMPO_OMIT_OPS) and the 27B at 262,144 by real prefill.
set -uo pipefail
ROOT=$(pwd); W=/tmp/ab; R=$OUT/r; mkdir -p $W $R/bench
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT/.gpu/pylib LAMPO_COMMIT=bbd0375
PY=python3; T0=$(date +%s)
$PY -m pip install -q --no-build-isolation --no-deps -e . -Ccmake.define.LAMPO_CPU_ONLY=ON > $R/pip.log 2>&1 || echo pip failed
cmake -S native -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" -DPython_EXECUTABLE=$(command -v $PY) > $R/build.log 2>&1 && cmake --build $W/build -j16 >> $R/build.log 2>&1 && cp $W/build/_native*.so app/lampo/; echo "build exit $? at $(( $(date +%s) - T0 ))s"
fast() { timeout 60 $PY -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0,8192 --fast-depth --profile-steps 0 --json $R/bench/fast-$1.json > $R/bench/fast-$1.txt 2>&1
  echo "$1 (exit $?): $(grep -E '^ +(1|8,192) ' $R/bench/fast-$1.txt | awk '{printf "depth %s: %s ms; ", $1, $(NF-2)}')"; }
fast base
for fam in moe_experts projections lm_head attention,attention_prep gdn_rule moe_router; do LAMPO_OMIT_OPS=$fam fast omit-${fam//,/+}; done
echo "omits done at $(( $(date +%s) - T0 ))s"
timeout $(( 300 - ($(date +%s) - T0) )) $PY -m lampo.bench --preset qwen3.6-27b --random-weights --prompt 8192 --depths 262144 --profile-steps 0 --json $R/bench/27b-262k.json > $R/bench/27b-262k.txt 2>&1; echo "27b exit $? at $(( $(date +%s) - T0 ))s"
grep -E "^ +[0-9]" $R/bench/27b-262k.txt | head -4
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
(cd $OUT && tar czf results.tgz r && rm -rf r)
