"""Transcript entries: a user message (text + attachment chips) and an assistant reply.

A live assistant reply streams into two `StreamingMarkdown` views (Textual Markdown fed through
`MarkdownStream`s): the model's thinking, shown dimmed in a `ThinkingBlock` that folds as soon as
the answer starts, and the answer itself. `show_partial` is called once a frame with the reply so
far and streams only what was added; `finish` renders the final text once, as a one-widget
`MarkdownView` - the form every stored reply takes. Clicking a code block of a live reply copies
it (any reply's blocks: the command palette).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from markdown_it import MarkdownIt
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Static
from textual.widgets.markdown import MarkdownFence

from lampo.engine.protocol import Stats
from lampo.stats_format import footer
from lampo.tui.attachment_chip import AttachmentChip, ChipInfo
from lampo.tui.markdown_view import MarkdownView
from lampo.tui.parking import Parkable
from lampo.tui.streaming_markdown import StreamingMarkdown


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced / indented code blocks in `markdown`, in order."""
    return [t.content for t in MarkdownIt("gfm-like").parse(markdown) if t.type in ("fence", "code_block")]


def reply_footer(stats: Mapping[str, Any] | None) -> str:
    """The stats line under a finished reply, from the stats stored with it."""
    if not stats:
        return ""
    return footer(Stats(**{f.name: stats[f.name] for f in fields(Stats) if f.name in stats}), stats.get("reason"))


class UserMessage(Vertical, Parkable):
    def __init__(self, text: str, attachments: tuple[ChipInfo, ...] = ()):
        super().__init__(classes="message user-message")
        self.text = text
        self.attachments = attachments

    async def _rebuild(self) -> None:
        await self.recompose()

    def compose(self) -> ComposeResult:
        if self.attachments:
            with Horizontal(classes="chips"):
                for chip in self.attachments:
                    yield AttachmentChip(chip, removable=False)
        yield Static(self.text, classes="user-text", markup=False)


class ThinkingBlock(Vertical):
    """The model's reasoning: a dimmed body under a clickable fold title. While the reply is
    live the body streams (`StreamingMarkdown`); otherwise it is a `MarkdownView`, built only
    when first unfolded (a folded block of a long reasoning costs no widgets)."""

    folded: reactive[bool] = reactive(False)

    def __init__(self, reasoning: str, *, folded: bool):
        super().__init__(classes="thinking")
        self.text = reasoning
        self.live = False
        self.set_reactive(ThinkingBlock.folded, folded)
        self.set_class(folded, "-folded")

    def compose(self) -> ComposeResult:
        yield Static(self._title(), classes="thinking-title", markup=False)
        if not self.folded:
            yield MarkdownView(self.text, classes="thinking-body")

    @property
    def body(self) -> StreamingMarkdown | MarkdownView | None:
        """The rendered reasoning; None until the block is first unfolded."""
        return next(iter(self.query_children(".thinking-body")), None)

    def _title(self) -> str:
        arrow = "▶" if self.folded else "▼"
        return f"{arrow} {'thinking…' if self.live else 'thoughts'} ({len(self.text):,} chars)"

    def refresh_title(self) -> None:
        self.query_one(".thinking-title", Static).update(self._title())

    async def open_live(self) -> None:
        """Show the block unfolded, streaming the reasoning of a live reply."""
        self.display, self.live = True, True
        self.set_reactive(ThinkingBlock.folded, False)
        self.set_class(False, "-folded")
        await self.query_children(".thinking-body").remove()
        await self.mount(StreamingMarkdown(self.text, classes="thinking-body"))
        self.refresh_title()

    async def show(self, text: str) -> None:
        """The reasoning so far, streamed into the live body."""
        self.text = text
        body = self.body
        if isinstance(body, StreamingMarkdown):
            await body.show(text)
        self.refresh_title()

    async def finish(self, text: str) -> None:
        """The final reasoning: a streamed body is replaced by its finished rendering."""
        self.text, self.live = text, False
        body = self.body
        if isinstance(body, StreamingMarkdown):
            await body.stop()
            await body.remove()
            if not self.folded:
                await self.mount(MarkdownView(text, classes="thinking-body"))
        self.refresh_title()

    def watch_folded(self, folded: bool) -> None:
        self.set_class(folded, "-folded")
        if not self.is_mounted:
            return
        self.refresh_title()
        if not folded and self.body is None:
            self.mount(MarkdownView(self.text, classes="thinking-body"))

    def on_click(self, event: events.Click) -> None:
        if event.widget is not None and "thinking-title" in event.widget.classes:
            self.folded = not self.folded


class AssistantMessage(Vertical, Parkable):
    """A reply. Live (`streaming`), its answer streams into a `StreamingMarkdown`; `finish`
    renders the final text once, as a `MarkdownView`, which is also how stored replies show."""

    def __init__(self, reasoning: str = "", answer: str = "", footer: str = "", *, streaming: bool = False):
        super().__init__(classes="message assistant-message")
        self.reasoning_text, self.answer_text, self.footer_text = reasoning, answer, footer
        self.streaming = streaming  # a live reply is never parked as a whole

    @property
    def can_park(self) -> bool:
        return not self.streaming

    async def _rebuild(self) -> None:
        await self.recompose()

    def parkable_parts(self) -> list[Parkable]:
        """The frozen Markdown segments of a long live reply, parkable one by one."""
        return [part for view in self.query(StreamingMarkdown) for part in view.frozen_segments]

    def compose(self) -> ComposeResult:
        thinking = ThinkingBlock(self.reasoning_text, folded=True)
        thinking.display = bool(self.reasoning_text)
        yield thinking
        if self.streaming:
            yield StreamingMarkdown(self.answer_text, classes="answer")
        else:
            yield MarkdownView(self.answer_text, classes="answer")
        yield Static(self.footer_text, classes="reply-footer", markup=False)

    @property
    def thinking(self) -> ThinkingBlock:
        return self.query_one(ThinkingBlock)

    @property
    def answer_view(self) -> StreamingMarkdown | MarkdownView:
        return self.query_one(".answer")

    @property
    def answer(self) -> str:
        """The answer text handed to the view so far."""
        return self.answer_text

    @property
    def reasoning(self) -> str:
        """The reasoning text handed to the view so far."""
        return self.reasoning_text

    async def show_partial(self, reasoning: str, answer: str) -> None:
        """Show the live reply so far (called once a frame): the thinking block opens while
        reasoning streams and folds when the answer starts."""
        thinking = self.thinking
        if reasoning != self.reasoning_text:
            if not thinking.display:
                await thinking.open_live()
            await thinking.show(reasoning)
            self.reasoning_text = reasoning
        if answer != self.answer_text:
            if thinking.live:
                thinking.live, thinking.folded = False, True
            await self.answer_view.show(answer)
            self.answer_text = answer

    async def finish(self, reasoning: str, answer: str, footer: str) -> None:
        """End of the reply: the final text, rendered once in full."""
        self.reasoning_text, self.answer_text, self.footer_text = reasoning, answer, footer
        self.streaming = False
        thinking = self.thinking
        thinking.display = bool(reasoning)
        await thinking.finish(reasoning)
        live = self.answer_view
        if isinstance(live, StreamingMarkdown):
            await live.stop()
        await self.mount(MarkdownView(answer, classes="answer"), after=live)
        await live.remove()
        self.query_one(".reply-footer", Static).update(footer)

    def on_click(self, event: events.Click) -> None:
        if event.widget is None:
            return
        fence = next((w for w in event.widget.ancestors_with_self if isinstance(w, MarkdownFence)), None)
        if fence is not None:
            event.stop()
            self.app.copy_to_clipboard(fence.code)
            self.notify(f"Copied code block ({len(fence.code.splitlines())} lines)")
