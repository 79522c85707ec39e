"""Command palette entries (ctrl+p) for every Lampo action, plus one per code block of the
last reply. Each entry runs the same app action as its key binding."""

from __future__ import annotations

from functools import partial
from typing import Iterator

from textual.command import DiscoveryHit, Hit, Hits, Provider

from lampo.tui.message_view import code_blocks

# (title, action, help)
ACTIONS: tuple[tuple[str, str, str], ...] = (
    ("Stop generating", "stop", "Stop the reply being generated; the partial reply is kept"),
    ("Regenerate last reply", "regenerate", "Generate a new reply to your last message (the old one stays as a branch)"),
    ("Edit last message", "edit_last", "Put your last message back in the editor, to change and resend it"),
    ("New chat", "new_chat", "Start an empty chat"),
    ("Chats…", "chats", "List saved chats: resume, rename, delete, export"),
    ("Toggle thinking", "toggle_thinking", "Let the model think before answering, or not (this chat)"),
    ("Settings…", "settings", "Sampling (temperature, top-p, top-k, min-p, presence penalty, max tokens), system prompt, theme"),
    ("Copy last reply", "copy_last", "Copy the last reply to the clipboard"),
    ("Attach file…", "attach", "Attach a text file to the next message (/attach FILE)"),
    ("Export chat to Markdown", "export", "Write this chat to a .md file"),
    ("Toggle HUD", "toggle_hud", "Show or hide the performance HUD"),
    ("Load earlier messages", "load_earlier", "Show older messages of a long chat"),
    ("Theme: dark", "set_lampo_theme('dark')", "Switch to the dark theme (saved in the settings)"),
    ("Theme: light", "set_lampo_theme('light')", "Switch to the light theme (saved in the settings)"),
)


class LampoCommands(Provider):
    def _entries(self) -> Iterator[tuple[str, str, str]]:
        yield from ACTIONS
        reply = self.app.last_reply()
        for i, code in enumerate(code_blocks(reply.content) if reply else []):
            first = code.strip().splitlines()[0][:40] if code.strip() else ""
            yield (f"Copy code block {i + 1}: {first}", f"copy_code({i})", "Copy this code block of the last reply")

    async def discover(self) -> Hits:
        for title, action, help_text in self._entries():
            yield DiscoveryHit(title, partial(self.app.run_action, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, action, help_text in self._entries():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self.app.run_action, action), help=help_text)
