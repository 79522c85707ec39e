#!/bin/bash
# Session 6, final call: HEAD (trigger-first PDL + review mends) against HEAD + VARIANT on the fast
# 35B-A3B step; the faster (by > 0.01 ms at 8,192) is kept for the cuda tests and the full-size
# benches (35B-A3B real depths to 262,144, 27B prefill 8,192 and depth 8,192). Tarred.
set -uo pipefail
ROOT=$(pwd); W=/tmp/ab; R=$OUT/r; mkdir -p $W $R/bench
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT/.gpu/pylib
PY=python3; T0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - T0) )); }
$PY -m pip install -q --no-build-isolation --no-deps -e . -Ccmake.define.LAMPO_CPU_ONLY=ON > $R/pip.log 2>&1 || echo pip failed
build() { cmake -S native -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" -DPython_EXECUTABLE=$(command -v $PY) > $R/build-$1.log 2>&1 && cmake --build $W/build -j16 >> $R/build-$1.log 2>&1 && cp $W/build/_native*.so app/lampo/; echo "build $1 exit $? at $(( $(date +%s) - T0 ))s"; }
fast() { LAMPO_COMMIT="$BASE+$1" timeout 90 $PY -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0,8192 --fast-depth --profile-steps 0 --json $R/bench/fast-$1.json > $R/bench/fast-$1.txt 2>&1
  echo "$1 (exit $?): $(grep -E '^ +(1|8,192) ' $R/bench/fast-$1.txt | awk '{printf "depth %s: %s tok/s %s ms %s; ", $1, $(NF-3), $(NF-2), $NF}')"; }
ms8k() { $PY -c "import json; print(json.load(open('$R/bench/fast-$1.json'))['decode'][1]['ms_per_token'])"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
build base && fast base
git apply .gpu/$VARIANT.patch && build $VARIANT && fast $VARIANT
if $PY -c "import sys; sys.exit(0 if $(ms8k $VARIANT) < $(ms8k base) - 0.01 else 1)"; then
  FINAL=$BASE+$VARIANT; echo "kept $VARIANT"
else
  git apply -R .gpu/$VARIANT.patch; build base-again && fast base-again; FINAL=$BASE
fi
export LAMPO_COMMIT=$FINAL
timeout 170 $PY -m pytest -m cuda tests/cuda -q -rs -p no:cacheprovider > $R/pytest.log 2>&1
echo "pytest ($FINAL) exit $?: $(tail -1 $R/pytest.log) at $(( $(date +%s) - T0 ))s"; grep -E "^_+ test" $R/pytest.log | head
timeout $(( $(left) - 90 )) $PY -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 8192,65536 --depths 0,8192,65536,262144 --profile-steps 3 --json $R/bench/35b-a3b.json > $R/bench/35b-a3b.txt 2>&1; echo "35b exit $? at $(( $(date +%s) - T0 ))s"
grep -E "^ +[0-9]" $R/bench/35b-a3b.txt | head -12
timeout $(( $(left) - 5 )) $PY -m lampo.bench --preset qwen3.6-27b --random-weights --prompt 8192 --depths 0,8192 --profile-steps 0 --json $R/bench/27b.json > $R/bench/27b.txt 2>&1; echo "27b exit $? at $(( $(date +%s) - T0 ))s"
grep -E "^ +[0-9]" $R/bench/27b.txt | head -8
(cd $OUT && tar czf results.tgz r && rm -rf r)
