"""The scrolling transcript, with a bounded window of mounted messages.

`Transcript` keeps every message record but mounts only a window of about `window` messages
(`render(record)` turns a record into a widget, so an unmounted message costs nothing but its
record). While it follows the bottom, appending beyond `window + page` unmounts the oldest
`page`. Scrolling near the top of what is mounted mounts earlier messages above, one per
refresh, scrolling down by what each added so the view does not move (`load_earlier`, also a
key); scrolling near the bottom after that mounts later ones again (`load_later`); each side
gives back far-away messages as the other grows. Of the mounted messages, those more than two
screens from the view are parked (see parking.py), and so are the far segments of a long
reply: what Textual re-arranges on every change stays a few screenfuls.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from lampo.tui.parking import plan_parking

Record = Any
LABELS = ("load-earlier", "load-later")


class Transcript(VerticalScroll):
    def __init__(self, render: Callable[[Record], Widget], *, window: int = 60, page: int = 20,
                 id: str | None = None):
        if page < 1 or window < page:
            raise ValueError(f"transcript needs window >= page >= 1 (got window={window}, page={page})")
        super().__init__(id=id)
        self._make_widget = render
        self.window, self.page = window, page
        self.records: list[Record] = []
        self._first = self._last = 0  # records[_first:_last] are mounted
        self._loading = False
        self._parking_due = False
        self._parked_at_y = 0.0  # scroll position of the last parking pass

    def compose(self):
        yield Static("", id="load-earlier", markup=False)
        yield Static("", id="load-later", markup=False)

    def on_mount(self) -> None:
        self.anchor()
        self._refresh_labels()

    @property
    def message_widgets(self) -> list[Widget]:
        return [w for w in self.children if w.id not in LABELS]

    @property
    def earlier_count(self) -> int:
        return self._first

    @property
    def later_count(self) -> int:
        return len(self.records) - self._last

    @property
    def following(self) -> bool:
        """Every message up to the newest mounted, and the view at the bottom or anchored there.
        The compositor keeps an anchored view at the bottom as content grows, so right after a
        mount, before the next layout pass has moved it, the view still follows; a scroll by the
        user releases the anchor (textual's `_anchor_released`: the version is pinned)."""
        anchored = self.is_anchored and not self._anchor_released
        return self._last == len(self.records) and (anchored or self.scroll_y >= self.max_scroll_y - 1)

    def _refresh_labels(self) -> None:
        earlier, later = self.query_one("#load-earlier", Static), self.query_one("#load-later", Static)
        earlier.display, later.display = self._first > 0, self.later_count > 0
        earlier.update(f"▲ {self._first:,} earlier messages: scroll up or press ctrl+pageup to load")
        later.update(f"▼ {self.later_count:,} later messages: scroll down to load")

    async def show(self, records: Sequence[Record]) -> None:
        """Replace everything with `records`, mounting the newest `window` of them."""
        with self.app.batch_update():
            await self.remove_children(self.message_widgets)
            self.records = list(records)
            self._last = len(self.records)
            self._first = max(0, self._last - self.window)
            await self.mount_all([self._make_widget(r) for r in self.records[self._first:]], before="#load-later")
            self._refresh_labels()
        self.anchor()
        self.park_later()

    async def update(self, records: Sequence[Record], live: Widget | None = None) -> None:
        """Show the conversation `records`, then `live` (the view of a reply being generated) if
        given. What is shown already and still matches is kept and adopts its new record; the
        rest is removed and the remaining records are appended. A live view shown where
        `records` now holds an assistant message is that reply finished: it is adopted as the
        message's view (the caller has finished it)."""
        keep = 0
        for shown, record in zip(self.records, records):
            if not (shown is None and live is None and record.role == "assistant" or _same_view(shown, record)):
                break
            keep += 1
        self.records[:keep] = records[:keep]
        if keep < len(self.records):
            await self._truncate(keep)
        for record in records[keep:]:
            await self._append(record)
        if live is not None:
            await self._append(None, live)

    async def _append(self, record: Record, widget: Widget | None = None) -> Widget:
        """Add a message at the bottom (`widget` if given, e.g. a live reply, else rendered)."""
        if self.later_count:  # scrolled far up: back to the newest messages first
            await self.show(self.records)
        follow = self.following
        self.records.append(record)
        self._last += 1  # before awaiting: a scroll meanwhile must not take it for unmounted
        widget = widget or self._make_widget(record)
        await self.mount(widget, before="#load-later")
        if follow and len(self.message_widgets) > self.window + self.page:
            await self.remove_children(self.message_widgets[: self.page])
            self._first += self.page
            self._refresh_labels()
        self.park_later()
        return widget

    async def _truncate(self, count: int) -> None:
        """Keep only the first `count` messages."""
        if count < self._first:
            await self.show(self.records[:count])
            return
        if count < self._last:
            await self.remove_children(self.message_widgets[count - self._first:])
        del self.records[count:]
        self._last = min(self._last, count)
        self._refresh_labels()

    async def load_earlier(self) -> int:
        """Mount up to `page` earlier messages above the first shown one; returns how many."""
        return await self._load(earlier=True)

    async def load_later(self) -> int:
        """Mount up to `page` later messages below the last shown one; returns how many."""
        return await self._load(earlier=False)

    async def _load(self, earlier: bool) -> int:
        """Mount messages one per refresh (no long stall); content added or removed above the
        view is compensated by scrolling, so what is on screen stays put."""
        if self._loading or not (self._first if earlier else self.later_count):
            return 0
        self._loading = True
        self.release_anchor()
        loaded = 0
        try:
            while loaded < self.page and (self._first if earlier else self.later_count):
                old_max = self.max_scroll_y
                if earlier:
                    self._first -= 1
                    await self.mount(self._make_widget(self.records[self._first]), after="#load-earlier")
                else:
                    self._last += 1
                    await self.mount(self._make_widget(self.records[self._last - 1]), before="#load-later")
                loaded += 1
                self._refresh_labels()
                await self._next_refresh()
                if earlier:  # added above the view
                    self.scroll_to(y=self.scroll_y + self.max_scroll_y - old_max, animate=False, immediate=True)
                await self._give_back(at_bottom=earlier)
            return loaded
        finally:
            self._loading = False
            self.call_after_refresh(self._load_if_near_an_end)

    async def _give_back(self, at_bottom: bool) -> None:
        """Past `window + page` mounted messages, unmount the one at the far end if parked."""
        widgets = self.message_widgets
        far_end = widgets[-1] if at_bottom else widgets[0]
        if len(widgets) <= self.window + self.page or not getattr(far_end, "parked", False):
            return
        old_max = self.max_scroll_y
        await far_end.remove()
        if at_bottom:
            self._last -= 1
        else:
            self._first += 1
        self._refresh_labels()
        await self._next_refresh()
        if not at_bottom:  # removed above the view
            self.scroll_to(y=self.scroll_y - (old_max - self.max_scroll_y), animate=False, immediate=True)

    async def _next_refresh(self) -> None:
        done = asyncio.get_running_loop().create_future()
        self.call_after_refresh(lambda: done.done() or done.set_result(None))
        await done

    def _load_if_near_an_end(self, direction: int = 0) -> None:
        """Load more before the view reaches the top or bottom of what is mounted (direction
        -1: only earlier, 1: only later, 0: either)."""
        height = self.size.height
        if direction <= 0 and self.scroll_y < height and self._first > 0:
            self.run_worker(self.load_earlier(), group="load")
        elif direction >= 0 and self.scroll_y > self.max_scroll_y - height and self.later_count:
            self.run_worker(self.load_later(), group="load")

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value != old_value and not self._loading:
            self._load_if_near_an_end(-1 if new_value < old_value else 1)
        if abs(new_value - self._parked_at_y) >= self.size.height / 2:
            self.park_later()  # the parking margins allow for half a screen of scrolling

    def on_resize(self) -> None:
        self.park_later()

    def park_later(self) -> None:
        """Re-park after the next refresh (once, however often it is asked for meanwhile)."""
        if not self._parking_due:
            self._parking_due = True
            self.call_after_refresh(self._park)

    async def _park(self) -> None:
        self._parking_due = False
        self._parked_at_y = self.scroll_y
        view = self.region
        near, far = view.height, 2 * view.height
        plan = plan_parking(self.message_widgets, view.y, view.bottom, near, far)
        # A long reply's segments, parked closer: the live reply changes every frame.
        parts = [part for message in plan.near for part in getattr(message, "parkable_parts", list)()]
        part_plan = plan_parking(parts, view.y, view.bottom, near // 2, near)
        with self.app.batch_update():  # one layout pass for all the changes
            for widget in plan.park + part_plan.park:
                await widget.park()
            for widget in plan.unpark + part_plan.unpark:
                await widget.unpark()
        if plan.more or part_plan.more:
            self.park_later()


def _same_view(shown: Record | None, record: Record) -> bool:
    """Whether the message shown as `shown` looks like `record` (a stored copy of what was shown,
    e.g. the message just sent, now with its database id)."""
    return shown is not None and all(getattr(shown, name) == getattr(record, name) for name in _VIEW_FIELDS)


_VIEW_FIELDS = ("role", "content", "reasoning", "attachments", "stopped", "interrupted", "stats")
