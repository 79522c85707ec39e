#!/usr/bin/env bash
# tests/gpu/sass.sh SOURCE.cu [NAME] - the sm_90a SASS of one native source, reduced to what sets a
# decode kernel's critical path after its PDL wait: the wait (ACQBULK), the trigger (PREEXIT),
# global loads and stores, fences, barriers, shuffles and branches, with their line numbers. NAME
# (a substring of the mangled kernel name) keeps one kernel. Runs on any machine with nvcc (no
# GPU); the disassembler comes from $NVDISASM, PATH, or the PyPI wheel nvidia-cuda-nvdisasm
# (pip install nvidia-cuda-nvdisasm; its binary is nvidia/cu13/bin/nvdisasm in site-packages).
#   e.g.  tests/gpu/sass.sh native/src/kernels/moe/moe_experts.cu moe_down_gemv
set -euo pipefail
SRC=${1:?usage: $0 SOURCE.cu [NAME]}
NAME=${2:-}
NVDISASM=${NVDISASM:-$(command -v nvdisasm || python3 -c "import nvidia, pathlib; print(next(pathlib.Path(list(nvidia.__path__)[0]).glob('cu*/bin/nvdisasm')))" 2>/dev/null || true)}
[ -x "$NVDISASM" ] || { echo "no nvdisasm: set NVDISASM or pip install nvidia-cuda-nvdisasm" >&2; exit 2; }
INCLUDE=$(cd "$(dirname "$0")/../../native/src" && pwd)  # includes are paths relative to native/src
CUBIN=$(mktemp --suffix=.cubin)
trap 'rm -f "$CUBIN"' EXIT
nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -arch=sm_90a -cubin -I"$INCLUDE" -o "$CUBIN" "$SRC"
"$NVDISASM" -c "$CUBIN" \
  | awk -v name="$NAME" '/^\.text\./ { keep = (name == "" || index($0, name) > 0); if (keep) print; next } keep' \
  | grep -nE '^\.text\.|ACQBULK|PREEXIT|LDG|STG|LDGSTS|ATOM|RED\.|MEMBAR|BAR\.|SHFL|REDUX|BRA|EXIT' || true
