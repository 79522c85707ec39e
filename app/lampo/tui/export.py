"""Export a chat to a Markdown file."""

from __future__ import annotations

from pathlib import Path

from lampo.chat_session import ChatSession


def export_chat(session: ChatSession, chat_id: int | None, export_dir: Path | None) -> Path:
    """Write the chat (default: the current one) as `lampo-<id>-<title>.md` into `export_dir`
    (default: the current directory) and return the path."""
    chat_id = session.chat_id if chat_id is None else chat_id
    title = session.title if chat_id == session.chat_id else session.store.get_chat(chat_id).title
    slug = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")[:40] or "chat"
    path = (export_dir or Path.cwd()) / f"lampo-{chat_id}-{slug}.md"
    path.write_text(session.export_markdown(chat_id), encoding="utf-8")
    return path
