#!/bin/bash
# Session 5, last calls. PART=1: build, fast bench, cuda tests of the changed kernels + engine,
# 35B-A3B real depths. PART=2: build, 27B real depths, omit runs. Outputs tarred.
set -uo pipefail
ROOT=$(pwd); W=/tmp/ab; R=$OUT/r; mkdir -p $W $R/bench
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT/.gpu/pylib LAMPO_COMMIT=$BASE
PY=python3
$PY -m pip install -q --no-build-isolation --no-deps -e . -Ccmake.define.LAMPO_CPU_ONLY=ON > $R/pip.log 2>&1 || echo pip failed
cmake -S native -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" -DPython_EXECUTABLE=$(command -v $PY) > $R/build.log 2>&1 && cmake --build $W/build -j16 >> $R/build.log 2>&1 && cp $W/build/_native*.so app/lampo/; echo "build exit $?"
fast() { timeout 60 $PY -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0,8192 --fast-depth --profile-steps 0 --json $R/bench/fast-$1.json > $R/bench/fast-$1.txt 2>&1
  echo "$1 (exit $?): $(grep -E '^ +(1|8,192) ' $R/bench/fast-$1.txt | awk '{printf "depth %s: %s tok/s %s ms %s; ", $1, $(NF-3), $(NF-2), $NF}') $(grep -i launches $R/bench/fast-$1.txt | head -1)"; }
if [ "$PART" = 1 ]; then
  fast base
  timeout 170 $PY -m pytest -m cuda tests/cuda/test_ops_gdn_moe.py tests/cuda/test_engine.py -q -rs -p no:cacheprovider > $R/pytest.log 2>&1
  echo "pytest exit $?: $(tail -1 $R/pytest.log)"; grep -E "^FAILED|^ERROR" $R/pytest.log | head
  timeout 200 $PY -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 8192,65536 --depths 0,8192,65536,262144 --profile-steps 3 --json $R/bench/35b-a3b.json > $R/bench/35b-a3b.txt 2>&1; echo "35b exit $?"
  tail -34 $R/bench/35b-a3b.txt
else
  timeout 230 $PY -m lampo.bench --preset qwen3.6-27b --random-weights --prompt 8192 --depths 0,8192,262144 --profile-steps 3 --json $R/bench/27b.json > $R/bench/27b.txt 2>&1; echo "27b exit $?"
  tail -16 $R/bench/27b.txt
  fast base
  for fam in ${OMIT:-}; do LAMPO_OMIT_OPS=$fam fast omit-${fam//,/+}; done
  for v in ${VARIANTS:-}; do git apply .gpu/$v.patch && cmake --build $W/build -j16 > $R/build-$v.log 2>&1 && cp $W/build/_native*.so app/lampo/ && fast $v; git apply -R .gpu/$v.patch; done
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
(cd $OUT && tar czf results.tgz r && rm -rf r)
