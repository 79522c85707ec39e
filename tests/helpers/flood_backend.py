"""`FloodBackend`: a `Backend` that emits tokens as fast as it can, for the UI benchmark.

Each `generate` call streams `n_tokens` tokens cut from a Markdown document (paragraphs, a list,
a code fence; optionally a thinking part closed by `</think>` first), one `TokenEvent` and one
`Stats` per token (the densest event stream a real backend produces), with no delay. Speed is
whatever the consumer sustains; `emitted` counts tokens handed out, `text` is the full reply.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

from lampo.backend import BackendInfo, Done, Event, GenerationRequest, Stats, TokenEvent

_REASONING = "The user wants a demonstration. I will write some prose, a list and code. "
_DOCUMENT = (
    "Streaming **Markdown** at a high rate keeps the transcript busy: every frame appends a "
    "fragment and only the last block is parsed again.\n\n"
    "- one item with `inline code`\n- another item\n- a third, *emphasised*\n\n"
    "```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n```\n\n"
)


def _tokens(text: str, n: int) -> list[str]:
    """`n` tokens of roughly 4 characters, cycling through `text`."""
    out, pos = [], 0
    while len(out) < n:
        out.append(text[pos:pos + 4] or text[:4])
        pos = pos + 4 if pos + 4 < len(text) else 0
    return out


class FloodBackend:
    def __init__(self, n_tokens: int = 20_000, *, thinking_tokens: int = 0, context_max: int = 262_144):
        if n_tokens < 1:
            raise ValueError(f"FloodBackend needs n_tokens >= 1 (got {n_tokens})")
        self.n_tokens, self.thinking_tokens = n_tokens, thinking_tokens
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
