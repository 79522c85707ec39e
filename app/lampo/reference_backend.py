"""`ReferenceBackend`: the `Backend` protocol on the numpy fp32 reference model (CPU, slow).

Loads `Checkpoint.open(model_dir)` into `ReferenceModel.from_checkpoint` (tensors convert lazily)
and the checkpoint's tokenizer. Between calls it keeps the sequence state plus up to
`snapshot_slots` snapshots taken at the request's `snapshot_at` positions; `PrefixCache` picks the
longest held state that is a strict prefix of the new prompt, so a new turn (or a regenerate)
prefills only the rest, in chunks of `prefill_chunk` tokens, with a `PrefillProgress` after each
chunk and the cancel flag checked between chunks and between decode steps.

Decoding samples with `lampo.models.sampling.sample` (seeded by `sampling.seed`, else fresh
entropy; the presence penalty counts this reply's tokens), streams text through the tokenizer's
`StreamDecoder`, and stops on a stop id (not fed to the model), `max_tokens`, the context end
(prompt + reply == context_max) or cancel. A `Stats` follows prefill and every token.
`context_max` defaults to, and is clamped at, the model's `max_position_embeddings`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Iterator

import numpy as np

from lampo.backend import (
    BackendInfo,
    ContextOverflow,
    Done,
    DoneReason,
    Event,
    GenerationRequest,
    PrefillProgress,
    Stats,
    TokenEvent,
)
from lampo.demo import is_demo_checkpoint
from lampo.models.checkpoint import Checkpoint
from lampo.models.reference.model import ModelSnapshot, ReferenceModel
from lampo.models.sampling import sample
from lampo.models.tokenizer import Tokenizer
from lampo.prefix_cache import PrefixCache

LIVE_WINDOW_S = 0.5


class ReferenceBackend:
    def __init__(self, model_dir: str | Path, context_max: int | None = None, prefill_chunk: int = 64,
                 snapshot_slots: int = 4, tokenizer: Tokenizer | None = None):
        model_dir = Path(model_dir)
        checkpoint = Checkpoint.open(model_dir)
        cfg = checkpoint.config
        context_max = min(context_max or cfg.max_position_embeddings, cfg.max_position_embeddings)
        if context_max < 1:
            raise ValueError(f"context_max must be at least 1 (got {context_max})")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (got {prefill_chunk})")
        self.model = ReferenceModel.from_checkpoint(checkpoint)
        self.tokenizer = tokenizer or Tokenizer.from_checkpoint(model_dir)
        self._chunk = prefill_chunk
        self._cache = PrefixCache(snapshot_slots)
        self._snapshots: dict[int, ModelSnapshot] = {}
        self._busy = threading.Lock()
        self._info = BackendInfo("reference", cfg.name or model_dir.name, str(model_dir), context_max,
                                 is_demo=is_demo_checkpoint(model_dir))

    @property
    def info(self) -> BackendInfo:
        return self._info

    def reset(self) -> None:
        with self._busy:
            self.model.reset()
            self._cache.reset()
            self._snapshots.clear()

    def close(self) -> None:
        self.reset()

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        prompt = tuple(int(i) for i in request.prompt_ids)
        if not prompt:
            raise ValueError("generate: the prompt is empty")
        if len(prompt) > self._info.context_max:
            raise ContextOverflow(len(prompt), request.sampling.max_tokens, self._info.context_max)
        request.sampling.validate()
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("the reference backend is already generating")
        return self._run(prompt, request, cancel)

    # ---- one call ----------------------------------------------------------------------------
    def _run(self, prompt: tuple[int, ...], request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        run = _Run(self._info.context_max, time.perf_counter())
        try:
            logits = yield from self._prefill(prompt, request.snapshot_at, cancel, run)
            if logits is not None:
                yield run.stats()
                yield from self._decode(logits, len(prompt), request, cancel, run)
            yield Done(run.reason, run.stats())
        except Exception as e:  # a broken state is not reused
            self.model.reset()
            self._cache.reset()
            self._snapshots.clear()
            yield Done("error", run.stats(), f"{type(e).__name__}: {e}")
        finally:
            self._busy.release()

    def _prefill(self, prompt, snapshot_at, cancel, run: _Run):
        """Resume from the best held state and run the rest; returns the last logits, or None
        when cancelled (run.reason set)."""
        resume = self._cache.best_resume(prompt)
        if resume.source == "snapshot":
            self.model.restore(self._snapshots[resume.slot])
        elif resume.source == "fresh":
            self.model.reset()
        self._cache.restore(resume)
        run.cached_n = resume.reused
        run.context_used = resume.reused
        todo = len(prompt) - resume.reused
        stops = self._cache.snapshot_positions(prompt, resume.reused, snapshot_at)
        pos, logits = resume.reused, None
        while pos < len(prompt):
            if cancel.is_set():
                run.reason = "cancelled"
                return None
            end = min([pos + self._chunk, len(prompt), *(p for p in stops if p > pos)])
            logits = self.model.prefill(prompt[pos:end], last_only=True)
            self._cache.append(prompt[pos:end])
            pos = run.context_used = end
            if pos in stops:
                self._snapshots[self._cache.save()] = self.model.snapshot()
            run.prompt_n = pos - resume.reused
            run.prompt_ms = run.since_start_ms()
            yield PrefillProgress(run.prompt_n, todo, run.prompt_n / max(run.prompt_ms / 1000.0, 1e-9))
        run.decode_t0 = time.perf_counter()
        return logits

    def _decode(self, logits, prompt_len: int, request: GenerationRequest, cancel, run: _Run):
        params, stop_ids = request.sampling, set(request.stop_ids)
        rng = np.random.default_rng(params.seed)
        stream = self.tokenizer.stream_decoder()
        generated: list[int] = []
        pending: list[int] = []  # ids whose text is not complete yet
        while True:
            if cancel.is_set():
                run.reason = "cancelled"
                break
            if prompt_len + len(generated) >= self._info.context_max:
                run.reason = "context"
                break
            token = sample(logits, params, rng, generated)
            if token in stop_ids:
                run.reason = "stop"
                break
            generated.append(token)
            pending.append(token)
            text = stream.push(token)
            if text:
                yield TokenEvent(text, tuple(pending))
                pending.clear()
            run.token_done(len(generated))
            if len(generated) >= params.max_tokens:
                run.reason = "length"
                break
            logits = self.model.decode(token)
            self._cache.append([token])
            run.context_used += 1
            yield run.stats()
        tail = stream.flush()
        if tail or pending:
            yield TokenEvent(tail, tuple(pending))
        run.context_used = prompt_len + len(generated)


class _Run:
    """Timings and counters of one generate call."""

    def __init__(self, context_max: int, t0: float):
        self.context_max, self.t0 = context_max, t0
        self.reason: DoneReason = "stop"
        self.cached_n = self.prompt_n = self.predicted_n = self.context_used = 0
        self.prompt_ms = self.ttft_ms = self.predicted_ms = 0.0
        self.decode_t0 = t0
        self._recent: deque[tuple[float, int]] = deque()

    def since_start_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0

    def token_done(self, n: int) -> None:
        now = time.perf_counter()
        self.predicted_n = n
        self.predicted_ms = (now - self.decode_t0) * 1000.0
        if n == 1:
            self.ttft_ms = (now - self.t0) * 1000.0
        self._recent.append((now, n))
        while len(self._recent) > 2 and now - self._recent[0][0] > LIVE_WINDOW_S:
            self._recent.popleft()

    def stats(self) -> Stats:
        live = 0.0
        if len(self._recent) >= 2:
            (t_a, n_a), (t_b, n_b) = self._recent[0], self._recent[-1]
            live = (n_b - n_a) / (t_b - t_a) if t_b > t_a else 0.0
        return Stats(prompt_n=self.prompt_n, prompt_ms=self.prompt_ms, cached_n=self.cached_n,
                     predicted_n=self.predicted_n, predicted_ms=self.predicted_ms, ttft_ms=self.ttft_ms,
                     live_tokens_per_second=live, context_used=self.context_used,
                     context_max=self.context_max)
