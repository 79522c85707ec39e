"""Transcript entries: a user message (text + attachment chips) and an assistant reply.

An assistant reply streams into two Markdown widgets through `MarkdownStream`s: the model's
thinking, shown dimmed in a `ThinkingBlock` that folds as soon as the answer starts, and the
answer itself. `show_partial` is called once a frame with the reply so far and streams only what
was added; `finish` stops the streams and re-renders both once from the final text, which
re-syncs Markdown's block state. Clicking a code block copies it.
"""

from __future__ import annotations

from typing import Any, Mapping

from markdown_it import MarkdownIt
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownFence, MarkdownStream

from lampo.tui.attachment_chip import AttachmentChip, ChipInfo


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced / indented code blocks in `markdown`, in order."""
    return [t.content for t in MarkdownIt("gfm-like").parse(markdown) if t.type in ("fence", "code_block")]


def reply_footer(stats: Mapping[str, Any] | None) -> str:
    """One line under a finished reply, from its stored stats (llama.cpp field names)."""
    if not stats:
        return ""
    parts = [f"{stats.get('predicted_n', 0):,} tokens"]
    if stats.get("predicted_ms"):
        parts.append(f"{stats['predicted_n'] / stats['predicted_ms'] * 1000:,.1f} tok/s")
    if stats.get("prompt_ms"):
        parts.append(f"prefill {stats['prompt_n']:,} at {stats['prompt_n'] / stats['prompt_ms'] * 1000:,.0f} tok/s")
    if stats.get("ttft_ms"):
        parts.append(f"TTFT {stats['ttft_ms'] / 1000:.2f} s")
    if stats.get("draft_n"):
        parts.append(f"drafts {stats['draft_n_accepted'] / stats['draft_n']:.0%} accepted")
    reason = stats.get("reason", "")
    if reason and reason != "stop":
        parts.append({"cancelled": "stopped", "length": "max tokens reached",
                      "context": "context full"}.get(reason, reason))
    return " · ".join(parts)


class UserMessage(Vertical):
    def __init__(self, text: str, attachments: tuple[ChipInfo, ...] = ()):
        super().__init__(classes="message user-message")
        self.text = text
        self.attachments = attachments

    def compose(self) -> ComposeResult:
        if self.attachments:
            with Horizontal(classes="chips"):
                for chip in self.attachments:
                    yield AttachmentChip(chip, removable=False)
        yield Static(self.text, classes="user-text", markup=False)


class ThinkingBlock(Vertical):
    """The model's reasoning: a dimmed Markdown body under a clickable fold title."""

    folded: reactive[bool] = reactive(False)

    def __init__(self, reasoning: str, *, folded: bool):
        super().__init__(classes="thinking")
        self._initial = reasoning
        self.chars = len(reasoning)
        self.live = False
        self.set_reactive(ThinkingBlock.folded, folded)
        self.set_class(folded, "-folded")

    def compose(self) -> ComposeResult:
        yield Static(self._title(), classes="thinking-title", markup=False)
        yield Markdown(self._initial, classes="thinking-body")

    @property
    def body(self) -> Markdown:
        return self.query_one(".thinking-body", Markdown)

    def _title(self) -> str:
        arrow = "▶" if self.folded else "▼"
        return f"{arrow} {'thinking…' if self.live else 'thoughts'} ({self.chars:,} chars)"

    def refresh_title(self) -> None:
        self.query_one(".thinking-title", Static).update(self._title())

    def watch_folded(self, folded: bool) -> None:
        self.set_class(folded, "-folded")
        self.refresh_title()

    def on_click(self, event: events.Click) -> None:
        if event.widget is not None and "thinking-title" in event.widget.classes:
            self.folded = not self.folded


class AssistantMessage(Vertical):
    def __init__(self, reasoning: str = "", answer: str = "", footer: str = ""):
        super().__init__(classes="message assistant-message")
        self._footer = footer
        # The text handed to each Markdown view so far (a MarkdownStream applies it a moment later).
        self._given = {"reasoning": reasoning, "answer": answer}
        self._streams: dict[str, MarkdownStream] = {}

    def compose(self) -> ComposeResult:
        thinking = ThinkingBlock(self._given["reasoning"], folded=True)
        thinking.display = bool(self._given["reasoning"])
        yield thinking
        yield Markdown(self._given["answer"], classes="answer")
        yield Static(self._footer, classes="reply-footer", markup=False)

    @property
    def thinking(self) -> ThinkingBlock:
        return self.query_one(ThinkingBlock)

    @property
    def answer_view(self) -> Markdown:
        return self.query_one(".answer", Markdown)

    @property
    def answer(self) -> str:
        return self._given["answer"]

    @property
    def reasoning(self) -> str:
        return self._given["reasoning"]

    async def show_partial(self, reasoning: str, answer: str) -> None:
        """Show the reply so far: only the text added since the last call is streamed in; the
        thinking block opens live and folds when the answer starts."""
        thinking = self.thinking
        if reasoning != self.reasoning:
            if not thinking.display:
                thinking.display, thinking.live, thinking.folded = True, True, False
            await self._extend("reasoning", thinking.body, reasoning)
            thinking.chars = len(reasoning)
            thinking.refresh_title()
        if answer != self.answer:
            if thinking.live:
                thinking.live, thinking.folded = False, True
            await self._extend("answer", self.answer_view, answer)

    async def _extend(self, name: str, view: Markdown, text: str) -> None:
        given = self._given[name]
        self._given[name] = text
        if text.startswith(given):
            if name not in self._streams:
                self._streams[name] = Markdown.get_stream(view)
            await self._streams[name].write(text[len(given):])
            return
        # The text changed behind what is shown (e.g. a half-received "</think>" completed):
        # re-render that part once; the next call streams on from there.
        stream = self._streams.pop(name, None)
        if stream is not None:
            await stream.stop()
        await view.update(text)

    async def finish(self, reasoning: str, answer: str, footer: str) -> None:
        """Stop streaming and render the final text once."""
        for stream in self._streams.values():
            await stream.stop()
        self._streams.clear()
        self._given = {"reasoning": reasoning, "answer": answer}
        thinking = self.thinking
        thinking.live, thinking.chars = False, len(reasoning)
        thinking.display = bool(reasoning)
        await thinking.body.update(reasoning)
        await self.answer_view.update(answer)
        thinking.refresh_title()
        self.query_one(".reply-footer", Static).update(footer)

    def on_click(self, event: events.Click) -> None:
        if event.widget is None:
            return
        fence = next((w for w in event.widget.ancestors_with_self if isinstance(w, MarkdownFence)), None)
        if fence is not None:
            event.stop()
            self.app.copy_to_clipboard(fence.code)
            self.notify(f"Copied code block ({len(fence.code.splitlines())} lines)")
