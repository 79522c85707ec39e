"""The one generation loop behind every `Backend`: prefix reuse, chunked prefill, decode, events.

Backends differ only in the engine that runs the model; they hand the loop an `EngineSteps`
adapter per call, and the loop does the rest, following `PrefixCache`'s engine loop:

- validate the request (empty prompt, `ContextOverflow` before any work, `sampling.validate()`)
  and refuse a second generation while one runs;
- resume from the longest held state (the current one, a snapshot slot, or fresh), then prefill
  the rest in calls of at most `steps.chunk` tokens, cut at the request's `snapshot_at` positions
  where a snapshot is saved, with a `PrefillProgress` after each call and the cancel flag checked
  between calls;
- the last prefill call samples the first token; then stream it and decode until a stop id (the
  request's, else the tokenizer's; never fed to the model), `max_tokens`, the context end (prompt +
  reply == context_max) or cancel, checked before every token. Each step is queued on the engine
  before the token it feeds is streamed, so the device computes while the host decodes text, yields
  events and waits for its consumer (`decode_submit`, then `decode_collect`). A speculative step
  returns the drafts it kept (already fed) before its own next token; they are streamed one by one
  under the same checks, and the ones a stop leaves unstreamed are taken back (`rewind`), so the
  engine's state always holds exactly the ids the cache says. Text goes through the tokenizer's
  `StreamDecoder`; ids whose text is not complete yet travel with the next `TokenEvent`.
- `Stats` after prefill, while decoding (at most one per `stats_interval_s`) and before `Done`;
  live tok/s is measured over the last `LIVE_WINDOW_S` seconds; the draft counts are the reply's
  rounds so far (drafted, kept by the target, rounds that drafted).
- any exception ends the call with `Done("error")`: every cached state is forgotten and the
  backend's `recover` hook runs (the state of a failed call is never reused).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol, Sequence

from lampo.engine.protocol import ContextOverflow, Done, DoneReason, Event, GenerationRequest, PrefillProgress, Stats, TokenEvent
from lampo.engine.prefill_eta import PrefillEta
from lampo.engine.prefix_cache import PrefixCache

LIVE_WINDOW_S = 0.5  # live tok/s is measured over this trailing window


@dataclass(frozen=True)
class Decoded:
    """One decode step's output: `tokens`, the drafts it kept (already fed to the model) and then
    the token it sampled (not fed); `drafted`, how many drafts it verified (0: a plain step)."""

    tokens: tuple[int, ...]
    drafted: int = 0


class EngineSteps(Protocol):
    """One generate call's view of an engine. Sampling settings are the adapter's own (given
    when it is made); `begin` starts a reply (seed, presence-penalty set) after the resume."""

    chunk: int  # most tokens per prefill call

    def begin(self) -> None: ...

    def reset(self) -> None:
        """Empty state (position 0)."""

    def restore(self, slot: int) -> None:
        """Make snapshot `slot` the current state."""

    def snapshot(self, slot: int) -> None:
        """Save the current state into `slot`."""

    def prefill(self, ids: Sequence[int], last: bool) -> int | None:
        """Run `ids` through the model; when `last`, return the token sampled from the last row."""

    def decode_submit(self, fed: int, max_drafts: int) -> None:
        """Start the step that feeds the sampled token `fed` (one step at a time); a drafting
        engine verifies at most `max_drafts` drafts (what the reply and the context have room for)."""

    def decode_collect(self) -> Decoded:
        """Wait for the started step; return what it produced."""

    def rewind(self, n: int) -> None:
        """Take the last `n` drafts the collected step kept back out of the state (they will not
        be streamed); called only after a step that kept at least `n` (engines that never draft
        need not define it)."""

    def vram(self) -> tuple[int, int]:
        """(bytes used, bytes total) of the device; (0, 0) on the CPU."""


class SyncDecode:
    """`decode_submit` / `decode_collect` for engines that compute a step in the calling thread
    (CPU models): the subclass defines `decode(fed, max_drafts) -> Decoded`, which runs at collect
    time, where an asynchronous engine would report a failed step."""

    _submitted: tuple[int, int]

    def decode_submit(self, fed: int, max_drafts: int) -> None:
        self._submitted = (fed, max_drafts)

    def decode_collect(self) -> Decoded:
        return self.decode(*self._submitted)


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


class GenerationLoop:
    """Owns a backend's `PrefixCache` and its one-call-at-a-time lock. `forget` drops the engine's
    states (new chat); `recover` runs after a failed call (default: `forget`)."""

    def __init__(self, tokenizer, cache: PrefixCache, *, label: str, forget: Callable[[], None],
                 recover: Callable[[], None] | None = None, stats_interval_s: float = 0.0):
        self.cache = cache
        self._tokenizer = tokenizer
        self._label = label
        self._forget = forget
        self._recover = recover or forget
        self._stats_interval = stats_interval_s
        self._busy = threading.Lock()

    def reset(self) -> None:
        """Forget every cached state (waits for a running call to end)."""
        with self._busy:
            self.cache.reset()
            self._forget()

    def start(self, request: GenerationRequest, cancel: threading.Event, steps: EngineSteps,
              context_max: int) -> Iterator[Event]:
        """Check the request now (raising), then return the call's event stream."""
        prompt = tuple(map(int, request.prompt_ids))
        if not prompt:
            raise ValueError("generate: the prompt is empty")
        if len(prompt) > context_max:
            raise ContextOverflow(len(prompt), request.sampling.max_tokens, context_max)
        request.sampling.validate()
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"the {self._label} backend is already generating")
        return self._run(prompt, request, cancel, steps, _Counters(context_max, steps))

    def _run(self, prompt, request, cancel, steps: EngineSteps, run: _Counters) -> Iterator[Event]:
        try:
            yield from self._generate(prompt, request, cancel, steps, run)
        except Exception as e:  # a broken state is not reused
            self.cache.reset()
            self._recover()
            yield Done("error", run.stats(query_vram=False), f"{type(e).__name__}: {e}")
        finally:
            self._busy.release()

    def _generate(self, prompt, request: GenerationRequest, cancel, steps: EngineSteps, run: _Counters):
        cache = self.cache
        resume = cache.best_resume(prompt)
        if resume.source == "snapshot":
            steps.restore(resume.slot)
        elif resume.source == "fresh":
            steps.reset()
        cache.restore(resume)
        steps.begin()

        # ---- prefill ----
        start, todo = resume.reused, len(prompt) - resume.reused
        run.cached_n = run.context_used = start
        cuts = cache.snapshot_positions(prompt, start, request.snapshot_at)
        if start in cuts:
            steps.snapshot(cache.save())
        token = None
        for end in chunk_ends(start, len(prompt), steps.chunk, cuts):
            if cancel.is_set():
                yield Done("cancelled", run.stats())
                return
            ids = prompt[run.context_used:end]
            token = steps.prefill(ids, end == len(prompt))
            cache.append(ids)
            run.context_used = end
            if end in cuts:
                steps.snapshot(cache.save())
            yield run.prefilled(end - start, todo)
        run.first_token()
        yield run.stats()

        # ---- decode: `queue` holds the sampled tokens not streamed yet; the engine has fed all
        # but the last (drafts a speculative step kept), the cache none of them ----
        decoder = self._tokenizer.stream_decoder()
        stop_ids = set(self._tokenizer.stop_ids if request.stop_ids is None else request.stop_ids)
        max_tokens = request.sampling.max_tokens
        n, pending, last_stats = 0, [], run.t_first
        reason: DoneReason
        queue = [token]
        queued = False  # a step feeding `token` runs on the engine
        try:
            while True:
                token = queue[0]
                if cancel.is_set():
                    reason = "cancelled"
                    break
                if len(prompt) + n >= run.context_max:
                    reason = "context"
                    break
                if token in stop_ids:
                    reason = "stop"
                    break
                n += 1
                more = n < max_tokens
                if more:  # `token` is fed: by a step started now, or already (a kept draft)
                    del queue[0]
                    if queue:
                        cache.append([token])
                        run.context_used += 1
                    else:
                        steps.decode_submit(token, min(max_tokens - n - 1, run.context_max - len(prompt) - n))
                        queued = True
                pending.append(token)
                text = decoder.push(token)
                if text:
                    yield TokenEvent(text, tuple(pending))
                    pending = []
                now = run.token_done(n)
                if not more:
                    reason = "length"
                    break
                if queued:
                    queued = False
                    step = steps.decode_collect()
                    run.decoded(step)
                    queue = list(step.tokens)
                    cache.append([token])
                    run.context_used += 1
                if now - last_stats >= self._stats_interval:
                    last_stats = now
                    yield run.stats()
        finally:
            if queued:  # the stream was closed while a step ran: the state did take `token`
                queue = list(steps.decode_collect().tokens)
                cache.append([token])
            if len(queue) > 1:  # kept drafts that were not streamed: out of the state again
                steps.rewind(len(queue) - 1)
        tail = decoder.flush()
        if tail or pending:
            yield TokenEvent(tail, tuple(pending))
        run.context_used = len(prompt) + n
        stats = run.stats()
        yield stats
        yield Done(reason, stats)


class _Counters:
    """Timings and counters of one generate call, as `Stats`."""

    def __init__(self, context_max: int, steps: EngineSteps):
        self.context_max, self._steps = context_max, steps
        self.t0 = self.t_first = time.perf_counter()
        self.cached_n = self.prompt_n = self.predicted_n = self.context_used = 0
        self.draft_n = self.draft_n_accepted = self.draft_rounds = 0
        self.draft_kept_at: list[int] = []
        self.prompt_ms = self.ttft_ms = self.predicted_ms = self.live = 0.0
        self._vram = (0, 0)
        self._marks: deque[tuple[float, int]] = deque()  # (time, tokens) over the live window
        self._eta: PrefillEta | None = None  # from the first prefill call, which fixes its start
        self._t_call = self.t0  # when the last prefill call ended

    def prefilled(self, n: int, todo: int) -> PrefillProgress:
        now = time.perf_counter()
        elapsed = now - self.t0
        if self._eta is None:
            self._eta = PrefillEta(self.cached_n)
        self._eta.add(self.cached_n + n, now - self._t_call)
        self._t_call = now
        self.prompt_n, self.prompt_ms = n, elapsed * 1000.0
        return PrefillProgress(n, todo, n / elapsed if elapsed > 0 else 0.0,
                               self._eta.seconds_left(self.cached_n + todo))

    def first_token(self) -> None:
        """Prefill is over and the first token is sampled."""
        self.t_first = time.perf_counter()
        self.prompt_ms = self.ttft_ms = (self.t_first - self.t0) * 1000.0

    def token_done(self, n: int) -> float:
        """`n` tokens are out; returns the time."""
        now = time.perf_counter()
        self.predicted_n, self.predicted_ms = n, (now - self.t_first) * 1000.0
        self._marks.append((now, n))
        while len(self._marks) > 2 and now - self._marks[1][0] >= LIVE_WINDOW_S:
            self._marks.popleft()
        t_a, n_a = self._marks[0]
        self.live = (n - n_a) / (now - t_a) if now > t_a else 0.0
        return now

    def decoded(self, step: Decoded) -> None:
        """Count a decode step's drafts (kept: as the target judged them, also those a stop
        leaves unstreamed)."""
        if step.drafted:
            kept = len(step.tokens) - 1
            self.draft_rounds += 1
            self.draft_n += step.drafted
            self.draft_n_accepted += kept
            self.draft_kept_at += [0] * (kept - len(self.draft_kept_at))
            for i in range(kept):
                self.draft_kept_at[i] += 1

    def stats(self, query_vram: bool = True) -> Stats:
        """Current numbers; the VRAM reading is the last one when `query_vram` is False (after an
        engine failure the device may not answer)."""
        if query_vram:
            self._vram = self._steps.vram()
        return Stats(prompt_n=self.prompt_n, prompt_ms=self.prompt_ms, cached_n=self.cached_n,
                     predicted_n=self.predicted_n, predicted_ms=self.predicted_ms, ttft_ms=self.ttft_ms,
                     live_tokens_per_second=self.live, draft_n=self.draft_n,
                     draft_n_accepted=self.draft_n_accepted, draft_rounds=self.draft_rounds,
                     draft_kept_at=tuple(self.draft_kept_at),
                     context_used=self.context_used,
                     context_max=self.context_max, vram_used=self._vram[0], vram_total=self._vram[1])
