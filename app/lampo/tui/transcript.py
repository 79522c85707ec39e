"""The scrolling transcript, with a bounded window of mounted messages.

`Transcript` keeps every message record but mounts at most about `window` message widgets:
while it follows the bottom, appending beyond `window + page` unmounts the oldest `page`;
scrolling to the top (or `load_earlier`) mounts the previous `page` above, keeping what is on
screen in place. Records are whatever the app stores; `render(record)` turns one into a widget,
so an unmounted message costs nothing but its record.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

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
        """Mount up to `page` earlier messages above the first shown one; returns how many."""
        if self._first == 0 or self._loading:
            return 0
        self._loading = True
        try:
            start = max(0, self._first - self.page)
            widgets = [self._make_widget(r) for r in self.records[start:self._first]]
            old_y, old_max = self.scroll_y, self.max_scroll_y
            await self.mount_all(widgets, after="#load-earlier")
            self._first = start
            self._refresh_earlier_label()
            self.release_anchor()
            # Content grew above the view: once laid out, scroll down by as much.
            self.call_after_refresh(
                lambda: self.scroll_to(y=old_y + self.max_scroll_y - old_max, animate=False, immediate=True)
            )
            return len(widgets)
        finally:
            self._loading = False

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value <= 0 < old_value and self._first > 0:
            self.run_worker(self.load_earlier(), group="load-earlier", exclusive=True)
