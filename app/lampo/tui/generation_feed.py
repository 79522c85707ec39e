"""The hand-off between the generation worker thread and the UI's frame timer.

The worker runs the session's event iterator and only records into a `GenerationFeed` (plain
attribute writes, no widget access); the UI reads it once per frame, so a backend producing
thousands of tokens per second costs the UI one Markdown append per frame, never one per token.
The feed carries everything the screen shows of a reply: its text (appended as each `TokenEvent`
arrives, split into reasoning and answer by `parts()` the way the chat format does), the token
count, the last stats and prefill progress, and how it ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from lampo.engine.protocol import ContextOverflow, Done, Event, PrefillProgress, Stats, TokenEvent
from lampo.models.chat_format import split_reasoning


@dataclass
class GenerationFeed:
    thinking: bool = True  # the reply follows a thinking-on prompt
    tokens: int = 0  # tokens received so far
    stats: Stats | None = None
    progress: PrefillProgress | None = None
    done: Done | None = None
    refused: ContextOverflow | None = None  # the prompt did not fit: nothing was sent
    error: str = ""
    finished: bool = False  # the worker has returned; the session has stored the reply
    _pieces: list[str] = field(default_factory=list)  # the reply's text, one piece per TokenEvent

    def parts(self) -> tuple[str, str]:
        """(reasoning, answer) of the reply so far."""
        return split_reasoning("".join(self._pieces), self.thinking)

    def consume(self, start: Callable[[], Iterable[Event]]) -> None:
        """Worker side: start the generation (which may refuse at once) and drain its events."""
        try:
            for event in start():
                if isinstance(event, TokenEvent):
                    self._pieces.append(event.text)
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
