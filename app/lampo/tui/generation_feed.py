"""The hand-off between the generation worker thread and the UI's frame timer.

The worker runs the session's event iterator and only records into a `GenerationFeed` (plain
attribute writes, no widget access); the UI reads it once per frame, so a backend producing
thousands of tokens per second costs the UI one Markdown append per frame, never one per token.
The reply text itself is read from the session (`reply_parts()`), which the same iterator keeps
current before each event is yielded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from lampo.engine.protocol import ContextOverflow, Done, Event, PrefillProgress, Stats, TokenEvent


@dataclass
class GenerationFeed:
    tokens: int = 0  # tokens received so far
    stats: Stats | None = None
    progress: PrefillProgress | None = None
    done: Done | None = None
    refused: ContextOverflow | None = None  # the prompt did not fit: nothing was sent
    error: str = ""
    finished: bool = False  # the worker has returned; the session has stored the reply

    def consume(self, start: Callable[[], Iterable[Event]]) -> None:
        """Worker side: start the generation (which may refuse at once) and drain its events."""
        try:
            for event in start():
                if isinstance(event, TokenEvent):
                    self.tokens += len(event.ids)
                elif isinstance(event, Stats):
                    self.stats = event
                elif isinstance(event, PrefillProgress):
                    self.progress = event
                elif isinstance(event, Done):
                    self.done = event
                    self.error = event.error if event.reason == "error" else ""
        except ContextOverflow as e:
            self.refused = e
        except Exception as e:  # noqa: BLE001 - shown to the user, never swallowed silently
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.finished = True
