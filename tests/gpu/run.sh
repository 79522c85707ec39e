#!/usr/bin/env bash
# tests/gpu/run.sh MODE - on a machine with an NVIDIA GPU, from the repository root: build lampo._native and the
# op-test module lampo._native_ops (all sources, -DLAMPO_OP_TESTS=ON), run the cuda-marked tests,
# then the benchmarks; logs, JSON and a summary go to $OUT.
#
#   (every mode but quick/full packs its outputs into $OUT/results.tgz: the device returns <= 8 files)
#   quick  build + pytest -m cuda + short benches: tiny-moe, and the full-width 35B-A3B / 27B shapes
#          cut to 4 layers (random weights in VRAM); the GPU tests get full-width 4-layer checkpoint
#          FILES (tests/gpu/full_width.py), written in the background while the extension builds
#   check  build + pytest -m cuda + one short full-size bench per model (random weights: the
#          load and its NaN/Inf census, prefill 2,048 tokens, decode at depth 1): the whole suite
#          and both models at full size in a few minutes, after a change that moves code around
#   lq     build + pytest -m cuda (LAMPO_GPU_TESTS) + the LQ-format benches: 35B-A3B and 27B at q5,
#          prefill 8,192 and decode at 8,192 by real prefill, beside bf16 prefill 8,192; the
#          measured VRAM at 262,144 tokens of 35B-A3B q4 under --vram-limit 23GiB and 27B q5 under
#          31GiB, with the MTP module, a 5-row verify window and four snapshot slots as `lampo chat`
#          holds them; decode near 262,144 by random fill (LQ_BENCHES picks a subset: q5 bf16 vram long);
#          LQ_BENCHES=prompts: q5 prompts of PROMPT_TOKENS (default 65536) of PROMPT_MODELS (default both)
#          with each prefill attention form of PROMPT_FORMS (default "tiled core"; tiled4 the 4-warp tiled
#          form of a desktop GPU: LAMPO_ATTN_PREFILL_TILED); LQ_BENCHES=fp8: tests/bench_fp8_decode.py
#          (a 35B-A3B expert bank from its FP8 parts: loaded and converted, decoded on the host or the GPU)
#   trained  tests/gpu/train_measure_model.py trains the measurement model (TRAIN_MINUTES, default 3)
#          on the GPU while the extension builds and pytest -m cuda runs (LAMPO_TRAINED_DIR points
#          the tests at it once written); then lampo bench on it (bf16 and q5) and the full-size q5
#          benches (prefill and decode at 8,192) beside the numpy
#          measurements: quant/quality.py --model (KL vs bf16, q5/q4, ours vs round-to-nearest; then
#          with --fp8-source 128, the recipes quantizing the weights' FP8 release) and
#          tests/gpu/spec_acceptance.py (MTP and n-gram drafts, k = 1..4: the engine's rounds first,
#          alone on the GPU, then the numpy reference's, which first compares the engine's plain
#          replies with its own), and tests/gpu/expert_reuse.py (the distinct experts a window of
#          T consecutive tokens reads with the model's routing, against uniform routing). TRAINED_FULL_SIZE (default "35b-a3b 27b",
#          may be empty) names the full-size benches. Needs .gpu/qwen3.6
#          (tokenizer.json, chat_template.jinja) carried. TRAINED_QUALITY=0 leaves out the quality
#          run, TRAINED_REFERENCE_S (default 300) limits the numpy reference's rounds.
#   app    the measurement model trained as in trained, then tests/gpu/app_speed.py: the chat app's
#          decode tok/s (headless Textual) with the CUDA backend in the app's process and in a
#          ProcessBackend, against the generation loop alone (APP_TOKENS, APP_ROUNDS, APP_LIMIT,
#          APP_SETTINGS (default off,mtp:3), APP_DOCUMENT: characters of the docs pasted before the
#          request; Textual's dependencies in .gpu/pylib)
#   spec   build + pytest -m cuda (LAMPO_GPU_TESTS; the verify window's and the MTP module's tests
#          are tests/cuda/test_engine_verify.py and test_engine_mtp.py) + the speculative benches:
#          35B-A3B and 27B at q5, decode at 8,192 (random fill), the verify window's and the MTP
#          draft chain's cost against a plain step and MTP rounds at a set acceptance 0.6 / 0.8 / 0.9
#          for k = 1..4 (lampo bench --speculate-accept ... --mtp; SPEC_MODELS picks a subset), the MTP
#          drafts among the first SPEC_DRAFT_VOCAB ids (default 98304, a Latin-script conversation's;
#          empty: every id), the chain timed over every id too; SPEC_DEPTHS (default 8192, e.g.
#          8192,262000) the depths, SPEC_K (default 1,2,3,4; the bench takes 1..7) the draft counts
#   kernel build + pytest -m cuda (LAMPO_GPU_TESTS) + Nsight Compute (--set full) over the launches
#          of tests/gpu/op_profile.py for the shapes in KERNEL_SHAPES ("OUT,IN,BITS[,T] ..." LQ GEMVs,
#          "attn:NQ,NKV,L,TQ ..." decode attention) whose kernel names match KERNEL_REGEX (default gemv_lq)
#   gemv   build (no tests unless TESTS=1) + tests/gpu/gemv_sweep.py: every LQ matrix of both models at
#          1 and 4 tokens, and per (in, bits, tokens) the fixed cost of a launch and its streaming rate
#   final  build + pytest -m cuda (the engine tests again with LAMPO_DECODE_FUSION=none and =all, as
#          with TESTS=1 in any mode, unless FUSION_TESTS=0; FUSION_TEST_FILES names other test files
#          for those two runs; TESTS=0 skips the tests, for a tree
#          already tested in an earlier call)
#          + full-size benches that fit one call (35B-A3B real depths to 262,144; 27B prefill 8,192
#          and real depths 8,192 / 262,144; 35B-A3B decode unfolded and with every fusion, for the A/B)
#          (FINAL_MODELS, default "35b-a3b 27b", picks the full-size benches: 35b-a3b alone for a
#          change that only the MoE model runs)
#   profile build (no tests unless TESTS=1) + 35B-A3B decode benches (default and
#          LAMPO_DECODE_FUSION=all, depths 1 and 8,192 by random fill) + Nsight Compute over one un-graphed decode step (tests/gpu/kernel_profile.py)
#   fusions build (no tests unless TESTS=1) + the 35B-A3B decode step with each LAMPO_DECODE_FUSION
#          choice (FUSION_SWEEP, default none norms gdn all)
#   omit   build (no tests) + the 35B-A3B graphed decode step without each op family in turn
#          (LAMPO_OMIT_OPS: what each family costs inside the graph)
#   ab     A/B of build variants on the graphed decode step (depth 1 and 8,192 by random fill) of
#          the 35B-A3B, or of the models AB_MODEL names ("27b", "35b-a3b 27b"), in bf16 or in the
#          LQ recipe AB_WEIGHTS names (q5, q4); AB_SWEEP=1 also runs tests/gpu/gemv_sweep.py with
#          each build once: the patches of BASE_PATCH applied first, the base built (and tested
#          with TESTS=1);
#          each of VARIANTS (patches of native/ only) applied, built into its own modules and taken
#          back; then AB_REPEAT rounds (default 2), each benching every build in turn with its
#          modules swapped in, so a drift of the machine hits them alike. tests/gpu/ab_summary.py
#          gives each build's medians; a variant whose median at 8,192 beats the base's by more than
#          KEEP_MS (default 0.02 ms; the first model of AB_MODEL decides) runs VARIANT_TESTS (pytest
#          paths, if set; KEEP_MS=-1000 tests every variant, AB_TEST_VARIANTS="b" the ones named). A patch name is a file
#          .gpu/NAME.patch (git apply); NAME+NAME applies several. E.g.
#          BASE_PATCH=a VARIANTS="b c+d" AB_REPEAT=3 VARIANT_TESTS="tests/cuda/test_engine.py" bash tests/gpu/run.sh ab
#          AB_MODEL="35b-a3b 27b" AB_WEIGHTS=q5 AB_SWEEP=1 VARIANTS=e bash tests/gpu/run.sh ab
#          A variant NAME:VAR=VAL is the base's modules benched with VAR=VAL in the environment
#          (e.g. core:LAMPO_ATTN_WINDOW_TILED=0); with PREBUILT, a variant NAME found as
#          $PREBUILT/NAME is taken from there instead of patched and built here (a patch variant
#          beside prebuilt base modules builds its engine module alone, lampo._native).
#          AB_DEPTHS (default 0,8192) and AB_SPEC_K (verify windows of k + 1 tokens, e.g. 3) widen
#          what each round measures (step_bench); AB_ARGS adds lampo bench arguments (e.g. "--mtp
#          --draft-vocab 98304": the engine `lampo chat` makes, its rounds with MTP chains)
#   probe  no engine build: tests/gpu/probe_expert_reads.py with its timing half
#          (probe_expert_reads.cu, built here by nvcc): read bandwidth of the expert weights' access
#          patterns against a contiguous stream
#   stream no engine build: tests/gpu/probe_stream.py with its timing half (probe_stream.cu, built
#          here by nvcc): a persistent weight stream through the decode step's dependency points,
#          with each STREAM_WEIGHTS format's bytes (default bf16,q5) and STREAM_TILES rings
#          (default 32768x6: tile bytes x stages)
#   handover  no engine build: tests/gpu/probe_handover.cu (a standalone program): what one
#          dependency point costs alone (a PDL kernel boundary, a grid-wide counter, a posted flag)
#   ordering  no engine build: tests/gpu/probe_ordering.cu (a standalone program): what a CTA fence,
#          an mbarrier arrive or a shared atomic costs a warp that streams weights with loads in
#          flight, against the same operations with no loads
#   timeline  build with -DLAMPO_TIMELINE=ON (no tests unless TESTS=1) + tests/gpu/timeline.py: block
#          timestamps of the graphed decode step of the 35B-A3B (TIMELINE_MODEL: "35b-a3b 27b" for
#          both; TIMELINE_WEIGHTS q5 / q4 for the LQ format, default bf16), each launch's share of the
#          critical path
#          (TIMELINE_DEPTHS, default 8192; TIMELINE_WINDOWS, default 1: the tokens of the recorded
#          pass, e.g. "1 4" for the step and a 4-token verify window; TIMELINE_RAW=N also keeps the
#          events of the first N launches of one pass, timeline-MODEL-DEPTH[-windowT]-raw.npy)
#   files  build (no tests unless TESTS=1) + full-size checkpoints loaded from FILES, each written into
#          $WORK/files by the synthetic generator (one process per CPU, no MTP), benched, deleted:
#          the 35B-A3B at q5 in the packed LQ format (21.6 GB; prefill 8,192 and decode at 8,192,
#          --weights auto), then the 27B in bf16 (53.8 GB, when df shows the room: a 64 GiB disk
#          may not have it, a 128 GiB one has; FILES_27B_LAYERS=N writes N layers) quantized on load to q5 (prefill and decode
#          at 2,048: the load's peak host memory is the number). A summary line per step: size,
#          seconds, peak RSS (of the bench: after the load, and the anonymous part while loading;
#          of the generator), tok/s. FILES_CONVERT=SECONDS also runs `lampo convert` on the 27B
#          for that long (then SIGINT: it leaves nothing) for its peak RSS and rate (on the GPU
#          ~90 s for the whole 27B, but its ~17 GB of output do not fit a 64 GiB disk beside the
#          source: FILES_27B_LAYERS=40 leaves room). Expected ~4 minutes; the steps' limits add up
#          to ~8.5 with the build, so keep FILES_CONVERT <= 150
#   full   build + pytest -m cuda + the whole benchmark: full-size random-weight models, prompts
#          8,192 / 65,536, decode at depths 0 / 8,192 / 65,536 / 262,144 by real prefill, and the
#          --fast-depth variant of the 35B-A3B
#
# Every mode that runs the tests then runs `lampo check` (CHECK=0 leaves it out; $OUT/check.log, check.json);
# DESKTOP=1 then runs the engine tests (DESKTOP_TESTS) and `lampo check` again with the launchers'
# choices of an sm_86 / sm_89 / sm_120 card: LAMPO_SM90=0 (no PDL, clusters, rings, fused GDN step,
# wgmma GEMMs) and LAMPO_SMEM_OPTIN=101376 (99 KiB of shared memory a block).
# Environment: OUT (default .gpu/out), LAMPO_GPU_TESTS (pytest paths, default tests/cuda),
# LAMPO_COMMIT (recorded in the bench JSON; default HEAD, "+uncommitted (engine sources ID)" if the
# tree differs), TEST_PART (i/n: the i-th of n parts of tests/cuda's files, for a suite split over
# calls), JOBS (build parallelism), TEST_TIMEOUT (seconds; at the limit pytest is interrupted,
# so its log still ends with the counts and the slowest tests). Pure-Python dependencies missing
# on a bare machine may be placed in .gpu/pylib (added to PYTHONPATH; tests/gpu/pylib.sh writes them). PREBUILT=DIR (carried) takes
# the modules that tests/gpu/prebuild.sh built elsewhere from this same tree (DIR/base, for timeline
# DIR/timeline; its SOURCES must equal this tree's engine sources id) instead of building them here.
set -uo pipefail
MODE=${1:-quick}
case "$MODE" in quick|check|lq|trained|app|kernel|gemv|files|full|final|profile|omit|fusions|ab|probe|stream|handover|ordering|timeline|spec) ;; *) echo "usage: $0 quick|check|lq|trained|app|kernel|gemv|files|full|final|profile|omit|fusions|ab|probe|stream|handover|ordering|timeline|spec" >&2; exit 2 ;; esac

ROOT=$(pwd)
OUT=${OUT:-$ROOT/.gpu/out}
WORK=${LAMPO_GPU_WORK:-/tmp/lampo-gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT/bench" "$WORK"
export PYTHONUNBUFFERED=1
[ -d "$ROOT/.gpu/pylib" ] && export PYTHONPATH="$ROOT/.gpu/pylib${PYTHONPATH:+:$PYTHONPATH}"
source tests/gpu/tree_id.sh
ENGINE_SOURCES=$(engine_sources)
# The commit the results belong to (tree_commit); set LAMPO_COMMIT to name it. With PREBUILT
# modules of these very sources, the commit they were built from (prebuild.sh's COMMIT), which a
# copy's stale .git cannot misname.
if [ -z "${LAMPO_COMMIT:-}" ] && [ -n "${PREBUILT:-}" ] && [ -s "$PREBUILT/base/COMMIT" ] \
   && [ "$(cat "$PREBUILT/base/SOURCES" 2>/dev/null)" = "$ENGINE_SOURCES" ]; then
  LAMPO_COMMIT=$(cat "$PREBUILT/base/COMMIT")
fi
[ -n "${LAMPO_COMMIT:-}" ] || LAMPO_COMMIT=$(tree_commit "$ENGINE_SOURCES")
export LAMPO_COMMIT
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
# Every mode but quick/full leaves $OUT as results.tgz + summary.txt (the device returns at most 8
# files), also when a `timeout` around this script stops it: SIGTERM packs what is there first.
pack_out() {
  [ "$MODE" != quick ] && [ "$MODE" != full ] && [ ! -f "$OUT/results.tgz" ] || return 0
  (cd "$OUT" && tar czf "$WORK/results.tgz" --exclude=results.tgz . && mv "$WORK/results.tgz" "$OUT/results.tgz" \
     && find . -mindepth 1 ! -name results.tgz ! -name summary.txt -delete)
}
trap 'log "stopped by a signal: packing what is there"; pack_out; exit 124' TERM INT

log "mode $MODE, commit $LAMPO_COMMIT, engine sources $ENGINE_SOURCES, $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"

if [ "$MODE" = handover ] || [ "$MODE" = ordering ]; then  # a standalone program: built here, prints one JSON object
  nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o "$WORK/probe_$MODE" "tests/gpu/probe_$MODE.cu" \
    2>&1 | tee "$OUT/probe_$MODE-build.log"
  timeout 120 "$WORK/probe_$MODE" > "$OUT/bench/probe-$MODE.json" 2> "$OUT/bench/probe-$MODE.err"
  log "$MODE exit $?: $(cat "$OUT/bench/probe-$MODE.json")"
  exit 0
fi

# Python packages only (the CUDA extension is built below with every source).
# An editable install when the machine's pip/scikit-build-core can do it offline; otherwise the
# same package layout (lampo, lampo.models, lampo.assets) through symlinks on PYTHONPATH.
if ! $PY -m pip install -q --no-build-isolation --no-deps -e . -Ccmake.define.LAMPO_CPU_ONLY=ON >"$OUT/pip.log" 2>&1; then
  log "pip install -e failed ($(tail -1 "$OUT/pip.log")); using a symlinked package on PYTHONPATH"
  mkdir -p "$WORK/py" && ln -sfn "$ROOT/app/lampo" "$WORK/py/lampo"
  ln -sfn "$ROOT/models" "$ROOT/app/lampo/models" && ln -sfn "$ROOT/assets" "$ROOT/app/lampo/assets"
  export PYTHONPATH="$WORK/py${PYTHONPATH:+:$PYTHONPATH}"
fi
$PY -c "import lampo.models.config" || { log "lampo is not importable"; exit 1; }

if [ "$MODE" = probe ] || [ "$MODE" = stream ]; then  # a standalone probe: its .cu built here, then its .py
  name=$([ "$MODE" = probe ] && echo probe_expert_reads || echo probe_stream)
  nvcc -O3 -shared -Xcompiler -fPIC -gencode arch=compute_90a,code=sm_90a -o "$WORK/$name.so" \
    "tests/gpu/$name.cu" 2>&1 | tee "$OUT/$name-build.log"
  extra=()
  [ "$MODE" = stream ] && extra=(--weights "${STREAM_WEIGHTS:-bf16,q5}" --tiles "${STREAM_TILES:-32768x6}")
  timeout 300 $PY "tests/gpu/$name.py" --lib "$WORK/$name.so" "${extra[@]}" \
    --json "$OUT/bench/${name//_/-}.json" 2>&1 | tee "$OUT/bench/${name//_/-}.txt"
  log "$MODE exit ${PIPESTATUS[0]}"
  exit 0
fi

if [ "$MODE" = trained ] || [ "$MODE" = app ]; then  # the GPU trains while the CPU builds
  TRAINED="$WORK/measure-moe"
  (timeout 480 $PY tests/gpu/train_measure_model.py --out "$TRAINED" --minutes "${TRAIN_MINUTES:-3}" \
     >"$OUT/bench/train.txt" 2>&1; cp "$TRAINED/results.json" "$OUT/bench/train-results.json") &
  TRAINER=$!
  log "training the measurement model (pid $TRAINER)"
fi

# TESTS=1 turns the tests on where a mode leaves them out, TESTS=0 off where it runs them
case "$MODE" in files|profile|omit|fusions|ab|timeline|gemv) RUN_TESTS= ;; *) RUN_TESTS=1 ;; esac
case "${TESTS:-}" in 0) RUN_TESTS= ;; "") ;; *) RUN_TESTS=1 ;; esac

# TEST_PART=i/n: the i-th of n interleaved parts of tests/cuda's files (the whole suite no longer
# fits one call beside anything else on an H100), instead of LAMPO_GPU_TESTS
if [ -n "${TEST_PART:-}" ]; then
  LAMPO_GPU_TESTS=$(ls tests/cuda/test_*.py | awk -v part="${TEST_PART%/*}" -v n="${TEST_PART#*/}" \
    '(NR - part) % n == 0' | tr '\n' ' ')
fi

# The engine tests' full-width checkpoints (test_engine.py, test_engine_lq.py), written here all at
# once while the build runs, where the tests of this tree or of the A/B variants include them (the
# tests would otherwise write them one after another)
full_width_tests() {  # full_width_tests PATHS...: whether the pytest paths run the full-width tests
  case " $* " in *" tests/cuda "*|*" tests/cuda/ "*|*test_engine.py*|*test_engine_lq.py*) return 0 ;; esac
  return 1
}
WRITERS=()
if { [ -n "$RUN_TESTS" ] && full_width_tests "${LAMPO_GPU_TESTS:-tests/cuda}"; } ||
   { [ "$MODE" = ab ] && full_width_tests "${VARIANT_TESTS:-}"; }; then
  for preset in qwen3.6-35b-a3b qwen3.6-27b; do
    $PY tests/gpu/full_width.py "$WORK/full-width" "$preset" >"$OUT/write-$preset.log" 2>&1 &
    WRITERS+=($!)
    $PY tests/gpu/full_width.py "$WORK/full-width" "$preset" q5 >"$OUT/write-$preset-q5.log" 2>&1 &
    WRITERS+=($!)
  done
fi

patches() {  # patches apply|unapply NAME[+NAME...]: .gpu/NAME.patch onto (or off) the working tree;
  local p applied=()  # an apply that fails takes back the ones it applied and returns 1
  for p in ${2//+/ }; do
    if [ "$1" = unapply ]; then git apply -R ".gpu/$p.patch"; continue; fi
    if ! git apply ".gpu/$p.patch"; then
      log "patch $p does not apply"
      for p in "${applied[@]}"; do git apply -R ".gpu/$p.patch"; done
      return 1
    fi
    applied+=("$p")
  done
}
if [ "$MODE" = ab ] && [ -n "${BASE_PATCH:-}" ]; then
  patches apply "$BASE_PATCH" || exit 1
  export LAMPO_COMMIT="$LAMPO_COMMIT + $BASE_PATCH"
fi

configure_build() {  # an empty build folder for this tree (a warm machine keeps $WORK between calls, and
  # a source file that a variant patch touched in the previous call comes back with an older time stamp
  # than the objects built from the patched version: an incremental build would keep the variant's code)
  rm -rf "$WORK/build"
  cmake -S native -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAMPO_OP_TESTS=ON \
    -DLAMPO_TIMELINE=$([ "$MODE" = timeline ] && echo ON || echo OFF) \
    -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$(command -v "$PY")" >>"$OUT/build.log" 2>&1
}
build_native() {  # compile the configured build (both modules, or the targets named) into the package
  local targets=(); for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$WORK/build" -j"${JOBS:-14}" "${targets[@]}" >>"$OUT/build.log" 2>&1 && cp "$WORK"/build/_native*.so app/lampo/
}
take_prebuilt() {  # take_prebuilt NAME DEST: $PREBUILT/NAME's modules (tests/gpu/prebuild.sh) into DEST
  local f; mkdir -p "$2"
  for f in "$PREBUILT/$1"/_native*.so.xz; do xz -dc "$f" >"$2/$(basename "$f" .xz)" || return 1; done
}
if [ -n "${PREBUILT:-}" ]; then  # modules built elsewhere from this very tree: no build here
  SET=$([ "$MODE" = timeline ] && echo timeline || echo base)  # timeline: TIMELINE=1 prebuild.sh DIR timeline
  [ "$(cat "$PREBUILT/$SET/SOURCES" 2>/dev/null)" = "$ENGINE_SOURCES" ] \
    || { log "PREBUILT/$SET was built from engine sources $(cat "$PREBUILT/$SET/SOURCES" 2>/dev/null), not this tree's"; exit 1; }
  take_prebuilt "$SET" app/lampo || { log "PREBUILT/$SET: modules missing"; exit 1; }
  rm -rf "$WORK/build"  # a warm machine's build of another tree: patch variants configure their own
  log "took the prebuilt $SET modules of engine sources $ENGINE_SOURCES"
else
log "building lampo._native and lampo._native_ops"
configure_build && build_native
if [ $? -ne 0 ]; then
  log "BUILD FAILED"; grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1
fi
log "built $(ls "$WORK"/build/_native*.so | xargs -n1 basename)"
fi

for pid in "${WRITERS[@]}"; do
  wait "$pid" || log "writing a full-width checkpoint failed (see $OUT/write-*.log)"
done
[ ${#WRITERS[@]} -gt 0 ] && export LAMPO_FULL_WIDTH_DIR="$WORK/full-width" && log "full-width checkpoints written"

if [ -n "$RUN_TESTS" ]; then
log "pytest -m cuda ${LAMPO_GPU_TESTS:-tests/cuda}"
timeout -s INT -k 30 "${TEST_TIMEOUT:-300}" $PY -m pytest -m cuda ${LAMPO_GPU_TESTS:-tests/cuda} -q -rs -s \
  --durations=12 -p no:cacheprovider >"$OUT/pytest.log" 2>&1
log "pytest exit $?: $(tail -1 "$OUT/pytest.log")"
if { [ "$MODE" = final ] || [ "${TESTS:-0}" != 0 ]; } && [ "${FUSION_TESTS:-1}" != 0 ]; then  # the engine's other decode-step forms
  fusion_files=${FUSION_TEST_FILES:-tests/cuda/test_engine.py}
  for f in none all; do
    LAMPO_DECODE_FUSION=$f timeout 200 $PY -m pytest -m cuda $fusion_files -q -rs -p no:cacheprovider \
      >"$OUT/pytest-fusion-$f.log" 2>&1
    log "pytest (LAMPO_DECODE_FUSION=$f) $fusion_files exit $?: $(tail -1 "$OUT/pytest-fusion-$f.log")"
  done
fi
fi
if [ -n "$RUN_TESTS" ] && [ "${CHECK:-1}" != 0 ]; then  # what a user runs on another GPU
  log "lampo check"
  LAMPO_HOME="$WORK/check-home" timeout 300 $PY -m lampo.check --json "$OUT/check.json" >"$OUT/check.log" 2>&1
  log "lampo check exit $?: $(tail -1 "$OUT/check.log")"
fi
if [ -n "$RUN_TESTS" ] && [ "${DESKTOP:-0}" = 1 ]; then  # the launchers' choices of an sm_86 / sm_89 / sm_120 card
  DESKTOP_TESTS=${DESKTOP_TESTS:-tests/cuda/test_engine.py tests/cuda/test_engine_lq.py tests/cuda/test_engine_verify.py tests/cuda/test_engine_mtp.py}
  log "desktop forms (LAMPO_SM90=0 LAMPO_SMEM_OPTIN=101376): pytest -m cuda $DESKTOP_TESTS, lampo check"
  LAMPO_SM90=0 LAMPO_SMEM_OPTIN=101376 timeout -s INT -k 30 "${TEST_TIMEOUT:-300}" $PY -m pytest -m cuda $DESKTOP_TESTS -q -rs \
    -p no:cacheprovider >"$OUT/pytest-desktop.log" 2>&1
  log "pytest (desktop forms) exit $?: $(tail -1 "$OUT/pytest-desktop.log")"
  LAMPO_SM90=0 LAMPO_SMEM_OPTIN=101376 LAMPO_HOME="$WORK/check-home" timeout 300 $PY -m lampo.check \
    --json "$OUT/check-desktop.json" >"$OUT/check-desktop.log" 2>&1
  log "lampo check (desktop forms) exit $?: $(tail -1 "$OUT/check-desktop.log")"
fi

bench() {  # bench NAME SECONDS ARGS...   (each bench has its own time limit; the call has 600 s)
  local name=$1 limit=$2; shift 2
  timeout "$limit" $PY -m lampo.bench "$@" --json "$OUT/bench/$name.json" >"$OUT/bench/$name.txt" 2>&1
  log "bench $name exit $?"
}
step_bench() {  # step_bench NAME SECONDS [MODEL]: MODEL's (default 35b-a3b) graphed decode step at AB_DEPTHS (default depth 1 and 8,192; random fill), weights AB_WEIGHTS (default bf16); AB_SPEC_K: also the verify windows of k + 1 tokens (k in AB_SPEC_K, e.g. 3 or 1,3) and rounds at a = 0.8
  bench "$1" "$2" --preset "qwen3.6-${3:-35b-a3b}" --random-weights ${AB_WEIGHTS:+--weights "$AB_WEIGHTS"} \
    --prompt 512 --depths "${AB_DEPTHS:-0,8192}" --fast-depth --profile-steps 0 \
    ${AB_SPEC_K:+--speculate-accept 0.8 --draft-k "$AB_SPEC_K"} ${AB_ARGS:-}
}
step_summary() {  # step_summary FILE TXT...: one line per step_bench output, also written to FILE
  local out=$1 f; shift
  for f in "$@"; do
    echo "$(basename "$f" .txt): $(grep -E '^ +(1|8,192) ' "$f" | awk '{printf "depth %s: %s tok/s, %s ms, %s; ", $1, $(NF-3), $(NF-2), $NF}')"
  done | tee "$out"
}
case "$MODE" in
quick)
  bench tiny-moe 60 --preset tiny-moe --random-weights --prompt 2048 --depths 0,2048 --decode-tokens 64
  bench 35b-a3b-4layers 90 --preset qwen3.6-35b-a3b --layers 4 --random-weights --prompt 8192 --depths 0,8192 --decode-tokens 64
  bench 27b-4layers 90 --preset qwen3.6-27b --layers 4 --random-weights --prompt 8192 --depths 0,8192 --decode-tokens 64 ;;
trained)
  wait "$TRAINER"; log "training exit $? ($(tail -1 "$OUT/bench/train.txt"))"
  export LAMPO_TRAINED_DIR="$TRAINED"
  # the engine's speculative rounds first, with the GPU to themselves; then the numpy measurements
  # (CPU) beside the GPU tests and benches
  timeout 240 $PY tests/gpu/spec_acceptance.py "$TRAINED" --tokens 256 --engine --json "$OUT/bench/spec-engine.json" \
    >"$OUT/bench/spec-engine.txt" 2>&1
  log "spec acceptance (engine) exit $?"
  timeout 60 $PY tests/gpu/expert_reuse.py "$TRAINED" --text docs/architecture.md --json "$OUT/bench/expert-reuse.json" \
    >"$OUT/bench/expert-reuse.txt" 2>&1
  log "expert reuse exit $?"
  QUALITY=
  [ "${TRAINED_QUALITY:-1}" = 0 ] || { (for src in bf16 fp8; do  # the recipes from the weights, then from their FP8 release
       timeout 300 $PY -m lampo.models.quant.quality --model "$TRAINED" --text docs/architecture.md --tokens 256 \
         $([ $src = fp8 ] && echo --fp8-source 128) --json "$OUT/bench/quality-trained-$src.json" \
         >"$OUT/bench/quality-trained-$src.txt" 2>&1
     done) & QUALITY=$!; }
  (timeout "${TRAINED_REFERENCE_S:-300}" $PY tests/gpu/spec_acceptance.py "$TRAINED" --tokens 256 \
     --engine-json "$OUT/bench/spec-engine.json" \
     --json "$OUT/bench/spec-reference.json" \
     >"$OUT/bench/spec-reference.txt" 2>&1) &
  SPEC=$!
  timeout 150 $PY -m pytest -m cuda tests/cuda/test_engine_lq.py -k trained -q -rs -p no:cacheprovider \
    >"$OUT/pytest-trained.log" 2>&1
  log "pytest (trained model) exit $?: $(tail -1 "$OUT/pytest-trained.log")"
  for w in bf16 q5; do
    bench "trained-$w" 60 --model "$TRAINED" --weights "$w" --prompt 2048 --depths 0,2048 --profile-steps 0
  done
  for m in ${TRAINED_FULL_SIZE-35b-a3b 27b}; do
    bench "$m-q5" 60 --preset "qwen3.6-$m" --random-weights --weights q5 --prompt 8192 --depths 8192 --profile-steps 0
  done
  [ -n "$QUALITY" ] && { wait "$QUALITY"; log "quality exit $?"; }
  wait "$SPEC"; log "spec acceptance (numpy reference) exit $?" ;;
app)
  wait "$TRAINER"; log "training exit $? ($(tail -1 "$OUT/bench/train.txt"))"
  timeout "${APP_LIMIT:-300}" $PY tests/gpu/app_speed.py "$TRAINED" --tokens "${APP_TOKENS:-512}" \
    --rounds "${APP_ROUNDS:-2}" --settings "${APP_SETTINGS:-off,mtp:3}" --document "${APP_DOCUMENT:-0}" --json "$OUT/bench/app-speed.json" >"$OUT/bench/app-speed.txt" 2>&1
  log "app speed exit $?" ;;
lq)
  for b in ${LQ_BENCHES:-q5 bf16 vram long}; do case "$b" in
  q5) for m in 35b-a3b 27b; do
        bench "$m-q5" 100 --preset "qwen3.6-$m" --random-weights --weights q5 --prompt 8192 --depths 8192 --profile-steps 3
      done ;;
  bf16) for m in 35b-a3b 27b; do
        bench "$m-bf16-prefill" 60 --preset "qwen3.6-$m" --random-weights --weights bf16 --prompt 8192 --depths 0 \
          --decode-tokens 16 --profile-steps 0
      done ;;
  vram) bench 35b-a3b-q4-vram 60 --preset qwen3.6-35b-a3b --random-weights --weights q4 --vram-limit 23GiB \
          --context 262144 --prompt 2048 --depths 2048 --profile-steps 0 --mtp --speculate-accept 0.8 --draft-k 4
        bench 27b-q5-vram 60 --preset qwen3.6-27b --random-weights --weights q5 --vram-limit 31GiB \
          --context 262144 --prompt 2048 --depths 2048 --profile-steps 0 --mtp --speculate-accept 0.8 --draft-k 4 ;;
  prompts) for m in ${PROMPT_MODELS:-35b-a3b 27b}; do for f in ${PROMPT_FORMS:-tiled core}; do
        case "$f" in core) export LAMPO_ATTN_PREFILL_TILED=0 ;; tiled4) export LAMPO_ATTN_PREFILL_TILED=4 ;;
          *) export LAMPO_ATTN_PREFILL_TILED=1 ;; esac
        bench "$m-q5-prompt-$f" "${PROMPT_LIMIT:-150}" --preset "qwen3.6-$m" --random-weights --weights q5 \
          --prompt "${PROMPT_TOKENS:-65536}" --depths 0 --decode-tokens 16 --profile-steps 0
      done; done; unset LAMPO_ATTN_PREFILL_TILED ;;
  fp8) timeout 300 $PY tests/bench_fp8_decode.py --rounds 3 --engine q5 --convert --json "$OUT/bench/fp8-bank.json" \
        > "$OUT/bench/fp8-bank.txt" 2>&1
      log "fp8 bank exit $?: $(tail -3 "$OUT/bench/fp8-bank.txt" | tr '\n' ' ')" ;;
  long) for m in 35b-a3b 27b; do
        bench "$m-q5-long" 60 --preset "qwen3.6-$m" --random-weights --weights q5 --prompt 512 --depths 262000 \
          --fast-depth --profile-steps 0
      done ;;
  esac; done ;;
spec)
  vocab=${SPEC_DRAFT_VOCAB-98304}
  for m in ${SPEC_MODELS:-35b-a3b 27b}; do
    bench "$m-q5-spec" 200 --preset "qwen3.6-$m" --random-weights --weights q5 --prompt 512 --depths "${SPEC_DEPTHS:-8192}" \
      --fast-depth --profile-steps 0 --speculate-accept 0.6,0.8,0.9 --draft-k "${SPEC_K:-1,2,3,4}" --mtp \
      ${vocab:+--draft-vocab $vocab}
  done ;;
kernel)
  timeout 300 ncu --set full -k "regex:${KERNEL_REGEX:-gemv_lq}" --clock-control none \
    $PY tests/gpu/op_profile.py ${KERNEL_SHAPES:-248320,2048,4 8192,2048,5} >"$OUT/bench/ncu-kernel.txt" 2>&1
  log "ncu exit $?" ;;
gemv)
  timeout 400 $PY tests/gpu/gemv_sweep.py --json "$OUT/bench/gemv-sweep.json" >"$OUT/bench/gemv-sweep.txt" 2>&1
  log "gemv sweep exit $?" ;;
check)
  for m in 35b-a3b 27b; do
    bench "$m-check" 90 --preset "qwen3.6-$m" --random-weights --prompt 2048 --depths 0 --decode-tokens 32 --profile-steps 0
  done ;;
files)  # full-size checkpoints written, benched from the files, deleted (a warm machine keeps $WORK)
  CK="$WORK/files"; rm -rf "$CK"; mkdir -p "$CK"
  avail_gb() { df -B1000000000 --output=avail "$CK" | tail -1 | tr -d ' '; }
  measured() {  # measured SECONDS LOG CMD...: CMD (output to LOG) under timeout -s INT; prints "EXIT SECONDS PEAK_MIB"
    $PY - "$@" <<'PYEOF'  # the peak: ru_maxrss of the largest process of CMD's tree (timeout waits for CMD)
import resource, subprocess, sys, time
limit, log, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
t = time.monotonic()
with open(log, "w") as f:
    rc = subprocess.call(["timeout", "-s", "INT", "-k", "10", limit, *cmd], stdout=f, stderr=subprocess.STDOUT)
print(rc, round(time.monotonic() - t), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
PYEOF
  }
  write_ckpt() {  # write_ckpt NAME SECONDS PRESET ARGS...: the generator into $CK/NAME; its exit status
    local name=$1 limit=$2 preset=$3 rc s mib; shift 3
    read -r rc s mib < <(measured "$limit" "$OUT/bench/write-$name.txt" \
      $PY -m lampo.models.synthetic "$preset" "$CK/$name" --no-mtp --jobs "$(nproc)" "$@")
    log "write $name exit $rc: $(du -sb "$CK/$name" 2>/dev/null | awk '{printf "%.2f", $1 / 1e9}') GB on disk" \
      "in $s s (generator peak RSS $mib MiB, largest process), $(avail_gb) GB left"
    return "${rc:-1}"
  }
  bench_line() {  # bench_line NAME: the bench JSON's load, host memory and speeds in one line
    $PY - "$OUT/bench/$1.json" <<'PYEOF' 2>/dev/null || echo "no JSON"
import json, sys
r = json.load(open(sys.argv[1]))
load, host = r["load"], r["host_memory"]
parts = [f"{r['weights_from']} ({r['stored_format']}) as {r['weight_format']}: load {load['bytes'] / 1e9:.2f} GB "
         f"in {load['seconds']:.1f} s", f"peak RSS {host['peak_rss_after_load_mib']:,.0f} MiB after the load (anonymous "
         f"at most {host['load_peak_anon_mib']:,.0f} while loading), {host['peak_rss_end_mib']:,.0f} at the end"]
parts += [f"prefill {p['tokens']:,}: {p['tokens_per_second']:,.0f} tok/s" for p in r["prefill"]]
parts += [f"decode at {d['depth']:,}: {d['tokens_per_second']:,.1f} tok/s" for d in r["decode"]]
print("; ".join(parts))
PYEOF
  }
  # (a) the 35B-A3B at q5, as converted: --weights auto keeps the checkpoint's recipe
  if [ "$(avail_gb)" -ge 24 ]; then
    write_ckpt 35b-a3b-q5 70 qwen3.6-35b-a3b --recipe q5 \
      && bench 35b-a3b-q5-files 100 --model "$CK/35b-a3b-q5" --weights auto --prompt 8192 --depths 8192 \
        --profile-steps 0 \
      && log "35b-a3b-q5-files: $(bench_line 35b-a3b-q5-files)"
  else
    log "35B-A3B q5 from files skipped: $(avail_gb) GB free in $CK, it needs 24 (21.6 GB of shards)"
  fi
  rm -rf "$CK/35b-a3b-q5"
  # (b) the 27B in bf16, quantized on load to q5; (c) FILES_CONVERT=SECONDS: lampo convert on it.
  # FILES_27B_LAYERS=N writes its first N layers only (full-width tensors: the load's peak host
  # memory is per tensor, so it is the whole model's; a 64 GiB disk has no room for all 64)
  L27=${FILES_27B_LAYERS:-64}
  if [ "$(avail_gb)" -ge $(( 6 + L27 * 50 / 64 )) ]; then
    if write_ckpt 27b-bf16 170 qwen3.6-27b --layers "$L27"; then
      bench 27b-bf16-files-q5 110 --model "$CK/27b-bf16" --weights q5 --prompt 2048 --depths 2048 --profile-steps 0
      log "27b-bf16-files-q5: $(bench_line 27b-bf16-files-q5)"
      if [ "${FILES_CONVERT:-0}" -gt 0 ]; then
        read -r rc s mib < <(measured "$FILES_CONVERT" "$OUT/bench/convert-27b.txt" \
          $PY -m lampo convert "$CK/27b-bf16" "$CK/27b-q5")
        log "convert 27b bf16 -> q5 exit $rc after $s s (124: stopped at FILES_CONVERT), peak RSS $mib MiB:" \
          "$(tail -1 "$OUT/bench/convert-27b.txt")"
      fi
    fi
  else
    log "27B bf16 from files skipped: $(avail_gb) GB free in $CK, $L27 layers need $(( 6 + L27 * 50 / 64 ))" \
      "(53.8 GB of shards for all 64)"
  fi
  rm -rf "$CK" ;;
full)
  bench 35b-a3b 150 --preset qwen3.6-35b-a3b --random-weights --prompt 8192,65536 --depths 0,8192,65536,262144
  bench 27b 260 --preset qwen3.6-27b --random-weights --prompt 8192,65536 --depths 0,8192,65536,262144
  bench 35b-a3b-fast-depth 60 --preset qwen3.6-35b-a3b --random-weights --prompt 8192 --depths 0,32768,131072,262144 --fast-depth ;;
final)
  final_model() { case " ${FINAL_MODELS:-35b-a3b 27b} " in *" $1 "*) return 0 ;; esac; return 1; }
  final_model 35b-a3b && bench 35b-a3b 150 --preset qwen3.6-35b-a3b --random-weights --prompt 8192,65536 --depths 0,8192,65536,262144 --profile-steps 3
  final_model 27b && bench 27b 200 --preset qwen3.6-27b --random-weights --prompt 8192 --depths 0,8192,262144 --profile-steps 3
  (export LAMPO_DECODE_FUSION=none; step_bench 35b-a3b-fusion-none 50)
  (export LAMPO_DECODE_FUSION=all; step_bench 35b-a3b-fusion-all 50) ;;
profile)
  bench 35b-a3b 60 --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0,8192 --fast-depth --profile-steps 3
  (export LAMPO_DECODE_FUSION=all; step_bench 35b-a3b-fusion-all 50)
  GRAPH_MS=$($PY -c "import json; print(json.load(open('$OUT/bench/35b-a3b.json'))['decode'][0]['ms_per_token'])" 2>/dev/null)
  log "ncu over one decode step (graph step ${GRAPH_MS:-?} ms)"
  timeout 240 ncu --profile-from-start off --clock-control none --csv --page raw \
    --metrics "$($PY tests/gpu/kernel_profile.py metrics)" \
    $PY tests/gpu/kernel_profile.py step --preset qwen3.6-35b-a3b >"$OUT/ncu-35b.csv" 2>"$OUT/ncu-35b.err"
  log "ncu exit $?"
  $PY tests/gpu/kernel_profile.py table "$OUT/ncu-35b.csv" ${GRAPH_MS:+--graph-ms $GRAPH_MS} >"$OUT/bench/ncu-35b.txt" 2>&1 ;;
fusions)  # the 35B-A3B graphed decode step with each LAMPO_DECODE_FUSION choice
  for f in ${FUSION_SWEEP:-none norms gdn all}; do
    (export LAMPO_DECODE_FUSION=$f; step_bench "35b-a3b-fusion-${f//,/+}" 50)
  done
  step_summary "$OUT/bench/fusion-summary.txt" "$OUT"/bench/35b-a3b-fusion-*.txt ;;
omit)  # the graphed step's time without each op family in turn (LAMPO_OMIT_OPS, a timing diagnostic)
  bench 35b-a3b 40 --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0 --profile-steps 0
  for fam in ${OMIT_FAMILIES:-norms moe_router moe_experts projections gdn_rule attention,attention_prep lm_head}; do
    (export LAMPO_OMIT_OPS=$fam; bench "35b-a3b-omit-${fam//,/+}" 40 --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0 --profile-steps 0)
  done
  $PY - "$OUT"/bench/*.json <<'PYEOF' | tee "$OUT/bench/omit-summary.txt"
import json, sys
rows = [json.load(open(p)) for p in sys.argv[1:]]
base = next(r for r in rows if not any("LAMPO_OMIT_OPS" in n for n in r["notes"]))["decode"][0]["ms_per_token"]
print(f"graphed decode step, 35B-A3B depth 1: {base:.3f} ms with every op")
for r in rows:
    note = next((n for n in r["notes"] if "LAMPO_OMIT_OPS" in n), None)
    if note:
        ms = r["decode"][0]["ms_per_token"]
        print(f"  without {note.split(':')[0].split('=')[1]:40s} {ms:.3f} ms  (they cost {base - ms:.3f} ms, "
              f"{r['launches_per_token']['kernels']} kernels left)")
PYEOF
  ;;
timeline)  # block timestamps of the graphed step (a LAMPO_TIMELINE build; tests/gpu/timeline.py)
  for m in ${TIMELINE_MODEL:-35b-a3b}; do
    for depth in ${TIMELINE_DEPTHS:-8192}; do
      for win in ${TIMELINE_WINDOWS:-1}; do
        name="timeline-$m-$depth$([ "$win" = 1 ] || echo "-window$win")"
        timeout 180 $PY tests/gpu/timeline.py --preset "qwen3.6-$m" --depth "$depth" --weights "${TIMELINE_WEIGHTS:-bf16}" \
          --window "$win" --json "$OUT/bench/$name.json" \
          ${TIMELINE_RAW:+--raw "$OUT/bench/$name-raw.npy" --raw-launches "$TIMELINE_RAW"} \
          >"$OUT/bench/$name.txt" 2>&1
        log "timeline $m depth $depth window $win exit $?"
      done
    done
  done ;;
ab)  # each build once into $WORK/so/BUILD/ (both modules), then AB_REPEAT rounds that bench every build in turn
  SO_DIR="$WORK/so"; rm -rf "$SO_DIR"; mkdir -p "$SO_DIR"
  AB_MODEL=${AB_MODEL:-35b-a3b}
  FIRST_MODEL=${AB_MODEL%% *}
  keep_so() { mkdir -p "$SO_DIR/$1" && cp app/lampo/_native*.so "$SO_DIR/$1/"; }
  use_so() { cp "$SO_DIR/${1%%:*}"/_native*.so app/lampo/; }
  native_only() {  # a variant is swapped in as a module only, so its patches may change native/ alone
    local p; for p in ${1//+/ }; do
      grep '^+++ b/' ".gpu/$p.patch" | grep -qv '^+++ b/native/' && return 1
    done; return 0
  }
  keep_so base; BUILDS=(base)
  for v in ${VARIANTS:-}; do
    # the base's modules (app/lampo holds the last patch variant built by now)
    case "$v" in *:*) BUILDS+=("$v"); mkdir -p "$SO_DIR/${v%%:*}" && cp "$SO_DIR"/base/_native*.so "$SO_DIR/${v%%:*}/"; continue ;; esac
    if [ -n "${PREBUILT:-}" ] && [ -d "$PREBUILT/$v" ]; then
      take_prebuilt "$v" "$SO_DIR/$v" && BUILDS+=("$v") && log "variant $v: prebuilt (engine sources $(cat "$PREBUILT/$v/SOURCES"))"
      continue
    fi
    native_only "$v" || { log "variant $v changes files outside native/: not benched"; continue; }
    # with prebuilt base modules there is no build folder yet: the variant's engine module alone
    [ -d "$WORK/build" ] || { configure_build && VARIANT_TARGETS=_native; } || { log "variant $v: cmake failed"; continue; }
    patches apply "$v" || continue
    if build_native ${VARIANT_TARGETS:-}; then keep_so "$v"; BUILDS+=("$v"); else log "variant $v not built"; fi
    patches unapply "$v"
  done
  for r in $(seq 1 "${AB_REPEAT:-2}"); do
    for b in "${BUILDS[@]}"; do
      use_so "$b"
      for m in $AB_MODEL; do
        (export LAMPO_COMMIT="$LAMPO_COMMIT$([ "$b" = base ] || echo " + $b")"
         case "$b" in *:*) export "${b#*:}" ;; esac
         step_bench "$m-${b%%:*}-r$r" 60 "$m")
      done
      if [ "$r" = 1 ] && [ "${AB_SWEEP:-}" = 1 ]; then
        timeout 120 $PY tests/gpu/gemv_sweep.py --json "$OUT/bench/gemv-sweep-${b%%:*}.json" >"$OUT/bench/gemv-sweep-${b%%:*}.txt" 2>&1
        log "gemv sweep ($b) exit $?"
      fi
    done
  done
  for m in $AB_MODEL; do
    $PY tests/gpu/ab_summary.py "$OUT/bench" --model "$m" | tee -a "$OUT/bench/ab-summary.txt"
  done
  if [ -n "${VARIANT_TESTS:-}" ]; then
    for v in ${AB_TEST_VARIANTS:-$($PY tests/gpu/ab_summary.py "$OUT/bench" --model "$FIRST_MODEL" --faster --keep-ms "${KEEP_MS:-0.02}")}; do
      use_so "$v"
      timeout -s INT -k 30 "${TEST_TIMEOUT:-240}" $PY -m pytest -m cuda $VARIANT_TESTS -q -rs -p no:cacheprovider >"$OUT/pytest-$v.log" 2>&1
      log "pytest ($v) exit $?: $(tail -1 "$OUT/pytest-$v.log")"
    done
  fi
  use_so base
  [ -z "${BASE_PATCH:-}" ] || patches unapply "$BASE_PATCH" ;;
esac

echo "================ pytest (tail) ================"
grep -vE "^\s*$" "$OUT/pytest.log" | tail -60
for f in "$OUT"/bench/*.txt; do
  echo "================ $(basename "$f" .txt) ================"
  tail -45 "$f"
done
pack_out
log "done"
