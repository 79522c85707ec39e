"""What the performance HUD shows, kept apart from the widget so it is testable on its own.

Fed by the backend's events (`Stats`, `Done`) and by the prompt editor (tokens the pending
message would add). Sparkline samples are taken on the backend's own clock (`predicted_ms`), one
per `SAMPLE_MS`, so the same stream always draws the same sparkline, whatever the UI frame rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from lampo.engine.protocol import BackendInfo, Done, Stats

SAMPLE_MS = 250.0
SPARK_SAMPLES = 16


@dataclass
class HudState:
    info: BackendInfo
    stats: Stats = field(default_factory=Stats)
    generating: bool = False
    last_reply_rate: float | None = None  # mean decode tok/s of the last finished reply
    last_reason: str = ""
    pending_tokens: int = 0
    context_used: int = 0
    rate_samples: deque = field(default_factory=lambda: deque(maxlen=SPARK_SAMPLES))
    _next_sample_ms: float = SAMPLE_MS

    @property
    def context_max(self) -> int:
        return self.info.context_max

    def begin_reply(self) -> None:
        self.generating = True
        self.stats = Stats(context_used=self.context_used, context_max=self.context_max)
        self.rate_samples.clear()
        self._next_sample_ms = SAMPLE_MS

    def on_stats(self, stats: Stats) -> None:
        self.stats = stats
        self.context_used = stats.context_used
        while stats.predicted_ms >= self._next_sample_ms:
            self.rate_samples.append(stats.live_tokens_per_second)
            self._next_sample_ms += SAMPLE_MS

    def on_done(self, done: Done) -> None:
        self.on_stats(done.stats)
        self.generating = False
        self.last_reason = done.reason
        if done.stats.predicted_n:
            self.last_reply_rate = done.stats.predicted_per_second
            if not self.rate_samples:
                self.rate_samples.append(self.last_reply_rate)

    def set_context(self, used: int, pending: int) -> None:
        """Context held by the session and what the draft (text + attachments) would add."""
        self.context_used, self.pending_tokens = used, pending

    @property
    def live_rate(self) -> float | None:
        return self.stats.live_tokens_per_second if self.generating and self.stats.predicted_n else None
