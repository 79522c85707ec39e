"""The scrolling transcript, with a bounded window of mounted messages.

`Transcript` keeps every message record but mounts at most about `window` message widgets:
while it follows the bottom, appending beyond `window + page` unmounts the oldest `page`;
scrolling to the top (or `load_earlier`) mounts the previous `page` above, keeping what is on
screen in place. Records are whatever the app stores; `render(record)` turns one into a widget,
so an unmounted message costs nothing but its record. Of the mounted messages, those more than
half a screen away from the view are parked (see parking.py), and so are the off-screen
segments of a long reply: what Textual re-arranges on every change stays about one screenful.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from lampo.tui.parking import plan_parking

Record = Any


class Transcript(VerticalScroll):
    def __init__(self, render: Callable[[Record], Widget], *, window: int = 60, page: int = 20,
                 id: str | None = None):
        if page < 1 or window < page:
            raise ValueError(f"transcript needs window >= page >= 1 (got window={window}, page={page})")
        super().__init__(id=id)
        self._make_widget = render
        self.window, self.page = window, page
        self.records: list[Record] = []
        self._first = 0  # index in `records` of the first mounted message
        self._loading = False
        self._parking_due = False
        self._parked_at_y = 0.0  # scroll position of the last parking pass

    def compose(self):
        yield Static("", id="load-earlier", markup=False)

    def on_mount(self) -> None:
        self.anchor()
        self._refresh_earlier_label()

    @property
    def message_widgets(self) -> list[Widget]:
        return [w for w in self.children if w.id != "load-earlier"]

    @property
    def earlier_count(self) -> int:
        return self._first

    @property
    def following(self) -> bool:
        return self.scroll_y >= self.max_scroll_y - 1

    def _refresh_earlier_label(self) -> None:
        label = self.query_one("#load-earlier", Static)
        label.display = self._first > 0
        label.update(f"▲ {self._first:,} earlier messages: scroll up or press ctrl+pageup to load")

    async def show(self, records: Sequence[Record]) -> None:
        """Replace everything with `records`, mounting the newest `window` of them."""
        with self.app.batch_update():
            await self.remove_children(self.message_widgets)
            self.records = list(records)
            self._first = max(0, len(self.records) - self.window)
            await self.mount_all([self._make_widget(r) for r in self.records[self._first:]])
            self._refresh_earlier_label()
        self.anchor()
        self.park_later()

    async def append(self, record: Record, widget: Widget | None = None) -> Widget:
        """Add a message at the bottom (`widget` if given, e.g. a live reply, else rendered)."""
        follow = self.following
        self.records.append(record)
        widget = widget or self._make_widget(record)
        await self.mount(widget)
        if follow and len(self.message_widgets) > self.window + self.page:
            await self.remove_children(self.message_widgets[: self.page])
            self._first += self.page
            self._refresh_earlier_label()
        self.park_later()
        return widget

    async def truncate(self, count: int) -> None:
        """Keep only the first `count` messages."""
        if count < self._first:
            await self.show(self.records[:count])
            return
        await self.remove_children(self.message_widgets[count - self._first:])
        del self.records[count:]

    async def sync(self, records: Sequence[Record]) -> None:
        """Adopt `records` as the stored form of what is shown (e.g. a finished live reply);
        messages beyond them are removed. The shown messages must already match."""
        if len(records) < len(self.records):
            await self.truncate(len(records))
        if len(records) != len(self.records):
            raise ValueError(f"transcript shows {len(self.records)} messages, cannot adopt {len(records)}")
        self.records = list(records)

    async def load_earlier(self) -> int:
        """Mount up to `page` earlier messages above the first shown one, one per refresh (no
        long stall), each time scrolling down by what it added so the view does not move;
        returns how many."""
        if self._first == 0 or self._loading:
            return 0
        self._loading = True
        self.release_anchor()
        try:
            start, first = max(0, self._first - self.page), self._first
            for record in reversed(self.records[start:first]):
                old_max = self.max_scroll_y
                await self.mount(self._make_widget(record), after="#load-earlier")
                self._first -= 1
                self._refresh_earlier_label()
                await self._next_refresh()
                self.scroll_to(y=self.scroll_y + self.max_scroll_y - old_max, animate=False, immediate=True)
            return first - start
        finally:
            self._loading = False

    async def _next_refresh(self) -> None:
        done = asyncio.get_running_loop().create_future()
        self.call_after_refresh(lambda: done.done() or done.set_result(None))
        await done

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value < old_value and new_value < self.size.height and self._first > 0:
            self.run_worker(self.load_earlier(), group="load-earlier")  # prefetch before the top
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
        parts = [part for message in plan.near for part in getattr(message, "parkable_parts", list)()]
        part_plan = plan_parking(parts, view.y, view.bottom, near, far)  # a long reply's segments
        for widget in plan.park + part_plan.park:
            await widget.park()
        for widget in plan.unpark + part_plan.unpark:
            await widget.unpark()
        if plan.more or part_plan.more:
            self.park_later()
