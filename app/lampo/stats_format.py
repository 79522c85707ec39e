"""The one-line stats footer printed after each reply (plain mode, pipe mode's stderr, the TUI).

    prefill 1,234 tok/s (512 new, 2,048 cached) · decode 87.3 tok/s · TTFT 0.42 s · 128 tokens
    · ctx 2,688/262,144 (1.0%) · draft 71% (3.1/round)

Draft statistics read "draft —" when no speculative decoding ran. A Done reason other than a
normal stop is appended ("length", "stopped", "context full", "error").
"""

from __future__ import annotations

from lampo.backend import Stats

REASON_TEXT = {"length": "length limit", "cancelled": "stopped", "context": "context full", "error": "error"}


def _rate(tokens_per_second: float) -> str:
    return f"{tokens_per_second:,.0f}" if tokens_per_second >= 100 else f"{tokens_per_second:.1f}"


def footer(stats: Stats, reason: str | None = None) -> str:
    acceptance = stats.acceptance
    draft = "draft —" if acceptance is None else f"draft {acceptance:.0%} ({stats.mean_accepted_length:.1f}/round)"
    used = stats.context_used / stats.context_max if stats.context_max else 0.0
    parts = [
        f"prefill {_rate(stats.prompt_per_second)} tok/s ({stats.prompt_n:,} new, {stats.cached_n:,} cached)",
        f"decode {_rate(stats.predicted_per_second)} tok/s",
        f"TTFT {stats.ttft_ms / 1000.0:.2f} s",
        f"{stats.predicted_n:,} tokens",
        f"ctx {stats.context_used:,}/{stats.context_max:,} ({used:.1%})",
        draft,
    ]
    if reason in REASON_TEXT:
        parts.append(REASON_TEXT[reason])
    return " · ".join(parts)
