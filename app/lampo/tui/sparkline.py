"""A one-line text sparkline: recent values drawn as block characters (▁ … █)."""

from __future__ import annotations

from typing import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int) -> str:
    """The last `width` values, each scaled against the largest of them (0 → ▁, max → █)."""
    if width < 1:
        raise ValueError(f"sparkline width must be >= 1 (got {width})")
    shown = list(values)[-width:]
    top = max(shown, default=0.0)
    if top <= 0:
        return BLOCKS[0] * len(shown)
    last = len(BLOCKS) - 1
    return "".join(BLOCKS[max(0, min(last, round(v / top * last)))] for v in shown)
