"""The engine front: one `Backend` protocol, its request and the events it streams.

The UI (Textual or plain) never knows which backend it drives. A backend receives the whole
rendered prompt as token ids every turn and reuses whatever prefix it still holds (KV rows and
Gated DeltaNet states saved at turn boundaries), so a new turn prefills only the new tokens.

`generate` is a blocking iterator meant to run in a worker thread; `cancel` (a threading.Event)
is checked between prefill chunks and before every decoded token (also between the tokens of one
speculative step). Every call ends with exactly one `Done` event, also on cancellation and errors.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator, Literal, Protocol, Union, runtime_checkable

from lampo.models.sampling_params import SamplingParams

DoneReason = Literal["stop", "length", "cancelled", "error", "context"]


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Prefix lengths at which the backend must keep a restorable state (e.g. the end of the
    # last user turn), so that the next turn can resume there even when the re-rendered
    # history diverges after it (the chat template drops earlier reasoning).
    snapshot_at: tuple[int, ...] = ()
    stop_ids: tuple[int, ...] | None = None  # None: the tokenizer's (end of turn, end of text)


@dataclass(frozen=True)
class TokenEvent:
    """Newly decoded text (never a broken UTF-8 sequence) and the ids that produced it."""

    text: str
    ids: tuple[int, ...]


@dataclass(frozen=True)
class PrefillProgress:
    done: int  # prompt tokens processed so far in this call (excluding the reused prefix)
    total: int  # prompt tokens this call must process
    tokens_per_second: float = 0.0
    seconds_left: float = -1.0  # fitted to the calls so far (engine/prefill_eta.py); < 0: not known


@dataclass(frozen=True)
class Stats:
    """Running statistics; names follow the llama.cpp server's timing fields."""

    prompt_n: int = 0  # tokens prefilled in this call
    prompt_ms: float = 0.0
    cached_n: int = 0  # prompt tokens reused from the previous state
    predicted_n: int = 0  # tokens generated so far
    predicted_ms: float = 0.0
    ttft_ms: float = 0.0
    live_tokens_per_second: float = 0.0  # decode speed over the last ~0.5 s
    draft_n: int = 0  # speculative drafts verified in this reply
    draft_n_accepted: int = 0  # of those, the ones the model kept
    draft_rounds: int = 0  # decode steps that verified drafts
    draft_kept_at: tuple[int, ...] = ()  # rounds that kept draft i + 1 (so every draft before it too)
    context_used: int = 0
    context_max: int = 0
    vram_used: int = 0  # bytes; 0 when not applicable (CPU backend)
    vram_total: int = 0

    @property
    def prompt_per_second(self) -> float:
        return self.prompt_n / (self.prompt_ms / 1000.0) if self.prompt_ms > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return self.predicted_n / (self.predicted_ms / 1000.0) if self.predicted_ms > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per speculative round, including the bonus/correction token."""
        return (self.draft_n_accepted + self.draft_rounds) / self.draft_rounds if self.draft_rounds else None


@dataclass(frozen=True)
class Done:
    reason: DoneReason
    stats: Stats
    error: str = ""


Event = Union[TokenEvent, PrefillProgress, Stats, Done]


@dataclass(frozen=True)
class BackendInfo:
    backend: str  # "cuda" / "reference"
    model_name: str
    model_dir: str
    context_max: int
    is_demo: bool = False  # random-weight demo checkpoint: say so in the UI
    speculative: bool = False  # decode steps may verify drafts (speculative decoding is not off)
    weights: str = ""  # the weight format the engine runs ("q5", "q4", "bf16"); "" = as stored


class ContextOverflow(ValueError):
    """A prompt that does not fit the context; the message carries the numbers."""

    def __init__(self, prompt_tokens: int, max_new: int, context_max: int):
        self.prompt_tokens, self.max_new, self.context_max = prompt_tokens, max_new, context_max
        super().__init__(
            f"prompt is {prompt_tokens:,} tokens but the context holds {context_max:,} "
            f"({prompt_tokens - context_max:,} too many); nothing was truncated - shorten the "
            f"document or start a new chat"
        )

    def __reduce__(self):  # pickled with its numbers (it crosses from a backend process)
        return type(self), (self.prompt_tokens, self.max_new, self.context_max)


@runtime_checkable
class Backend(Protocol):
    @property
    def info(self) -> BackendInfo: ...

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        """Prefill what is new in `request.prompt_ids`, then stream tokens until a stop id,
        `sampling.max_tokens`, the context end, or `cancel`. Raises ContextOverflow (before any
        work) when the prompt alone does not fit."""
        ...

    def reset(self) -> None:
        """Forget every cached state (new chat)."""
        ...

    def close(self) -> None: ...
