"""The chat store: SQLite (WAL) holding chats, their message tree and deduplicated attachments.

Every write commits at once, so a crash loses at most the reply being generated. Opening a file
that is not a usable database (not SQLite, or failing `PRAGMA quick_check`) moves it aside to
`<name>.corrupt-<timestamp>` (never deletes it), starts a fresh database and sets `notice` to
a sentence for the UI. One connection is shared by the UI thread and the generation worker,
serialised by a lock.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from lampo import paths
from lampo.attachments import Attachment
from lampo.models.sampling_params import SamplingParams
from lampo.store.migrations import migrate


@dataclass(frozen=True)
class ChatRecord:
    id: int
    title: str
    created: float
    updated: float
    system_prompt: str
    sampling: SamplingParams
    thinking: bool
    head_id: int | None


@dataclass(frozen=True)
class MessageRecord:
    id: int
    chat_id: int
    parent_id: int | None
    role: str  # "user" | "assistant"
    content: str  # typed text (user) or answer (assistant), without attachment text
    reasoning: str = ""
    stopped: bool = False
    created: float = 0.0
    stats: dict[str, Any] | None = None
    attachments: tuple[Attachment, ...] = field(default=())


_CHAT_COLUMNS = "id, title, created, updated, system_prompt, sampling, thinking, head_id"
_MESSAGE_COLUMNS = "id, chat_id, parent_id, role, content, reasoning, stopped, created, stats"
_CHAT_FIELDS = ("title", "system_prompt", "sampling", "thinking", "head_id")


class Store:
    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else paths.database_file()
        self.notice: str | None = None
        self._lock = threading.RLock()
        try:
            self._conn = self._connect_checked()
        except sqlite3.DatabaseError as e:
            moved = self._move_aside()
            self.notice = (f"The chat database {self.path} was damaged ({e}); it was moved to "
                           f"{moved.name} and a new one was started.")
            self._conn = self._connect_checked()

    def _connect_checked(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
            if verdict != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {verdict}")
            conn.execute("PRAGMA journal_mode = WAL")
            migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        self.path.rename(target)
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                side.rename(target.with_name(target.name + suffix))
        return target

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _write(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._conn.execute(sql, args)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    # ---- chats ------------------------------------------------------------------------------
    def create_chat(self, title: str, system_prompt: str, sampling: SamplingParams, thinking: bool) -> int:
        now = time.time()
        cur = self._write(
            "INSERT INTO chats (title, created, updated, system_prompt, sampling, thinking) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (title, now, now, system_prompt, json.dumps(sampling.to_dict()), int(thinking)))
        return cur.lastrowid

    def update_chat(self, chat_id: int, **changes: Any) -> None:
        """Change any of title, system_prompt, sampling, thinking, head_id; bumps `updated`."""
        unknown = set(changes) - set(_CHAT_FIELDS)
        if unknown:
            raise ValueError(f"unknown chat fields {sorted(unknown)}; known: {_CHAT_FIELDS}")
        values = {k: (json.dumps(v.to_dict()) if k == "sampling" else int(v) if k == "thinking" else v)
                  for k, v in changes.items()}
        values["updated"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in values)
        cur = self._write(f"UPDATE chats SET {sets} WHERE id = ?", (*values.values(), chat_id))
        if cur.rowcount != 1:
            raise KeyError(f"no chat with id {chat_id}")

    def get_chat(self, chat_id: int) -> ChatRecord:
        rows = self._read(f"SELECT {_CHAT_COLUMNS} FROM chats WHERE id = ?", (chat_id,))
        if not rows:
            raise KeyError(f"no chat with id {chat_id}")
        return _chat(rows[0])

    def list_chats(self) -> list[ChatRecord]:
        """Most recently updated first."""
        return [_chat(r) for r in self._read(f"SELECT {_CHAT_COLUMNS} FROM chats ORDER BY updated DESC, id DESC")]

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat, its messages, and attachments no other message uses."""
        with self._lock:
            cur = self._conn.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            if cur.rowcount != 1:
                raise KeyError(f"no chat with id {chat_id}")
            self._conn.execute("DELETE FROM attachments WHERE sha256 NOT IN "
                               "(SELECT sha256 FROM message_attachments)")

    # ---- messages ---------------------------------------------------------------------------
    def add_message(self, chat_id: int, parent_id: int | None, role: str, content: str, *,
                    reasoning: str = "", stopped: bool = False, stats: dict[str, Any] | None = None,
                    attachments: Iterable[Attachment] = ()) -> int:
        """Insert a message (and its attachments) and make it the chat's head."""
        with self._lock, self._conn:
            self._conn.execute("BEGIN")
            cur = self._conn.execute(
                f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?)",
                (chat_id, parent_id, role, content, reasoning, int(stopped), time.time(),
                 None if stats is None else json.dumps(stats)))
            message_id = cur.lastrowid
            for pos, a in enumerate(attachments):
                self._put_attachment(a)
                self._conn.execute("INSERT INTO message_attachments VALUES (?, ?, ?, ?)",
                                   (message_id, pos, a.sha256, a.name))
            self._conn.execute("UPDATE chats SET head_id = ?, updated = ? WHERE id = ?",
                               (message_id, time.time(), chat_id))
        return message_id

    def branch(self, chat_id: int, head_id: int | None) -> list[MessageRecord]:
        """The messages from the root to `head_id` (default: the chat's head), oldest first."""
        if head_id is None:
            head_id = self.get_chat(chat_id).head_id
        if head_id is None:
            return []
        rows = self._read(
            f"WITH RECURSIVE path(id, depth) AS (SELECT ?, 0 UNION ALL "
            f"SELECT m.parent_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.id "
            f"WHERE m.parent_id IS NOT NULL) "
            f"SELECT {', '.join('m.' + c for c in _MESSAGE_COLUMNS.split(', '))} "
            f"FROM path JOIN messages m ON m.id = path.id WHERE m.chat_id = ? ORDER BY path.depth DESC",
            (head_id, chat_id))
        return [self._message(r) for r in rows]

    def _message(self, row: tuple) -> MessageRecord:
        links = self._read(
            "SELECT ma.name, a.text, a.sha256, a.tokens FROM message_attachments ma "
            "JOIN attachments a ON a.sha256 = ma.sha256 WHERE ma.message_id = ? ORDER BY ma.position",
            (row[0],))
        return MessageRecord(*row[:6], stopped=bool(row[6]), created=row[7],
                             stats=None if row[8] is None else json.loads(row[8]),
                             attachments=tuple(Attachment(*link) for link in links))

    # ---- attachments ------------------------------------------------------------------------
    def put_attachment(self, attachment: Attachment) -> None:
        with self._lock:
            self._put_attachment(attachment)

    def _put_attachment(self, a: Attachment) -> None:
        self._conn.execute("INSERT OR IGNORE INTO attachments VALUES (?, ?, ?, ?)",
                           (a.sha256, a.name, a.text, a.tokens))

    def attachment_count(self) -> int:
        return self._read("SELECT COUNT(*) FROM attachments")[0][0]


def _chat(row: tuple) -> ChatRecord:
    sampling = SamplingParams(**json.loads(row[5]))
    return ChatRecord(row[0], row[1], row[2], row[3], row[4], sampling, bool(row[6]), row[7])
