"""`FloodBackend`: a `Backend` that emits tokens as fast as it can, for the UI benchmark.

Each `generate` call streams `n_tokens` tokens cut from a Markdown document (paragraphs, a list,
a code fence; optionally a thinking part closed by `</think>` first), one `TokenEvent` and one
`Stats` per token (the densest event stream a real backend produces). With no
`tokens_per_second` there is no delay: the speed is whatever the consumer sustains; with one,
token i is not handed out before i / tokens_per_second seconds. `emitted` counts tokens handed
out, `text` is the reply so far.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

from lampo.engine.protocol import BackendInfo, Done, Event, GenerationRequest, Stats, TokenEvent
from lampo.models.config_schema import FAMILY_CONTEXT_MAX

_REASONING = ("The user wants a demonstration, so I will explain the idea in prose first, then give a short "
              "list of points and a code example, and keep the tone practical. ")
# One cycle (~1,600 characters, ~400 tokens) of what a chat model writes: a heading, prose, a list,
# a code fence. Cut into 4-character tokens it is denser in Markdown blocks than typical replies.
_DOCUMENT = (
    "## Streaming a reply\n\n"
    "Streaming **Markdown** at a high rate keeps the transcript busy: every frame appends the "
    "text that arrived since the last one, and only the last top-level block is parsed again. "
    "Older blocks are frozen, so a long answer costs no more per frame than a short one.\n\n"
    "The engine does not wait for the screen either. Tokens are handed over through a small "
    "feed that the interface reads once a frame, so a burst of tokens is one update, not many. "
    "When the user scrolls away, the view stops following and nothing jumps.\n\n"
    "- tokens are batched per frame, at most thirty times a second\n"
    "- finished blocks are never parsed again while the reply grows\n"
    "- blocks far from the view give their widgets back until needed\n"
    "- the final text is rendered once in full when the reply ends\n\n"
    "```python\ndef fibonacci(n: int) -> list[int]:\n    \"\"\"The first n Fibonacci numbers.\"\"\"\n"
    "    numbers = [0, 1]\n    while len(numbers) < n:\n        numbers.append(numbers[-1] + numbers[-2])\n"
    "    return numbers[:n]\n```\n\n"
    "That function is short on purpose: the point is how the text around it is shown, `inline code` "
    "included, while the next paragraph is still arriving from the engine.\n\n"
)


def _tokens(text: str, n: int) -> list[str]:
    """`n` tokens of roughly 4 characters, cycling through `text`."""
    out, pos = [], 0
    while len(out) < n:
        out.append(text[pos:pos + 4] or text[:4])
        pos = pos + 4 if pos + 4 < len(text) else 0
    return out


class FloodBackend:
    def __init__(self, n_tokens: int = 20_000, *, thinking_tokens: int = 0, context_max: int = FAMILY_CONTEXT_MAX,
                 tokens_per_second: float | None = None):
        if n_tokens < 1:
            raise ValueError(f"FloodBackend needs n_tokens >= 1 (got {n_tokens})")
        if tokens_per_second is not None and tokens_per_second <= 0:
            raise ValueError(f"tokens_per_second must be positive (got {tokens_per_second})")
        self.n_tokens, self.thinking_tokens = n_tokens, thinking_tokens
        self.tokens_per_second = tokens_per_second
        self._info = BackendInfo("flood", "flood", "", context_max)
        self.emitted = 0
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted by the last call."""
        return "".join(self._pieces[: self.emitted])

    @property
    def info(self) -> BackendInfo:
        return self._info

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        pieces = _tokens(_REASONING, self.thinking_tokens) + (["</think>\n\n"] if self.thinking_tokens else [])
        pieces += _tokens(_DOCUMENT, self.n_tokens - len(pieces))
        return self._stream(len(request.prompt_ids), pieces, cancel)

    def _stream(self, prompt_n: int, pieces: list[str], cancel: threading.Event) -> Iterator[Event]:
        self.emitted, self._pieces = 0, pieces
        t0 = time.perf_counter()
        stats = Stats(prompt_n=prompt_n, prompt_ms=1.0, context_used=prompt_n, context_max=self._info.context_max)
        yield stats
        for i, piece in enumerate(pieces):
            if self.tokens_per_second is not None:
                wait = t0 + i / self.tokens_per_second - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            if cancel.is_set():
                yield Done("cancelled", stats)
                return
            self.emitted = i + 1
            yield TokenEvent(piece, (i,))
            ms = (time.perf_counter() - t0) * 1000.0
            stats = Stats(prompt_n=prompt_n, prompt_ms=1.0, predicted_n=i + 1, predicted_ms=ms,
                          ttft_ms=1.0, live_tokens_per_second=(i + 1) / max(ms, 1e-3) * 1000.0,
                          context_used=prompt_n + i + 1, context_max=self._info.context_max)
            yield stats
        yield Done("stop", stats)
