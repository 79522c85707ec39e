"""Waiting helpers for Pilot tests (importable as `tui_helpers`)."""

from __future__ import annotations

import time


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


class GatedBackend:
    """Wraps a backend so that each token waits for the test's `release(n)`: streaming states
    are checked deterministically, whatever the machine's load. Cancel still stops it at once."""

    def __init__(self, inner):
        import threading

        self.inner = inner
        self._allowance = threading.Semaphore(0)

    @property
    def info(self):
        return self.inner.info

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._allowance.release()

    def generate(self, request, cancel):
        from lampo.backend import TokenEvent

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
