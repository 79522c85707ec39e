"""Sampling settings shared by every backend (numpy reference, CUDA engine) and the UI."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy. top_k 0 and top_p 1 and min_p 0 disable those filters.

    Order (as llama.cpp / vLLM): presence penalty on raw logits, temperature, top-k, top-p,
    min-p, then a seeded draw. Padding vocabulary rows are always masked first.
    """

    temperature: float = 0.6
    top_k: int = 20
    top_p: float = 0.95
    min_p: float = 0.0
    presence_penalty: float = 0.0
    max_tokens: int = 4096
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k})")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1) (got {self.min_p})")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2] (got {self.presence_penalty})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (got {self.max_tokens})")

    def to_dict(self) -> dict:
        return asdict(self)


GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
