"""The multi-line prompt editor.

Enter sends (`Submitted`); shift+enter or ctrl+j inserts a newline (shift+enter needs a terminal
that reports it, e.g. with the Kitty keyboard protocol; ctrl+j works everywhere and stays bound
whatever the user maps "send" and "newline" to). Up on the top
row / down on the bottom row, or ctrl+up / ctrl+down anywhere, walk the history of sent messages;
the draft being typed comes back when walking past the newest entry. A paste of at least
`paste_threshold` characters (0: never) is not inserted: it becomes a `LongPaste` for the app to
turn into an attachment chip. Pasted text is cleaned first (`clean_paste`: no control character
reaches the editor or the screen). Every binding has an id, so a user keymap can change its keys.

Keys that arrive in one terminal read (a fast typist over SSH, `tmux send-keys "hi" Enter`) are
all queued at once, and the App runs a priority binding (send, newline) as soon as it receives
that key, while the keys before it still wait in this widget's queue: so both actions run from
this widget's queue (`call_later`), after those keys are in the text; and the app takes only the
sent text out of the editor (`take_sent`), not keys typed after the Enter.
"""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from lampo.tui.pasted_text import clean_paste


class PromptInput(TextArea):
    BINDINGS = [
        Binding("enter", "submit", "Send", id="send", priority=True),
        Binding("shift+enter", "newline", "Newline", id="newline", priority=True),
        # ctrl+j inserts a newline in every terminal, whatever key "newline" is mapped to.
        Binding("ctrl+j", "newline", "Newline", id="newline_ctrl_j", priority=True, show=False),
        Binding("ctrl+up", "history(-1)", "Previous message", id="history_prev", show=False),
        Binding("ctrl+down", "history(1)", "Next message", id="history_next", show=False),
    ]

    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    class LongPaste(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def __init__(self, *, paste_threshold: int = 2500, id: str | None = None):
        if paste_threshold < 0:
            raise ValueError(f"paste threshold must be >= 0 characters (got {paste_threshold})")
        super().__init__(
            id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus", compact=True,
            placeholder="Message (Enter sends, ctrl+j newline, ctrl+p commands, /attach FILE)",
        )
        self.paste_threshold = paste_threshold
        self.sent_history: list[str] = []
        self._history_pos: int | None = None  # index into history while walking it
        self._draft = ""

    def action_submit(self) -> None:
        self.call_later(self._submit)

    def _submit(self) -> None:
        self.post_message(self.Submitted(self.text))

    def action_newline(self) -> None:
        self.call_later(self.insert, "\n")

    def take_sent(self, text: str) -> None:
        """Take `text`, the message just sent, out of the editor. Keys that arrived after its
        Enter in the same read are in the editor by now, behind it: they stay."""
        if self.text.startswith(text):
            self.delete((0, 0), self.document.get_location_from_index(len(text)))

    def remember(self, text: str) -> None:
        """Add a sent message to the history (consecutive duplicates kept once)."""
        if text.strip() and (not self.sent_history or self.sent_history[-1] != text):
            self.sent_history.append(text)
        self._history_pos = None

    def action_history(self, step: int) -> None:
        if not self.sent_history:
            return
        if self._history_pos is None:
            if step > 0:
                return
            self._draft, self._history_pos = self.text, len(self.sent_history)
        pos = self._history_pos + step
        if pos < 0:
            return
        if pos >= len(self.sent_history):
            self._history_pos = None
            self._show(self._draft)
            return
        self._history_pos = pos
        self._show(self.sent_history[pos])

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def _visual_row(self) -> int:
        return self.wrapped_document.location_to_offset(self.cursor_location).y

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self._visual_row() == 0 and self.sent_history:
            self.action_history(-1)
        else:
            super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        at_bottom = self._visual_row() >= self.wrapped_document.height - 1
        if not select and at_bottom and self._history_pos is not None:
            self.action_history(1)
        else:
            super().action_cursor_down(select)

    async def _on_paste(self, event: events.Paste) -> None:
        event.text = clean_paste(event.text)  # TextArea's own handler, which runs next, inserts it
        if self.paste_threshold and len(event.text) >= self.paste_threshold:
            event.prevent_default()
            event.stop()
            self.post_message(self.LongPaste(event.text))
