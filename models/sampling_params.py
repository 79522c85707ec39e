"""Sampling settings shared by every backend (numpy reference, CUDA engine) and the UI."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1


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
        """Raise ValueError "<key> must be <allowed> (got <value>)" for the first bad value. NaN
        fails every range; integers must fit the engine's types (int32 top_k / max_tokens,
        uint64 seed)."""
        _check("temperature", self.temperature, 0.0 <= self.temperature < math.inf, ">= 0 (finite)")
        _check("top_k", self.top_k, 0 <= self.top_k <= INT32_MAX, f"an integer in 0..{INT32_MAX:,} (0 = off)")
        _check("top_p", self.top_p, 0.0 < self.top_p <= 1.0, "in (0, 1]")
        _check("min_p", self.min_p, 0.0 <= self.min_p < 1.0, "in [0, 1)")
        _check("presence_penalty", self.presence_penalty, -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2]")
        _check("max_tokens", self.max_tokens, 1 <= self.max_tokens <= INT32_MAX, f"an integer in 1..{INT32_MAX:,}")
        if self.seed is not None:
            _check("seed", self.seed, 0 <= self.seed <= UINT64_MAX, f"an integer in 0..{UINT64_MAX:,}")

    def to_dict(self) -> dict:
        return asdict(self)


def _check(key: str, value: object, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{key} must be {allowed} (got {value})")


GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
