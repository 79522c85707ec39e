"""Finished Markdown as one widget: Rich's Markdown renderer, coloured from the app's theme.

Textual's Markdown widget mounts a widget per block (and per list item, fence, label...), and
Textual lays out every mounted widget on each change, so a chat made of such messages makes
every mount, load and scroll slower. Text that no longer changes - a finished reply, its
reasoning - is shown by `MarkdownView`: a single Static rendering Rich's Markdown (headings,
lists, quotes, tables, syntax-highlighted code) with Rich styles derived from the current
Textual theme, so it reads like the live view it replaces. Live text streams through
`StreamingMarkdown` (Textual's MarkdownStream) until the reply ends.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import Markdown as RichMarkdown
from rich.segment import Segment
from rich.theme import Theme as RichTheme
from textual.theme import Theme
from textual.widgets import Static

CODE_THEMES = {True: "github-dark", False: "solarized-light"}  # pygments styles by theme darkness


def rich_markdown_theme(theme: Theme) -> RichTheme:
    """Rich's `markdown.*` styles in the colours of a Textual theme."""
    primary, secondary = theme.primary, theme.secondary or theme.primary
    accent, warning = theme.accent or primary, theme.warning or primary
    panel = theme.panel or theme.surface or "default"
    return RichTheme({
        "markdown.h1": f"bold {primary}", "markdown.h1.border": primary,
        "markdown.h2": f"bold underline {primary}", "markdown.h3": f"bold {primary}",
        "markdown.h4": f"bold italic {primary}", "markdown.h5": "bold", "markdown.h6": "italic",
        "markdown.code": f"{warning} on {panel}", "markdown.code_block": f"on {panel}",
        "markdown.item.bullet": accent, "markdown.item.number": accent,
        "markdown.block_quote": f"italic {secondary}", "markdown.link": f"underline {secondary}",
        "markdown.link_url": secondary, "markdown.hr": accent, "markdown.strong": "bold",
        "markdown.em": "italic", "markdown.s": "strike",
    })


class ThemedMarkdown:
    """A Rich renderable: Markdown rendered with a given Rich theme pushed on the console."""

    def __init__(self, text: str, theme: RichTheme, code_theme: str):
        self.text, self.theme, self.code_theme = text, theme, code_theme

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        console.push_theme(self.theme)
        try:
            lines = console.render_lines(RichMarkdown(self.text, code_theme=self.code_theme), options, pad=False)
        finally:
            console.pop_theme()
        for line in lines:
            yield from line
            yield Segment.line()


class MarkdownView(Static):
    """Markdown that does not change, in one widget; re-coloured when the app theme changes."""

    DEFAULT_CSS = "MarkdownView { height: auto; padding: 0 1; }"

    def __init__(self, text: str, *, classes: str | None = None):
        super().__init__(classes=classes)
        self.text = text

    def on_mount(self) -> None:
        self._render_text(self.app.current_theme)
        # Not `watch(app, "theme")`: the app would keep every view ever mounted (and all it
        # rendered) until the theme next changes. A subscription ends with the view.
        self.app.theme_changed_signal.subscribe(self, self._render_text)

    def on_unmount(self) -> None:
        self.app.theme_changed_signal.unsubscribe(self)

    def _render_text(self, theme: Theme) -> None:
        self.update(ThemedMarkdown(self.text, rich_markdown_theme(theme), CODE_THEMES[theme.dark]))
