"""`CudaBackend`: the `Backend` protocol on the C++/CUDA engine (`lampo._native.Engine`).

Start-up: open and validate the checkpoint, choose the weight format (`--weights`: auto = a
converted checkpoint's own recipe, or for a bf16 checkpoint the best LQ recipe that fits, quantized
on the GPU while loading; quant/engine_formats.py), compute the memory plan (`plan_memory`) and
compare it with the free VRAM (`_native.mem_info()`, or `--vram-limit` when smaller) - refusing
with the plan table and a context that would fit - then create the Engine from the parsed config
itself, the tensor table's names by role (`tensor_specs.engine_tensor_names`) and the width of
each LQ matrix (it allocates everything up front, and no more than the VRAM limit) and stream the
checkpoint into it shard by shard (zero-copy memory-mapped tensors; the engine copies them through
a pinned staging ring, converting on the GPU where the stored format differs), after which the
engine counts the NaN/Inf values of every tensor (of an LQ one: its scales) on the GPU and a
damaged one is refused by name. The tokenizer is checked against the model's vocabulary before
any of this (`Tokenizer.from_checkpoint`). With speculation on, the engine keeps verify rows and
requests decode in verify rounds (`engine.native_rounds`). For MTP drafts it also loads the
checkpoint's MTP module (weights in the run's format, and its KV cache in the memory plan): always
for `mtp` (which counts it when choosing the weights, and refuses a damaged module by name), and for
`auto` where the checkpoint has a sound module and it fits beside the chosen weights (otherwise
auto drafts from the conversation only, and says why). Otherwise the MTP tensors are not read.

Per request `lampo.engine.loop.GenerationLoop` does the work (prefix reuse through the engine's
snapshot slots, chunked prefill with the GIL released inside each chunk, decoding, events); this
file supplies its engine: sampling runs on the GPU (the last prefill chunk samples the first
token, each decode step is one CUDA graph replay that feeds the previous sample and samples the
next, queued on the GPU before that previous sample is streamed), and Stats carry the VRAM use,
at most one per `STATS_INTERVAL_S` while decoding. A failed call ends with `Done("error")`; the
engine is kept when the CUDA context survived (its conversation state is reset) and rebuilt from
the checkpoint otherwise.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from lampo.engine.protocol import BackendInfo, Event, GenerationRequest
from lampo.demo import is_demo_checkpoint
from lampo.engine.loop import Decoded, GenerationLoop
from lampo.engine.native_rounds import NativeSpeculativeSteps, round_policy
from lampo.engine.speculation import MAX_DRAFTS, Speculation
from lampo.models.checkpoint import Checkpoint, CheckpointError
from lampo.models.checkpoint_parts import Assembled
from lampo.models.config import ModelConfig
from lampo.models.finite_scan import NonFinite, nonfinite_error
from lampo.models.memory_plan import DEFAULT_PREFILL_CHUNK, MemoryPlan, plan_memory
from lampo.models.quant.checkpoint_format import LqFormat
from lampo.models.quant.layout import TILE_ROWS
from lampo.models.quant.engine_formats import choose_weights, engine_tensor_bits, recipe_tensor_bits
from lampo.models.quant.recipes import BF16, RECIPES
from lampo.models.sampling_params import SamplingParams
from lampo.models.tensor_specs import engine_tensor_names
from lampo.engine.prefix_cache import PrefixCache

DEFAULT_SNAPSHOT_SLOTS = 4
STATS_INTERVAL_S = 0.05  # at most one Stats event per this many seconds while decoding
GIB = 1 << 30

LoadProgress = Callable[[int, int], None]  # (bytes loaded, bytes total)


class EngineUnavailable(RuntimeError):
    """The CUDA engine cannot run here (no extension, no GPU, or not enough memory)."""


def load_native():
    """The `lampo._native` module, or EngineUnavailable saying why it cannot be used."""
    try:
        from lampo import _native
    except ImportError as e:
        raise EngineUnavailable(f"the CUDA engine is not built in this install ({e})") from None
    if _native.device_count() < 1:
        raise EngineUnavailable("no CUDA device is visible")
    return _native


def memory_budget(native, vram_limit: int = 0) -> int:
    """The bytes the engine may plan for: the free VRAM, or the VRAM limit when smaller."""
    free, _total = native.mem_info()
    return min(free, vram_limit) if vram_limit else free


def _plan(cfg: ModelConfig, weights: str, context_max: int, prefill_chunk: int, snapshot_slots: int,
          verify_rows: int = 0, mtp: bool = False):
    """The plan of an engine with these sizes."""
    return plan_memory(cfg, context_max=context_max, weights=weights, kv="int8", with_mtp=mtp,
                       snapshot_slots=snapshot_slots, prefill_chunk=prefill_chunk, verify_rows=verify_rows)


def chat_plan(cfg: ModelConfig, weights: str, context_max: int, mtp: bool) -> MemoryPlan:
    """The memory plan of the engine `lampo chat` makes by default: its prefill chunk and snapshot
    slots, and the verify rows of the default speculation (the fed token and MAX_DRAFTS drafts)."""
    return _plan(cfg, weights, context_max, DEFAULT_PREFILL_CHUNK, DEFAULT_SNAPSHOT_SLOTS, 1 + MAX_DRAFTS, mtp)


def resolve_weights(native, cfg: ModelConfig, requested: str, lq: LqFormat | None, *, context_max: int,
                    prefill_chunk: int = DEFAULT_PREFILL_CHUNK, snapshot_slots: int = DEFAULT_SNAPSHOT_SLOTS,
                    verify_rows: int = 0, mtp: bool = False, vram_limit: int = 0) -> tuple[str, dict[str, int]]:
    """(weight format of the run, the engine's LQ widths by tensor name) for `--weights requested`
    on a checkpoint whose converted format is `lq` (None: bf16); `mtp`: the MTP module loaded too."""
    plans = {r: _plan(cfg, r, context_max, prefill_chunk, snapshot_slots, verify_rows, mtp)
             for r in RECIPES}  # what auto weighs
    fmt = choose_weights(requested, lq.recipe if lq is not None else None, plans, memory_budget(native, vram_limit))
    return fmt, engine_bits(cfg, fmt, lq, mtp)


def engine_bits(cfg: ModelConfig, fmt: str, lq: LqFormat | None, mtp: bool) -> dict[str, int]:
    """The engine's LQ width of each matrix for weight format `fmt` (none for bf16): a converted
    checkpoint's own widths, else the recipe's."""
    if fmt == BF16:
        return {}
    if lq is not None:
        return engine_tensor_bits(cfg, {n: t.bits for n, t in lq.tensors.items()}, mtp)
    return recipe_tensor_bits(cfg, fmt, mtp)


def open_for_speculation(model_dir: str | Path, speculation: Speculation) -> tuple[Checkpoint, str]:
    """The checkpoint, with its MTP module checked where `speculation` may draft with it: for mtp an
    incomplete or misshapen module is refused by name; for auto it is left out, and the line
    returned says so ("" otherwise); off and ngram never read it."""
    if speculation.mode not in ("mtp", "auto"):
        return Checkpoint.open(model_dir, include_mtp=False), ""
    try:
        return Checkpoint.open(model_dir, include_mtp=True), ""
    except CheckpointError as e:
        if speculation.mode == "mtp":
            raise
        ck = Checkpoint.open(model_dir, include_mtp=False)  # an error of the trunk's own raises here
        return ck, f"speculation {speculation}: {e}; drafting from the conversation (n-gram) only"


def mtp_shortfall(native, cfg: ModelConfig, fmt: str, vram_limit: int = 0, **sizes) -> str:
    """"" when the MTP module (its weights in `fmt` and its KV cache) fits beside the run's memory
    plan (or when the run does not fit at all: its own error says so), else the line saying what
    it needs and what is left."""
    budget = memory_budget(native, vram_limit)
    plain, with_mtp = (_plan(cfg, fmt, mtp=m, **sizes).total_bytes for m in (False, True))
    if with_mtp <= budget or plain > budget:
        return ""
    return (f"the MTP module needs {(with_mtp - plain) / GIB:.2f} GiB (its weights in {fmt} and KV cache) but "
            f"{(budget - plain) / GIB:.2f} GiB is left beside the model at {sizes['context_max']:,} tokens of context")


def create_engine(native, cfg: ModelConfig, *, context_max: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                  snapshot_slots: int = DEFAULT_SNAPSHOT_SLOTS, weights: str = BF16,
                  tensor_bits: dict[str, int] | None = None, vram_limit: int = 0, verify_rows: int = 0,
                  mtp: bool = False):
    """Check the memory plan of `weights` (a WEIGHT_FORMATS name) against the free VRAM (or the
    VRAM limit), then allocate the engine (INT8 KV cache; `verify_rows`: the most tokens of a
    verify window, 0 for none; `mtp`: with the MTP module) for the config itself, with its tensors'
    names by role from the tensor table and the LQ widths `tensor_bits`. Raises EngineUnavailable
    with the plan table when it does not fit."""
    plan = _plan(cfg, weights, context_max, prefill_chunk, snapshot_slots, verify_rows, mtp)
    budget = memory_budget(native, vram_limit)
    ok, message = plan.fits(budget)
    if not ok:
        limit = f" (--vram-limit {vram_limit / GIB:.2f} GiB)" if vram_limit and budget == vram_limit else ""
        raise EngineUnavailable(f"{message}{limit}\n\nmemory plan ({cfg.name or 'model'}, context "
                                f"{context_max:,}):\n{plan.format_table()}")
    return native.Engine(cfg, engine_tensor_names(cfg, mtp), tensor_bits or {}, context_max=context_max,
                         prefill_chunk=prefill_chunk, snapshot_slots=snapshot_slots, vram_limit=vram_limit,
                         verify_rows=verify_rows)


def load_weights(engine, ck: Checkpoint, progress: LoadProgress | None = None) -> int:
    """Copy every tensor the engine needs from the checkpoint, shard by shard in file order, as
    stored: packed LQ tensors with their width; a tensor stored as FP8 throughout (a matrix, or an
    expert bank's FP8 matrices) as its codes and scales, which the engine decodes on the GPU; any
    other assembled one (bf16 expert matrices, or parts the engine cannot take whole) as the bf16
    tensor it assembles to. The engine converts what its format differs in. Returns the bytes read
    (as stored). Tensors the engine does not use (MTP, unless it runs it) are skipped.
    The engine then counts the NaN/Inf values of every tensor in VRAM; any found raise
    CheckpointError naming the file and tensor."""
    formats = {name: fmt for name, _shape, fmt in engine.weight_specs()}
    todo = [(path, [n for n in names if n in formats]) for path, names in ck.shards()]
    total = sum(ck.source(n).nbytes for _path, names in todo for n in names)
    done = 0
    for _path, names in todo:
        for name in names:
            parts = _fp8_parts(ck, name, quantized=formats[name].startswith("LQ"))
            if parts is not None:
                engine.load_tensor_fp8(name, parts, *ck.fp8_block)
            else:
                packed = ck.quantized(name)
                engine.load_tensor(name, ck.raw(name), packed.bits if packed is not None else 0)
            done += ck.source(name).nbytes
            if progress:
                progress(done, total)
    engine.finish_loading()
    nonfinite = engine.nonfinite_census()  # [(name, count, index of the first)]; empty when none
    if nonfinite:
        raise nonfinite_error(ck, [NonFinite(*t) for t in nonfinite])
    return done


def _fp8_parts(ck: Checkpoint, name: str, quantized: bool) -> list | None:
    """The FP8 parts `engine.load_tensor_fp8` takes for `name`, or None where it is not stored as FP8
    throughout, or (quantized on load) a part holds rows off the 16-row strips of the LQ format."""
    source = ck.source(name)
    parts = source.fp8_parts(ck.view) if isinstance(source, Assembled) else None
    if parts is None or (quantized and any(codes.shape[0] % TILE_ROWS for codes, _scales in parts)):
        return None
    return parts


def random_seed(params: SamplingParams) -> int:
    return params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1


class CudaBackend:
    def __init__(self, model_dir: str | Path, *, context_max: int | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, snapshot_slots: int = DEFAULT_SNAPSHOT_SLOTS,
                 on_load: LoadProgress | None = None, native=None, tokenizer=None, weights: str = "auto",
                 vram_limit: int = 0, speculation: Speculation = Speculation(),
                 say: Callable[[str], None] | None = None):
        self._native = native if native is not None else load_native()
        self._ck, note = open_for_speculation(model_dir, speculation)
        cfg = self._ck.config
        self.speculation, fallback = speculation.for_checkpoint(self._ck.has_mtp)
        verify_rows = 1 + (self.speculation.drafts or MAX_DRAFTS) if self.speculation.on else 0
        context_max = min(context_max or cfg.max_position_embeddings, cfg.max_position_embeddings)
        if tokenizer is None:
            from lampo.models.tokenizer import Tokenizer

            tokenizer = Tokenizer.from_checkpoint(model_dir)
        sizes = dict(context_max=context_max, prefill_chunk=prefill_chunk, snapshot_slots=snapshot_slots,
                     verify_rows=verify_rows)
        try:  # mtp counts the module when choosing the weights; auto adds it only where it fits beside them
            self.weight_format, _ = resolve_weights(self._native, cfg, weights, self._ck.lq, vram_limit=vram_limit,
                                                    mtp=self.speculation.mode == "mtp", **sizes)
        except ValueError as e:
            raise EngineUnavailable(str(e)) from None
        mtp = self._ck.has_mtp and self.speculation.mode in ("mtp", "auto")
        if mtp and self.speculation.mode == "auto":
            short = mtp_shortfall(self._native, cfg, self.weight_format, vram_limit, **sizes)
            if short:
                mtp, note = False, f"speculation {speculation}: {short}; drafting from the conversation (n-gram) only"
        for line in (note, fallback):
            if line and say is not None:
                say(line)
        self._settings = dict(sizes, mtp=mtp, weights=self.weight_format,
                              tensor_bits=engine_bits(cfg, self.weight_format, self._ck.lq, mtp), vram_limit=vram_limit)
        self._policy = (round_policy(self.speculation.mode, verify_rows - 1, self.speculation.drafts)
                        if self.speculation.on else None)
        self._on_load = on_load
        self._engine = self._build_engine()
        self._loop = GenerationLoop(tokenizer, PrefixCache(snapshot_slots), label="CUDA", forget=lambda: self._engine.reset(),
                                    recover=self._recover, stats_interval_s=STATS_INTERVAL_S)
        self._info = BackendInfo("cuda", cfg.name or Path(model_dir).name, str(model_dir), context_max,
                                 is_demo=is_demo_checkpoint(Path(model_dir)), weights=self.weight_format,
                                 speculative=self.speculation.on)

    def _build_engine(self):
        engine = create_engine(self._native, self._ck.config, **self._settings)
        load_weights(engine, self._ck, self._on_load)
        return engine

    # ---- Backend protocol ---------------------------------------------------------------------
    @property
    def info(self) -> BackendInfo:
        return self._info

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        if self._engine is None:
            raise RuntimeError("generate: the backend is closed")
        steps = NativeSteps(self._engine, self._native, request.sampling)
        if self._policy is not None:
            steps = NativeSpeculativeSteps(steps, self._engine, request.prompt_ids, self._policy)
        return self._loop.start(request, cancel, steps, self._info.context_max)

    def reset(self) -> None:
        self._loop.reset()

    def close(self) -> None:
        self._engine = None
        self._ck.close()

    def _recover(self) -> None:
        """After a failed call (the loop has forgotten the cached states): keep the engine if the
        CUDA context is intact, else destroy it, reset the device and rebuild it from the checkpoint."""
        if self._engine is not None and self._engine.healthy():
            self._engine.reset()
            return
        self._engine = None
        self._native.reset_device()
        self._engine = self._build_engine()


class NativeSteps:
    """The native engine as one call's `EngineSteps`; it samples on the GPU with the request's
    settings, set at `begin`."""

    def __init__(self, engine, native, sampling: SamplingParams):
        self.chunk = engine.prefill_chunk
        self._engine, self._native, self._sampling = engine, native, sampling
        self._sampled = -1  # the engine's last sample, which its next step can feed from the device

    def begin(self) -> None:
        sp = self._sampling
        self._engine.set_sampling(sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.presence_penalty,
                                  random_seed(sp))
        self._engine.begin_generation()

    def reset(self) -> None:
        self._engine.reset()

    def restore(self, slot: int) -> None:
        self._engine.restore(slot)

    def snapshot(self, slot: int) -> None:
        self._engine.snapshot(slot)

    def prefill(self, ids: Sequence[int], last: bool) -> int | None:
        token = self._engine.prefill(np.asarray(ids, dtype=np.int32), last)
        if not last:
            return None
        self._sampled = token
        return token

    def decode_submit(self, fed: int, max_drafts: int) -> None:
        # -1: the step feeds the engine's own last sample, already on the device; any other token
        # (after a restore or a verify round) goes up with the step
        self._engine.decode_submit(-1 if fed == self._sampled else fed)

    def decode_collect(self) -> Decoded:
        self._sampled = self._engine.decode_collect()
        return Decoded((self._sampled,))

    def vram(self) -> tuple[int, int]:
        free, total = self._native.mem_info()
        return total - free, total
