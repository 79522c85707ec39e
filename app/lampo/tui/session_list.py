"""The chats screen: saved chats, most recent first; resume, rename, delete, export.

Enter resumes the highlighted chat (the screen dismisses with its id), `r` renames it in place,
`d` twice deletes it, `e` exports it to Markdown, Esc goes back (dismisses with None). Ages
("3 h ago") are computed from the injectable `wall_clock`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from lampo.chat_session import ChatSession
from lampo.store import ChatRecord
from lampo.tui.export import export_chat

TITLE_CELLS = 50


def age(seconds: float) -> str:
    """A short relative age: `just now`, `5 min ago`, `3 h ago`, `2 days ago`."""
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    days = int(seconds // 86400)
    return f"{days} day{'s' if days > 1 else ''} ago"


class SessionListScreen(ModalScreen[int | None]):
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("e", "export", "Export"),
    ]

    def __init__(self, session: ChatSession, wall_clock: Callable[[], float], export_dir: Path | None):
        super().__init__()
        self.session, self.wall_clock, self.export_dir = session, wall_clock, export_dir
        self.chats: list[ChatRecord] = []
        self._delete_armed: int | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("Chats", classes="dialog-title")
            yield OptionList(id="chat-list")
            yield Input(id="rename", placeholder="New title, Enter to apply, Esc to cancel")
            yield Static("Enter resume · r rename · d delete · e export to Markdown · Esc back",
                         classes="session-hint", id="session-hint", markup=False)

    def on_mount(self) -> None:
        self.query_one("#rename", Input).display = False
        self._reload()

    def _reload(self, keep: int | None = None) -> None:
        """Re-read the list; highlight row `keep` (clamped), else the first. A store that cannot
        be read shows an empty list and says why."""
        try:
            self.chats = self.session.list_chats()
        except OSError as e:  # StoreError: the database could not be read
            self.chats = []
            self._hint(f"⚠ {e}")
        options = self.query_one("#chat-list", OptionList)
        options.clear_options()
        now = self.wall_clock()
        for chat in self.chats:
            current = " ●" if chat.id == self.session.chat_id else ""
            title = chat.title if len(chat.title) <= TITLE_CELLS else chat.title[: TITLE_CELLS - 1] + "…"
            options.add_option(Option(
                Content.from_markup("$title[$accent]$current[/]", title=f"{title:<{TITLE_CELLS}}", current=current)
                + Content.from_markup("  [$text-muted]$age", age=age(now - chat.updated)),
                id=str(chat.id),
            ))
        if not self.chats:
            options.add_option(Option("No saved chats yet.", disabled=True))
        else:
            options.highlighted = min(keep or 0, len(self.chats) - 1)
        options.focus()

    def _highlighted(self) -> ChatRecord | None:
        index = self.query_one("#chat-list", OptionList).highlighted
        return self.chats[index] if index is not None and index < len(self.chats) else None

    def _hint(self, text: str) -> None:
        self.query_one("#session-hint", Static).update(text)

    @on(OptionList.OptionSelected, "#chat-list")
    def _resume(self, message: OptionList.OptionSelected) -> None:
        if message.option.id is not None:
            self.dismiss(int(message.option.id))

    def action_back(self) -> None:
        rename = self.query_one("#rename", Input)
        if rename.display:
            rename.display = False
            self.query_one("#chat-list", OptionList).focus()
        else:
            self.dismiss(None)

    def action_rename(self) -> None:
        chat = self._highlighted()
        if chat is None:
            return
        rename = self.query_one("#rename", Input)
        rename.value, rename.display = chat.title, True
        rename.focus()

    @on(Input.Submitted, "#rename")
    def _renamed(self, message: Input.Submitted) -> None:
        chat = self._highlighted()
        if chat is None:
            return
        try:
            self.session.rename(message.value, chat.id)
        except (ValueError, KeyError, OSError) as e:  # empty title, deleted elsewhere, store failure
            self._hint(f"⚠ {e}")
            return
        message.input.display = False
        self._reload()  # renaming makes it the most recently updated chat: first

    def action_delete(self) -> None:
        chat, index = self._highlighted(), self.query_one("#chat-list", OptionList).highlighted
        if chat is None:
            return
        if self._delete_armed != chat.id:
            self._delete_armed = chat.id
            self._hint(f"Press d again to delete “{chat.title}” for good.")
            return
        self._delete_armed = None
        try:
            self.session.delete(chat.id)
        except (KeyError, OSError) as e:  # deleted by another Lampo; the store failed
            self._hint(f"⚠ {e}")
            return
        self._hint(f"Deleted “{chat.title}”.")
        self._reload(keep=index)

    def action_export(self) -> None:
        chat = self._highlighted()
        if chat is None:
            return
        try:
            path = export_chat(self.session, chat.id, self.export_dir)
        except (KeyError, OSError) as e:  # the chat or the export folder cannot be read / written
            self._hint(f"⚠ {e}")
        else:
            self._hint(f"Exported to {path}")
