"""`ScriptedBackend`: a `Backend` that streams canned replies, for UI and session tests.

Each `generate` call plays the next scripted reply (the last one repeats once the script runs
out). A reply is a string (streamed one character per token) or a sequence of text chunks
(one chunk per token). It behaves like a real backend where the UI can tell: it refuses a prompt
longer than `context_max` with `ContextOverflow` before doing anything, reports the prefix it
"reuses" from the previous call as `Stats.cached_n`, emits `PrefillProgress` per
`prefill_chunk` tokens, a `Stats` after prefill and after every token, honours `cancel` between
prefill chunks and between tokens (`delay` seconds per token, interruptible), stops at
`sampling.max_tokens` ("length") and at the context end ("context"), and ends every call with
exactly one `Done`. Generated token ids are fake (`FIRST_REPLY_ID + n`).

Every request is recorded in `requests`; `generated_ids` holds the last call's ids.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, Sequence

from lampo.engine.protocol import (
    BackendInfo,
    ContextOverflow,
    Done,
    Event,
    GenerationRequest,
    PrefillProgress,
    Stats,
    TokenEvent,
)

FIRST_REPLY_ID = 1000

Reply = str | Sequence[str]


class ScriptedBackend:
    def __init__(
        self,
        replies: Sequence[Reply] = ("Hello from the scripted backend.",),
        *,
        delay: float = 0.0,
        context_max: int = 4096,
        prefill_chunk: int = 64,
        model_name: str = "scripted",
        is_demo: bool = False,
    ):
        if not replies:
            raise ValueError("ScriptedBackend needs at least one reply")
        self._replies = [list(r) if isinstance(r, str) else list(r) for r in replies]
        self._next = 0
        self._delay = delay
        self._prefill_chunk = prefill_chunk
        self._held: tuple[int, ...] = ()
        self._info = BackendInfo("scripted", model_name, "", context_max, is_demo=is_demo)
        self.requests: list[GenerationRequest] = []
        self.generated_ids: tuple[int, ...] = ()
        self.closed = False

    @property
    def info(self) -> BackendInfo:
        return self._info

    def reset(self) -> None:
        self._held = ()

    def close(self) -> None:
        self.closed = True

    def _take_reply(self) -> list[str]:
        reply = self._replies[min(self._next, len(self._replies) - 1)]
        self._next += 1
        return reply

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        ctx = self._info.context_max
        prompt = tuple(request.prompt_ids)
        if len(prompt) > ctx:
            raise ContextOverflow(len(prompt), request.sampling.max_tokens, ctx)
        self.requests.append(request)
        chunks = self._take_reply()
        return self._stream(prompt, chunks, request, cancel)

    def _stream(self, prompt: tuple[int, ...], chunks: list[str], request: GenerationRequest,
                cancel: threading.Event) -> Iterator[Event]:
        ctx = self._info.context_max
        cached = 0
        while cached < min(len(prompt), len(self._held)) and prompt[cached] == self._held[cached]:
            cached += 1
        cached = min(cached, len(prompt) - 1) if prompt else 0  # the last prompt token always runs
        todo = len(prompt) - cached
        t0 = time.perf_counter()
        stats = Stats(cached_n=cached, context_used=cached, context_max=ctx)
        done = 0
        while done < todo:
            if cancel.is_set():
                self._held = prompt[: cached + done]
                yield Done("cancelled", stats)
                return
            done = min(todo, done + self._prefill_chunk)
            yield PrefillProgress(done, todo)
        prompt_ms = (time.perf_counter() - t0) * 1000.0
        stats = Stats(prompt_n=todo, prompt_ms=prompt_ms, cached_n=cached,
                      context_used=len(prompt), context_max=ctx)
        yield stats
        ids: list[int] = []
        t_decode = time.perf_counter()
        reason = "stop"
        for chunk in chunks:
            if len(ids) >= request.sampling.max_tokens:
                reason = "length"
                break
            if len(prompt) + len(ids) >= ctx:
                reason = "context"
                break
            if cancel.is_set() or (self._delay and cancel.wait(self._delay)):
                reason = "cancelled"
                break
            ids.append(FIRST_REPLY_ID + len(ids))
            yield TokenEvent(chunk, (ids[-1],))
            elapsed_ms = (time.perf_counter() - t_decode) * 1000.0
            stats = Stats(
                prompt_n=todo, prompt_ms=prompt_ms, cached_n=cached,
                predicted_n=len(ids), predicted_ms=elapsed_ms,
                ttft_ms=stats.ttft_ms or prompt_ms + elapsed_ms,
                live_tokens_per_second=len(ids) / (elapsed_ms / 1000.0) if elapsed_ms > 0 else 0.0,
                context_used=len(prompt) + len(ids), context_max=ctx,
            )
            yield stats
        self.generated_ids = tuple(ids)
        self._held = prompt + self.generated_ids
        yield Done(reason, stats)
