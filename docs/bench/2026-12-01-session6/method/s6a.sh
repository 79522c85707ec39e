#!/bin/bash
# Session 6, call 1: A/B of build variants on the 35B-A3B decode step (fast depth 1 / 8,192), then
# the cuda tests on the combined variant. Tarred into $OUT/results.tgz.
set -uo pipefail
ROOT=$(pwd); W=/tmp/ab; R=$OUT/r; mkdir -p $W $R/bench
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT/.gpu/pylib
PY=python3
$PY -m pip install -q --no-build-isolation --no-deps -e . -Ccmake.define.LAMPO_CPU_ONLY=ON > $R/pip.log 2>&1 || echo pip failed
build() { cmake -S native -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" -DPython_EXECUTABLE=$(command -v $PY) > $R/build-$1.log 2>&1 && cmake --build $W/build -j16 >> $R/build-$1.log 2>&1 && cp $W/build/_native*.so app/lampo/; echo "build $1 exit $?"; }
fast() { LAMPO_COMMIT="$BASE+$1" timeout 90 $PY -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0,8192 --fast-depth --profile-steps 0 --json $R/bench/fast-$1.json > $R/bench/fast-$1.txt 2>&1
  echo "$1 (exit $?): $(grep -E '^ +(1|8,192) ' $R/bench/fast-$1.txt | awk '{printf "depth %s: %s tok/s %s ms %s; ", $1, $(NF-3), $(NF-2), $NF}')"; }
apply() { for p in ${1//+/ }; do git apply .gpu/$p.patch || echo "apply $p failed"; done; }
unapply() { for p in ${1//+/ }; do git apply -R .gpu/$p.patch; done; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
build base && fast base
for v in ${VARIANTS}; do apply $v; build $v && fast $v; unapply $v; done
build base && fast base-again
if [ -n "${TEST_VARIANT:-}" ]; then
  apply $TEST_VARIANT; build test-$TEST_VARIANT && fast test-$TEST_VARIANT
  timeout 240 $PY -m pytest -m cuda tests/cuda -q -rs -p no:cacheprovider > $R/pytest.log 2>&1
  echo "pytest exit $?: $(tail -1 $R/pytest.log)"; grep -E "^FAILED|^ERROR" $R/pytest.log | head -20
  unapply $TEST_VARIANT
fi
(cd $OUT && tar czf results.tgz r && rm -rf r)
