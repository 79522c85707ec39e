"""The chat store: SQLite (WAL) holding chats, their message tree and deduplicated attachments.

Every write is one transaction (`BEGIN IMMEDIATE`: another process's lock is waited out for
`busy_timeout` seconds) committed at once, so a crash loses nothing already written. A reply is
written while it streams - `add_message(..., complete=False)`, then `update_message` - and one
whose final write never came (a crash, a kill) reads back with `interrupted` set. How the file
is opened is opening.py's contract: damage is moved aside, a lock or an unusable file leaves
Lampo on an in-memory database (`persistent` False); `notice` is the sentence it left for the UI.
A failed read or write raises `StoreError`, an OSError naming the file and the cause. One
connection is shared by the UI thread and the generation worker, serialised by a lock.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from lampo import paths
from lampo.attachments import Attachment
from lampo.models.sampling_params import SamplingParams
from lampo.store.errors import StoreError, describe
from lampo.store.opening import NOT_SAVED, open_database, open_in_memory

BUSY_TIMEOUT_S = 10.0  # how long a read or write waits for another process's lock


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
    interrupted: bool = False  # a reply whose final write never came (Lampo was killed or crashed)


_CHAT_COLUMNS = "id, title, created, updated, system_prompt, sampling, thinking, head_id"
_MESSAGE_COLUMNS = "id, chat_id, parent_id, role, content, reasoning, stopped, created, stats, complete"
_CHAT_FIELDS = ("title", "system_prompt", "sampling", "thinking", "head_id")


class Store:
    def __init__(self, path: Path | str | None = None, *, busy_timeout: float = BUSY_TIMEOUT_S):
        self.busy_timeout = busy_timeout
        self._lock = threading.RLock()
        try:
            self.path: Path | None = Path(path) if path else paths.database_file()
        except paths.DirectoryError as e:
            self.path = None
            opened = open_in_memory(f"{NOT_SAVED} {e}.")
        else:
            opened = open_database(self.path, busy_timeout)
        self._conn, self.persistent, self.notice = opened.conn, opened.persistent, opened.notice

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _failure(self, error: sqlite3.Error, doing: str) -> StoreError:
        where = self.path if self.persistent else "(in memory)"
        return StoreError(f"could not {doing} the chat database {where}: {describe(error, self.busy_timeout)}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed at the end; any SQLite failure becomes StoreError."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                finally:
                    if self._conn.in_transaction:  # an error, or a COMMIT that failed
                        self._rollback()
            except sqlite3.ProgrammingError:
                raise
            except sqlite3.DatabaseError as e:
                raise self._failure(e, "save to") from e

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:  # SQLite already rolled back (e.g. after an I/O error)
            pass

    def _write(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._transaction() as conn:
            return conn.execute(sql, args)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._conn.execute(sql, args).fetchall()
            except sqlite3.ProgrammingError:
                raise
            except sqlite3.DatabaseError as e:
                raise self._failure(e, "read") from e

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
        with self._transaction() as conn:
            if conn.execute(f"UPDATE chats SET {sets} WHERE id = ?", (*values.values(), chat_id)).rowcount != 1:
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
        with self._transaction() as conn:
            if conn.execute("DELETE FROM chats WHERE id = ?", (chat_id,)).rowcount != 1:
                raise KeyError(f"no chat with id {chat_id}")
            conn.execute("DELETE FROM attachments WHERE sha256 NOT IN (SELECT sha256 FROM message_attachments)")

    # ---- messages ---------------------------------------------------------------------------
    def add_message(self, chat_id: int, parent_id: int | None, role: str, content: str, *,
                    reasoning: str = "", stopped: bool = False, stats: dict[str, Any] | None = None,
                    attachments: Iterable[Attachment] = (), complete: bool = True) -> int:
        """Insert a message (and its attachments) and make it the chat's head. `complete=False`:
        a reply that is still streaming (`update_message` brings the rest)."""
        with self._transaction() as conn:
            cur = conn.execute(
                f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (chat_id, parent_id, role, content, reasoning, int(stopped), time.time(), _json(stats),
                 int(complete)))
            message_id = cur.lastrowid
            for pos, a in enumerate(attachments):
                self._put_attachment(a)
                conn.execute("INSERT INTO message_attachments VALUES (?, ?, ?, ?)", (message_id, pos, a.sha256, a.name))
            conn.execute("UPDATE chats SET head_id = ?, updated = ? WHERE id = ?", (message_id, time.time(), chat_id))
        return message_id

    def update_message(self, message_id: int, content: str, *, reasoning: str = "", stopped: bool = False,
                       stats: dict[str, Any] | None = None, complete: bool = True) -> None:
        """Rewrite a message's text and state (a streaming reply as it grows, then its final form)."""
        with self._transaction() as conn:
            cur = conn.execute(
                "UPDATE messages SET content = ?, reasoning = ?, stopped = ?, stats = ?, complete = ? WHERE id = ?",
                (content, reasoning, int(stopped), _json(stats), int(complete), message_id))
            if cur.rowcount != 1:
                raise KeyError(f"no message with id {message_id}")

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
                             attachments=tuple(Attachment(*link) for link in links), interrupted=not row[9])

    # ---- attachments ------------------------------------------------------------------------
    def put_attachment(self, attachment: Attachment) -> None:
        with self._transaction():
            self._put_attachment(attachment)

    def _put_attachment(self, a: Attachment) -> None:
        self._conn.execute("INSERT OR IGNORE INTO attachments VALUES (?, ?, ?, ?)",
                           (a.sha256, a.name, a.text, a.tokens))

    def attachment_count(self) -> int:
        return self._read("SELECT COUNT(*) FROM attachments")[0][0]


def _json(stats: dict[str, Any] | None) -> str | None:
    return None if stats is None else json.dumps(stats)


def _chat(row: tuple) -> ChatRecord:
    sampling = SamplingParams(**json.loads(row[5]))
    return ChatRecord(row[0], row[1], row[2], row[3], row[4], sampling, bool(row[6]), row[7])
