#!/usr/bin/env bash
# tests/gpu/prebuild.sh DIR NAME - build this tree's lampo._native and lampo._native_ops on a machine
# without a GPU (nvcc and a Python of the GPU machine's version), for run.sh's PREBUILT=DIR: the
# modules, xz-compressed, go to DIR/NAME with SOURCES, the engine sources id that run.sh computes,
# and COMMIT, the commit they were built from (run.sh records it when LAMPO_COMMIT is not set).
# NAME base is the tree run.sh runs; any other NAME is an A/B variant (run.sh ab benches DIR/NAME
# for a VARIANTS entry NAME instead of patching and building it there). MODULES=_native builds the
# engine module only (enough for a variant that is benched, not tested). TIMELINE=1 builds with
# -DLAMPO_TIMELINE=ON: NAME timeline is what run.sh timeline takes.
#   PYTHON=python3.12 PYBIND11_DIR=... CUDA_ARCH=90a bash tests/gpu/prebuild.sh .gpu/pre base
set -euo pipefail
DIR=${1:?usage: prebuild.sh DIR NAME}
NAME=${2:?usage: prebuild.sh DIR NAME}
PY=${PYTHON:-python3}
BUILD=${BUILD_DIR:-/tmp/lampo-prebuild-$NAME}
PYBIND11_DIR=${PYBIND11_DIR:-$($PY -m pybind11 --cmakedir)}
source tests/gpu/tree_id.sh
SOURCES=$(engine_sources)
cmake -S native -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAMPO_OP_TESTS=ON \
  -DLAMPO_TIMELINE=$([ -n "${TIMELINE:-}" ] && echo ON || echo OFF) \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" -DPython_EXECUTABLE="$(command -v "$PY")" \
  -Dpybind11_DIR="$PYBIND11_DIR" >/dev/null
targets=()
for m in ${MODULES:-_native _native_ops}; do targets+=(--target "$m"); done
cmake --build "$BUILD" -j"${JOBS:-2}" "${targets[@]}"
rm -rf "${DIR:?}/$NAME" && mkdir -p "$DIR/$NAME"
for so in "$BUILD"/_native*.so; do
  case " ${MODULES:-_native _native_ops} " in *" $(basename "$so" | cut -d. -f1) "*) xz -T0 -3 -c "$so" >"$DIR/$NAME/$(basename "$so").xz" ;; esac
done
echo "$SOURCES" >"$DIR/$NAME/SOURCES"
tree_commit "$SOURCES" >"$DIR/$NAME/COMMIT"
ls -l "$DIR/$NAME"
