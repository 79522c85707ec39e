"""`CudaBackend`: the `Backend` protocol on the C++/CUDA engine (`lampo._native.Engine`).

Start-up: open and validate the checkpoint, compute the memory plan (`plan_memory`) and compare it
with the free VRAM (`_native.mem_info()`) - refusing with the plan table and a context that would
fit - then create the Engine (which allocates everything up front) and stream the checkpoint into
it shard by shard (zero-copy memory-mapped tensors; the engine copies them through a pinned
staging ring). MTP tensors are not loaded: this engine does not run speculative decoding yet.

Per request it follows `PrefixCache`'s engine loop (shared with the reference backend): resume
from the longest held state (current or a snapshot taken at a requested `snapshot_at` position),
prefill the rest in chunks - split at snapshot positions, with `PrefillProgress` and cancellation
between chunks, the GIL released inside each chunk - sample the first token from the last row,
then decode token by token (one CUDA graph replay each) until a stop id, `max_tokens`, the end of
the context or `cancel`. A CUDA failure ends the call with `Done("error")`; the engine is kept when
the CUDA context survived (its conversation state is reset) and rebuilt from the checkpoint
otherwise.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from lampo.backend import (
    BackendInfo,
    ContextOverflow,
    Done,
    Event,
    GenerationRequest,
    PrefillProgress,
    Stats,
    TokenEvent,
)
from lampo.demo import is_demo_checkpoint
from lampo.models.checkpoint import Checkpoint
from lampo.models.config import ModelConfig
from lampo.models.memory_plan import plan_memory
from lampo.models.sampling_params import SamplingParams
from lampo.prefix_cache import PrefixCache, Resume

DEFAULT_PREFILL_CHUNK = 2048
DEFAULT_SNAPSHOT_SLOTS = 4
STATS_INTERVAL_S = 0.05  # at most one Stats event per this many seconds while decoding
LIVE_WINDOW_S = 0.5  # live tok/s is measured over this trailing window

LoadProgress = Callable[[int, int], None]  # (bytes loaded, bytes total)


class EngineUnavailable(RuntimeError):
    """The CUDA engine cannot run here (no extension, no GPU, or not enough memory)."""


def load_native():
    """The `lampo._native` module, or EngineUnavailable saying why it cannot be used."""
    try:
        from lampo import _native
    except ImportError as e:
        raise EngineUnavailable(f"the CUDA engine is not built in this install ({e}); "
                                f"use the reference backend") from None
    if _native.device_count() < 1:
        raise EngineUnavailable("no CUDA device is visible; use the reference backend")
    return _native


def native_dims(cfg: ModelConfig) -> dict:
    """`cfg` as the field names of the engine's ModelDims (native/src/model.h)."""
    return {
        "hidden": cfg.hidden_size,
        "layer_types": list(cfg.layer_types),
        "n_q_heads": cfg.num_attention_heads,
        "n_kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rotary_dim": cfg.rotary_dim,
        "rope_theta": cfg.rope_theta,
        "gdn_k_heads": cfg.linear_num_key_heads,
        "gdn_v_heads": cfg.linear_num_value_heads,
        "gdn_k_dim": cfg.linear_key_head_dim,
        "gdn_v_dim": cfg.linear_value_head_dim,
        "conv_kernel": cfg.linear_conv_kernel_dim,
        "moe": cfg.is_moe,
        "ffn_inter": cfg.intermediate_size or 0,
        "n_experts": cfg.num_experts,
        "top_k": cfg.num_experts_per_tok,
        "expert_inter": cfg.moe_intermediate_size,
        "shared_inter": cfg.shared_expert_intermediate_size,
        "vocab": cfg.vocab_size,
        "vocab_real": cfg.real_vocab_size,
        "eps": cfg.rms_norm_eps,
    }


def create_engine(native, cfg: ModelConfig, *, context: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                  snapshot_slots: int = DEFAULT_SNAPSHOT_SLOTS):
    """Check the memory plan against the free VRAM, then allocate the engine (bf16 weights, INT8
    KV cache, no MTP). Raises EngineUnavailable with the plan table when it does not fit."""
    plan = plan_memory(cfg, context=context, weight_bytes_per_param="bf16", kv="int8",
                       with_mtp=False, spec_slots=snapshot_slots, prefill_chunk=prefill_chunk)
    free, total = native.mem_info()
    ok, message = plan.fits(free)
    if not ok:
        raise EngineUnavailable(f"{message}\n\nmemory plan ({cfg.name or 'model'}, context "
                                f"{context:,}):\n{plan.format_table()}")
    return native.Engine(native_dims(cfg), max_context=context, prefill_chunk=prefill_chunk,
                         snapshot_slots=snapshot_slots)


def load_weights(engine, ck: Checkpoint, progress: LoadProgress | None = None) -> int:
    """Copy every tensor the engine needs from the checkpoint, shard by shard in file order;
    returns the bytes read. Tensors the engine does not use (MTP) are skipped."""
    wanted = {name for name, _shape, _dtype in engine.weight_specs()}
    todo = [(path, [n for n in names if n in wanted]) for path, names in ck.shards()]
    total = sum(ck.raw(n).nbytes for _path, names in todo for n in names)
    done = 0
    for _path, names in todo:
        for name in names:
            array = ck.raw(name)
            engine.load_tensor(name, array)
            done += array.nbytes
            if progress:
                progress(done, total)
    engine.finish_loading()
    return done


def chunk_ends(start: int, end: int, chunk: int, cuts: Iterable[int] = ()) -> list[int]:
    """End positions of the prefill calls covering [start, end): at most `chunk` tokens each,
    and a call boundary at every cut strictly inside the range."""
    if chunk < 1:
        raise ValueError(f"prefill chunk must be >= 1 (got {chunk})")
    ends: list[int] = []
    pos = start
    for stop in [*sorted({c for c in cuts if start < c < end}), end]:
        while pos < stop:
            pos = min(pos + chunk, stop)
            ends.append(pos)
    return ends


def random_seed(params: SamplingParams) -> int:
    return params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1


class _Rate:
    """Tokens per second over a trailing time window."""

    def __init__(self, window_s: float = LIVE_WINDOW_S):
        self._window = window_s
        self._marks: deque[tuple[float, int]] = deque()

    def add(self, t: float, n: int) -> float:
        self._marks.append((t, n))
        while len(self._marks) > 2 and t - self._marks[1][0] >= self._window:
            self._marks.popleft()
        (t0, n0) = self._marks[0]
        return (n - n0) / (t - t0) if t > t0 else 0.0


class CudaBackend:
    def __init__(self, model_dir: str | Path, *, context_max: int | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, snapshot_slots: int = DEFAULT_SNAPSHOT_SLOTS,
                 on_load: LoadProgress | None = None, native=None, tokenizer=None):
        self._native = native if native is not None else load_native()
        self._ck = Checkpoint.open(model_dir, include_mtp=False)
        cfg = self._ck.config
        context = min(context_max or cfg.max_position_embeddings, cfg.max_position_embeddings)
        if tokenizer is None:
            from lampo.models.tokenizer import Tokenizer

            tokenizer = Tokenizer.from_checkpoint(model_dir)
        self._tokenizer = tokenizer
        self._settings = dict(context=context, prefill_chunk=prefill_chunk, snapshot_slots=snapshot_slots)
        self._on_load = on_load
        self._engine = self._build_engine()
        self._cache = PrefixCache(snapshot_slots)
        self._busy = threading.Lock()
        self._info = BackendInfo("cuda", cfg.name or Path(model_dir).name, str(model_dir), context,
                                 is_demo=is_demo_checkpoint(Path(model_dir)))

    def _build_engine(self):
        engine = create_engine(self._native, self._ck.config, **self._settings)
        load_weights(engine, self._ck, self._on_load)
        return engine

    # ---- Backend protocol ---------------------------------------------------------------------
    @property
    def info(self) -> BackendInfo:
        return self._info

    def reset(self) -> None:
        with self._busy:
            self._cache.reset()
            self._engine.reset()

    def close(self) -> None:
        self._engine = None
        self._ck.close()

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        prompt = tuple(int(t) for t in request.prompt_ids)
        request.sampling.validate()
        ctx = self._info.context_max
        if not prompt:
            raise ValueError("generate: the prompt is empty")
        if len(prompt) > ctx:
            raise ContextOverflow(len(prompt), request.sampling.max_tokens, ctx)
        if self._engine is None:
            raise RuntimeError("generate: the backend is closed")
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("the CUDA backend is already generating")
        return self._run(prompt, request, cancel)

    # ---- one request ----------------------------------------------------------------------------
    def _stats(self, **kw) -> Stats:
        """Stats with the VRAM numbers filled in; remembered for an error report."""
        free, total = self._native.mem_info()
        self._last_stats = Stats(context_max=self._info.context_max, vram_used=total - free,
                                 vram_total=total, **kw)
        return self._last_stats

    def _run(self, prompt: tuple[int, ...], request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        self._last_stats = Stats(context_max=self._info.context_max)
        try:
            yield from self._prefill_and_decode(prompt, request, cancel)
        except (RuntimeError, ValueError, IndexError) as e:  # CudaError is a RuntimeError
            self._recover()
            yield Done("error", self._last_stats, f"{type(e).__name__}: {e}")
        finally:
            self._busy.release()

    def _resume(self, prompt: tuple[int, ...]) -> Resume:
        r = self._cache.best_resume(prompt)
        if r.source == "snapshot":
            self._engine.restore(r.slot)
        elif r.source == "fresh":
            self._engine.reset()
        self._cache.restore(r)
        return r

    def _prefill_and_decode(self, prompt, request: GenerationRequest, cancel: threading.Event):
        engine, cache, ctx = self._engine, self._cache, self._info.context_max
        sp = request.sampling
        t_start = time.perf_counter()
        resume = self._resume(prompt)
        engine.set_sampling(sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.presence_penalty, random_seed(sp))
        engine.begin_generation()

        # ---- prefill ----
        start, todo = resume.reused, len(prompt) - resume.reused
        cuts = cache.snapshot_positions(prompt, start, request.snapshot_at)
        stats = self._stats(cached_n=start, context_used=start)
        if start in cuts:
            engine.snapshot(cache.save())
        pos, token = start, -1
        for end in chunk_ends(start, len(prompt), engine.prefill_chunk, cuts):
            if cancel.is_set():
                yield Done("cancelled", stats)
                return
            token = engine.prefill(np.asarray(prompt[pos:end], dtype=np.int32), end == len(prompt))
            cache.append(prompt[pos:end])
            pos = end
            if pos in cuts:
                engine.snapshot(cache.save())
            elapsed = time.perf_counter() - t_start
            yield PrefillProgress(pos - start, todo, (pos - start) / elapsed if elapsed > 0 else 0.0)
        t_first = time.perf_counter()
        prompt_ms = (t_first - t_start) * 1000.0
        stats = self._stats(prompt_n=todo, prompt_ms=prompt_ms, cached_n=start, ttft_ms=prompt_ms,
                            context_used=len(prompt))
        yield stats

        # ---- decode ----
        decoder = self._tokenizer.stream_decoder()
        stop_ids = set(request.stop_ids)
        rate = _Rate()
        n, pending, last_stats = 0, [], t_first
        reason = "stop"
        while True:  # `token` is sampled, not yet fed to the model
            if cancel.is_set():
                reason = "cancelled"
                break
            if len(prompt) + n >= ctx:
                reason = "context"
                break
            if token in stop_ids:
                reason = "stop"
                break
            n += 1
            pending.append(token)
            text = decoder.push(token)
            if text:
                yield TokenEvent(text, tuple(pending))
                pending = []
            now = time.perf_counter()
            live = rate.add(now, n)
            if n >= sp.max_tokens:
                reason = "length"
                break
            if now - last_stats >= STATS_INTERVAL_S:
                last_stats = now
                yield self._stats(prompt_n=todo, prompt_ms=prompt_ms, cached_n=start, ttft_ms=prompt_ms,
                                  predicted_n=n, predicted_ms=(now - t_first) * 1000.0,
                                  live_tokens_per_second=live, context_used=len(prompt) + n)
            fed, token = token, engine.decode(-1)
            cache.append([fed])
        tail = decoder.flush()
        if tail or pending:
            yield TokenEvent(tail, tuple(pending))
        now = time.perf_counter()
        stats = self._stats(prompt_n=todo, prompt_ms=prompt_ms, cached_n=start, ttft_ms=prompt_ms,
                            predicted_n=n, predicted_ms=(now - t_first) * 1000.0,
                            live_tokens_per_second=rate.add(now, n), context_used=len(prompt) + n)
        yield stats
        yield Done(reason, stats)

    def _recover(self) -> None:
        """After a failed call: forget every cached state; keep the engine if the CUDA context is
        intact, else destroy it, reset the device and rebuild it from the checkpoint."""
        self._cache.reset()
        if self._engine is not None and self._engine.healthy():
            self._engine.reset()
            return
        self._engine = None
        self._native.reset_device()
        self._engine = self._build_engine()
