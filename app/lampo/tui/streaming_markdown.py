"""Markdown that grows while a reply streams, in segments so that each frame costs the same.

Textual's `Markdown.append` re-parses only the last top-level block, but every block is a widget
and each change re-arranges all blocks of that Markdown widget: a long reply (thousands of
blocks) would make every frame slower than the last. So the text streams (through a
`MarkdownStream`) into a *tail* Markdown widget that is frozen - never touched again, and free
to be parked while off-screen - and replaced by a fresh tail once it holds `segment_blocks`
top-level blocks:
- at a natural boundary (the tail ends with a finished paragraph, heading or rule and a blank
  line), as it is: no block is rendered twice;
- if no boundary comes before `2 * segment_blocks` blocks (a long list, a burst of text from a
  slow frame), everything but the last block is re-rendered in full as segments of
  `segment_blocks` blocks and the last block starts the new tail.
Top-level blocks render independently, so the segmentation does not change what is shown.
`finish(text)` stops the stream and renders the tail once in full, which re-syncs Markdown's
block state.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream

from lampo.tui.parking import Parkable

SEGMENT_BLOCKS = 8
RENDERED_BEHIND = 2  # segments of a burst rendered at once above the tail; the rest born parked


class MarkdownSegment(Markdown, Parkable):
    """One segment. Frozen segments may be parked while far off-screen; a frozen segment can
    also be created parked, with an estimated height, so a burst of text far from the view
    mounts no blocks at all."""

    def __init__(self, text: str, *, frozen: bool = False, parked_height: int | None = None):
        super().__init__("" if parked_height else text, classes="md-segment")
        self.text, self.frozen = text, frozen
        if parked_height:
            self.parked = True
            self.styles.height = parked_height

    @property
    def can_park(self) -> bool:
        return self.frozen

    async def _rebuild(self) -> None:
        await self.update(self.text)


def estimate_height(markdown: str, width: int) -> int:
    """Rows `markdown` takes at `width` columns, roughly (wrapped source lines): the height a
    segment born parked reserves until it is rendered."""
    return sum(max(1, -(-len(line) // width)) for line in markdown.splitlines()) + 1


CLOSED_AT_BLANK_LINE = ("paragraph_open", "heading_open", "hr")  # blocks a blank line ends


def top_level_blocks(markdown: str) -> list[tuple[int, str]]:
    """(first line, token type) of each top-level block of `markdown`."""
    return [(t.map[0], t.type) for t in MarkdownIt("gfm-like").parse(markdown) if t.level == 0 and t.map is not None]


class StreamingMarkdown(Vertical):
    DEFAULT_CSS = "StreamingMarkdown { height: auto; }"

    def __init__(self, text: str = "", *, segment_blocks: int = SEGMENT_BLOCKS, classes: str | None = None):
        if segment_blocks < 2:
            raise ValueError(f"segment_blocks must be >= 2 (got {segment_blocks})")
        super().__init__(classes=classes)
        self.segment_blocks = segment_blocks
        self._frozen = ""  # text of the frozen segments
        self._tail = text  # text handed to the tail widget (its stream applies it a moment later)
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield MarkdownSegment(self._tail)

    @property
    def source(self) -> str:
        """All the text handed over so far."""
        return self._frozen + self._tail

    @property
    def segments(self) -> list[MarkdownSegment]:
        return list(self.query_children(MarkdownSegment))

    @property
    def frozen_segments(self) -> list[MarkdownSegment]:
        return self.segments[:-1]

    async def show(self, text: str) -> None:
        """Show `text`, the whole text so far: what extends the shown text is streamed in."""
        if text == self.source:
            return
        if not text.startswith(self.source):  # e.g. a half-received "</think>" completed
            await self._render_anew(text)
            return
        delta = text[len(self.source):]
        tail = self._tail + delta
        blocks = top_level_blocks(tail)
        if len(blocks) > 2 * self.segment_blocks:
            await self._split(tail, [line for line, _ in blocks])
            return
        self._tail = tail
        if self._stream is None:
            self._stream = Markdown.get_stream(self.segments[-1])
        await self._stream.write(delta)
        if len(blocks) >= self.segment_blocks and blocks[-1][1] in CLOSED_AT_BLANK_LINE and tail.endswith("\n\n"):
            await self._stop_stream()
            segment = self.segments[-1]
            segment.text, segment.frozen = tail, True
            self._frozen, self._tail = self._frozen + tail, ""
            await self.mount(MarkdownSegment(""))

    async def finish(self, text: str) -> None:
        """Stop streaming and show exactly `text`, the tail rendered once in full (text that
        arrived since the last frame is segmented first, like any burst)."""
        if text.startswith(self.source):
            await self.show(text)
        await self._render_anew(text)

    async def _split(self, tail: str, starts: list[int]) -> None:
        """Freeze all of `tail` but its last block, as segments of `segment_blocks` blocks (the
        current tail widget takes the first, rendered once in full; all but the last
        `RENDERED_BEHIND` of the others are born parked); the last block starts a new tail."""
        lines = tail.splitlines(keepends=True)
        last = len(starts) - 1
        bounds = [0, *(starts[i] for i in range(self.segment_blocks, last, self.segment_blocks)), starts[last]]
        first, *more = ("".join(lines[a:b]) for a, b in zip(bounds, bounds[1:]))
        rest = "".join(lines[starts[last]:])
        await self._stop_stream()
        current = self.segments[-1]
        current.text, current.frozen = first, True
        await current.update(first)
        width = max(20, self.size.width - 2)
        born = [MarkdownSegment(part, frozen=True,
                                parked_height=estimate_height(part, width) if i < len(more) - RENDERED_BEHIND else None)
                for i, part in enumerate(more)]
        await self.mount_all([*born, MarkdownSegment(rest)])
        self._frozen, self._tail = self._frozen + "".join(lines[: starts[last]]), rest

    async def stop(self) -> None:
        """Stop streaming (before this view is replaced by the finished rendering)."""
        await self._stop_stream()

    async def _stop_stream(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    async def _render_anew(self, text: str) -> None:
        """Render the tail (or everything, if the frozen part changed too) once in full."""
        await self._stop_stream()
        if not text.startswith(self._frozen):
            await self.remove_children(self.frozen_segments)
            self._frozen = ""
        self._tail = text[len(self._frozen):]
        tail = self.segments[-1]
        tail.text = self._tail
        await tail.update(self._tail)
