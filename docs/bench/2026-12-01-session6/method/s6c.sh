#!/bin/bash
# Session 6, call 3: the working tree (twin mends) built and tested, then gate_up shape variants on
# top; a variant faster by > 0.02 ms at 8,192 gets the MoE and engine tests too. Tarred.
set -uo pipefail
ROOT=$(pwd); W=/tmp/ab; R=$OUT/r; mkdir -p $W $R/bench
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT/.gpu/pylib
PY=python3
$PY -m pip install -q --no-build-isolation --no-deps -e . -Ccmake.define.LAMPO_CPU_ONLY=ON > $R/pip.log 2>&1 || echo pip failed
build() { cmake -S native -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" -DPython_EXECUTABLE=$(command -v $PY) > $R/build-$1.log 2>&1 && cmake --build $W/build -j16 >> $R/build-$1.log 2>&1 && cp $W/build/_native*.so app/lampo/; echo "build $1 exit $?"; }
fast() { LAMPO_COMMIT="$BASE+$1" timeout 90 $PY -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0,8192 --fast-depth --profile-steps 0 --json $R/bench/fast-$1.json > $R/bench/fast-$1.txt 2>&1
  echo "$1 (exit $?): $(grep -E '^ +(1|8,192) ' $R/bench/fast-$1.txt | awk '{printf "depth %s: %s tok/s %s ms %s; ", $1, $(NF-3), $(NF-2), $NF}')"; }
ms8k() { $PY -c "import json; print(json.load(open('$R/bench/fast-$1.json'))['decode'][1]['ms_per_token'])"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
build base && fast base
timeout 240 $PY -m pytest -m cuda tests/cuda -q -rs -p no:cacheprovider > $R/pytest.log 2>&1
echo "pytest exit $?: $(tail -1 $R/pytest.log)"; grep -E "^_+ test" $R/pytest.log | head -20
for v in ${VARIANTS}; do
  git apply .gpu/$v.patch && build $v && fast $v
  if $PY -c "import sys; sys.exit(0 if $(ms8k $v) < $(ms8k base) - 0.02 else 1)"; then
    timeout 200 $PY -m pytest -m cuda tests/cuda/test_ops_gdn_moe.py tests/cuda/test_engine.py -q -rs -p no:cacheprovider > $R/pytest-$v.log 2>&1
    echo "pytest $v exit $?: $(tail -1 $R/pytest-$v.log)"; grep -E "^_+ test" $R/pytest-$v.log | head
  fi
  git apply -R .gpu/$v.patch
done
build base && fast base-again
(cd $OUT && tar czf results.tgz r && rm -rf r)
