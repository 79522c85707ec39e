"""The context meter: a bar of used / pending / free tokens, as theme-coloured markup."""

from __future__ import annotations

from textual.content import Content


def context_bar(used: int, pending: int, maximum: int, width: int) -> Content:
    """`width` cells: used tokens solid, the pending message's tokens hatched, free space dim.

    A pending message that would overflow fills the bar in the error colour, so the user sees
    the refusal coming before pressing Enter.
    """
    if maximum <= 0:
        raise ValueError(f"context maximum must be positive (got {maximum})")
    if width < 1:
        raise ValueError(f"context bar width must be >= 1 (got {width})")
    if used + pending > maximum:
        return Content.from_markup("[$error]$bar", bar="█" * width)
    used_cells = min(width, round(used / maximum * width))
    if used > 0:
        used_cells = max(1, used_cells)
    pending_cells = min(width - used_cells, round(pending / maximum * width))
    if pending > 0:
        pending_cells = max(1, pending_cells) if used_cells < width else 0
    free_cells = width - used_cells - pending_cells
    return Content.from_markup(
        "[$accent]$used[/][$warning]$pending[/][$foreground 25%]$free[/]",
        used="█" * used_cells,
        pending="▒" * pending_cells,
        free="░" * free_cells,
    )
