"""Waiting helpers for Pilot tests (importable as `tui_helpers`)."""

from __future__ import annotations

import time

FIXED_WALL_CLOCK = 1_780_000_000.0  # epoch seconds the tests' apps take as "now"


async def wait_until(pilot, condition, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until `condition()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.02)


async def wait_idle(pilot, app) -> None:
    """Until no reply is being generated and every worker (token counts, attachments) is done."""
    await wait_until(pilot, lambda: not app.generating, what="the reply to finish")
    await app.workers.wait_for_complete()
    await pilot.pause()


class WrappedBackend:
    """A backend that hands everything but `generate` to the one it wraps."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def info(self):
        return self.inner.info

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()


class GatedBackend(WrappedBackend):
    """Wraps a backend so that each token waits for the test's `release(n)`: streaming states
    are checked deterministically, whatever the machine's load. Cancel still stops it at once."""

    def __init__(self, inner):
        import threading

        super().__init__(inner)
        self._allowance = threading.Semaphore(0)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._allowance.release()

    def generate(self, request, cancel):
        from lampo.engine.protocol import TokenEvent

        events = self.inner.generate(request, cancel)

        def gated():
            for event in events:
                if isinstance(event, TokenEvent):
                    while not self._allowance.acquire(timeout=0.01):
                        if cancel.is_set():
                            break
                    else:
                        yield event
                    continue  # a token still held back at cancel is dropped
                yield event

        return gated()


class SteadyClockBackend(WrappedBackend):
    """Wraps a backend and rewrites every `Stats` as if prefill ran at 2,000 tok/s and decode at
    125 tok/s (with speculation and VRAM figures when asked), so screenshots never show the
    speed of the machine that ran the test."""

    def __init__(self, inner, *, speculative: bool = False, vram: tuple[int, int] = (0, 0)):
        import dataclasses

        super().__init__(inner)
        self.speculative, self.vram = speculative, vram
        self._info = dataclasses.replace(inner.info, speculative=speculative)

    @property
    def info(self):
        return self._info

    def steady(self, stats):
        import dataclasses

        n = stats.predicted_n
        drafted = 3 * (n // 4) if self.speculative else 0
        return dataclasses.replace(
            stats, prompt_ms=stats.prompt_n / 2.0, predicted_ms=n * 8.0,
            ttft_ms=stats.prompt_n / 2.0 + 8.0 if n else 0.0, live_tokens_per_second=125.0 if n else 0.0,
            draft_n=drafted, draft_n_accepted=drafted * 2 // 3, draft_rounds=n // 4,
            vram_used=self.vram[0], vram_total=self.vram[1])

    def generate(self, request, cancel):
        import dataclasses

        from lampo.engine.protocol import Done, Stats

        events = self.inner.generate(request, cancel)  # may refuse at once, like any backend

        def steadied():
            for event in events:
                if isinstance(event, Stats):
                    event = self.steady(event)
                elif isinstance(event, Done):
                    event = dataclasses.replace(event, stats=self.steady(event.stats))
                yield event

        return steadied()
