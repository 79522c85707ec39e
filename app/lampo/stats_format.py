"""The one-line stats footer printed after each reply (plain mode, pipe mode's stderr, the TUI),
and the text of a live prefill's progress.

    prefill 1,234 tok/s (512 new, 2,048 cached) · decode 87.3 tok/s · TTFT 0.42 s · 128 tokens
    · ctx 2,688/262,144 (1.0%) · draft 71% (3.1/round)

Draft statistics read "draft —" when no speculative decoding ran. A Done reason other than a
normal stop is appended ("length", "stopped", "context full", "error", or "interrupted" for a
stored reply that Lampo never finished writing: it was killed or crashed mid-reply). A reply
stopped (or failed) before its first token has no TTFT or decode figures: its footer says how far
the prefill got instead, from the last `PrefillProgress` when the caller passes it.

    stopped during prefill at 12,288 / 51,200 tokens · prefill 2,310 tok/s · ctx 12,288/262,144 (4.7%)
"""

from __future__ import annotations

from lampo.engine.protocol import PrefillProgress, Stats

REASON_TEXT = {"length": "length limit", "cancelled": "stopped", "context": "context full", "error": "error",
               "interrupted": "interrupted"}


def _rate(tokens_per_second: float) -> str:
    return f"{tokens_per_second:,.0f}" if tokens_per_second >= 100 else f"{tokens_per_second:.1f}"


def prefill_text(done: int, total: int, tokens_per_second: float, seconds_left: float = -1.0) -> str:
    """`prefill 12,288 / 51,200 tokens · 2,310 tok/s · ETA 17 s` (no rate or ETA before one is known).
    The ETA is `seconds_left` where the engine fitted one (later tokens cost more), else the time
    the remaining tokens take at the rate so far."""
    parts = [f"prefill {done:,} / {total:,} tokens"]
    if tokens_per_second > 0:
        eta = seconds_left if seconds_left >= 0 else (total - done) / tokens_per_second
        parts += [f"{_rate(tokens_per_second)} tok/s", f"ETA {eta:,.0f} s"]
    return " · ".join(parts)


def _context(stats: Stats) -> str:
    used = stats.context_used / stats.context_max if stats.context_max else 0.0
    return f"ctx {stats.context_used:,}/{stats.context_max:,} ({used:.1%})"


def _ended_in_prefill(stats: Stats, reason: str, prefill: PrefillProgress | None) -> str:
    what = "stopped" if reason == "cancelled" else "failed"
    if prefill is not None:
        parts = [f"{what} during prefill at {prefill.done:,} / {prefill.total:,} tokens"]
    else:
        parts = [f"{what} during prefill after {stats.prompt_n:,} new tokens"]
    if stats.prompt_per_second > 0:
        parts.append(f"prefill {_rate(stats.prompt_per_second)} tok/s")
    parts.append(_context(stats))
    return " · ".join(parts)


def footer(stats: Stats, reason: str | None = None, prefill: PrefillProgress | None = None) -> str:
    """The footer of a finished reply; `prefill`, the last progress event of its generation, lets
    a reply stopped during prefill say how far it got."""
    if reason in ("cancelled", "error") and not stats.predicted_n and not stats.ttft_ms:
        return _ended_in_prefill(stats, reason, prefill)
    acceptance = stats.acceptance
    draft = "draft —" if acceptance is None else f"draft {acceptance:.0%} ({stats.mean_accepted_length:.1f}/round)"
    parts = [
        f"prefill {_rate(stats.prompt_per_second)} tok/s ({stats.prompt_n:,} new, {stats.cached_n:,} cached)",
        f"decode {_rate(stats.predicted_per_second)} tok/s",
        f"TTFT {stats.ttft_ms / 1000.0:.2f} s",
        f"{stats.predicted_n:,} tokens",
        _context(stats),
        draft,
    ]
    if reason in REASON_TEXT:
        parts.append(REASON_TEXT[reason])
    return " · ".join(parts)
