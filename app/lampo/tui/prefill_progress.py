"""Prefill progress for long prompts: a bar with tokens done / total, tok/s and ETA.

Shown (class `-active`) from the first `PrefillProgress` event of a reply until its first token
or its end. The rate comes from the backend when it reports one, else from `clock` (injectable
so tests and snapshots are deterministic) since the first event; the ETA is the backend's fitted
time left where it gives one (stats_format.prefill_text).
"""

from __future__ import annotations

import time
from typing import Callable

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import ProgressBar, Static

from lampo.engine.protocol import PrefillProgress
from lampo.stats_format import prefill_text


def prefill_label(done: int, total: int, rate: float, stop_key: str = "Esc", seconds_left: float = -1.0) -> str:
    """`prefill 12,288 / 51,200 tokens · 2,310 tok/s · ETA 17 s · Esc cancels`."""
    return f"{prefill_text(done, total, rate, seconds_left)} · {stop_key} cancels"


class PrefillProgressBar(Horizontal):
    def __init__(self, *, clock: Callable[[], float] = time.monotonic, stop_key: str = "Esc",
                 id: str | None = None):
        super().__init__(id=id)
        self._clock, self._stop_key = clock, stop_key
        self._first: tuple[float, int] | None = None  # (time, done) of the first event

    def compose(self) -> ComposeResult:
        yield ProgressBar(show_eta=False, show_percentage=True)
        yield Static(id="prefill-label", markup=False)

    def show_progress(self, event: PrefillProgress) -> None:
        now = self._clock()
        if self._first is None:
            self._first = (now, event.done)
        rate = event.tokens_per_second
        t0, done0 = self._first
        if rate <= 0 and now > t0:
            rate = (event.done - done0) / (now - t0)
        self.add_class("-active")
        self.query_one(ProgressBar).update(total=max(event.total, 1), progress=event.done)
        self.query_one("#prefill-label", Static).update(
            prefill_label(event.done, event.total, rate, self._stop_key, event.seconds_left))

    def hide(self) -> None:
        self._first = None
        self.remove_class("-active")
