"""Parking: widgets far off-screen give up their children and keep only their height.

Textual re-arranges every mounted widget on each layout change (a streamed token, a mount), so
the cost of a frame grows with everything mounted, visible or not. A `Parkable` widget far above
or below the view is *parked*: its children are removed and its height is pinned to what it
was, so scrolling positions do not move; near the view again it is *unparked* and rebuilds its
children (`_rebuild`). `plan_parking` decides for a list of widgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from textual.widget import Widget


class Parkable:
    """Mixin for a Widget that can rebuild its children from its own data."""

    parked: bool = False

    @property
    def can_park(self) -> bool:
        return True

    async def park(self) -> None:
        widget: Widget = self  # type: ignore[assignment]
        if self.parked or not self.can_park or not widget.is_mounted:
            return
        height = widget.outer_size.height
        if height <= 0:  # not laid out yet
            return
        self.parked = True
        await widget.remove_children()
        widget.styles.height = height

    async def unpark(self) -> None:
        if not self.parked:
            return
        self.parked = False
        widget: Widget = self  # type: ignore[assignment]
        widget.styles.height = None  # back to the stylesheet's height (auto)
        await self._rebuild()

    async def _rebuild(self) -> None:
        raise NotImplementedError


@dataclass
class ParkingPlan:
    """What one pass decided: `unpark` nearest first, at most `MAX_UNPARK` per pass."""

    park: list[Parkable]
    unpark: list[Parkable]
    near: list[Widget]  # not parked, within `park_beyond` rows: their parts may be parked too
    more: bool  # unparking left for a later pass


MAX_UNPARK = 2  # rebuilding is the expensive part: spread it over frames


def plan_parking(widgets: Iterable[Widget], view_top: int, view_bottom: int, unpark_within: int,
                 park_beyond: int) -> ParkingPlan:
    """Unpark the `Parkable` widgets less than `unpark_within` rows from the view (screen rows
    [view_top, view_bottom)), park those more than `park_beyond` rows away; the gap between
    the two keeps scrolling from parking and unparking the same widget. Regions are all read
    before anything changes (each change would make Textual lay out everything again)."""
    placed = [(widget, widget.region) for widget in widgets]
    park, unpark, near = [], [], []
    for widget, region in placed:
        distance = max(view_top - region.bottom, region.y - view_bottom, 0) if region else 0
        parkable = isinstance(widget, Parkable)
        if parkable and widget.parked and distance < unpark_within:
            unpark.append((distance, widget))
        elif parkable and not widget.parked and distance > park_beyond and widget.can_park:
            park.append(widget)
        elif distance <= park_beyond and not (parkable and widget.parked):
            near.append(widget)
    unpark.sort(key=lambda pair: pair[0])
    return ParkingPlan(park, [w for _, w in unpark[:MAX_UNPARK]], near, len(unpark) > MAX_UNPARK)
