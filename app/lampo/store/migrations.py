"""Numbered schema migrations, tracked with `PRAGMA user_version`.

`MIGRATIONS[i]` upgrades a database from version i to i+1. Append new steps; never edit old ones.
`migrate` is safe when several processes open the same (fresh or old) file at once: the steps run
in one `BEGIN IMMEDIATE` transaction that re-reads the version under the write lock, so the
processes that lose the race see the winner's schema and apply nothing.
"""

from __future__ import annotations

import sqlite3

MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1: chats, a message tree (parent_id) with the chat's active leaf in head_id,
    # attachments stored once by hash and linked to messages in order.
    """
    CREATE TABLE chats (
        id            INTEGER PRIMARY KEY,
        title         TEXT    NOT NULL,
        created       REAL    NOT NULL,
        updated       REAL    NOT NULL,
        system_prompt TEXT    NOT NULL DEFAULT '',
        sampling      TEXT    NOT NULL,            -- JSON of SamplingParams
        thinking      INTEGER NOT NULL DEFAULT 1,
        head_id       INTEGER                      -- last message of the active branch
    );
    CREATE TABLE messages (
        id        INTEGER PRIMARY KEY,
        chat_id   INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role      TEXT    NOT NULL CHECK (role IN ('user', 'assistant')),
        content   TEXT    NOT NULL,                -- typed text / answer (attachments separate)
        reasoning TEXT    NOT NULL DEFAULT '',
        stopped   INTEGER NOT NULL DEFAULT 0,      -- 1: generation was cancelled (partial reply)
        created   REAL    NOT NULL,
        stats     TEXT                             -- JSON: done reason + Stats fields
    );
    CREATE INDEX messages_by_chat ON messages(chat_id);
    CREATE TABLE attachments (
        sha256 TEXT PRIMARY KEY,
        name   TEXT    NOT NULL,
        text   TEXT    NOT NULL,
        tokens INTEGER NOT NULL
    );
    CREATE TABLE message_attachments (
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        position   INTEGER NOT NULL,
        sha256     TEXT    NOT NULL REFERENCES attachments(sha256),
        name       TEXT    NOT NULL,
        PRIMARY KEY (message_id, position)
    );
    """,
    # 1 -> 2: a reply is written while it streams; `complete` = 0 until its final write, so a
    # row still at 0 when read by anyone but its writer is a reply a crash (or kill) cut short.
    """
    ALTER TABLE messages ADD COLUMN complete INTEGER NOT NULL DEFAULT 1;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    """The database was written by a newer Lampo."""


def migrate(conn: sqlite3.Connection) -> int:
    """Bring `conn` (in autocommit mode) to SCHEMA_VERSION; returns the version it started at."""
    start = _version(conn)
    if start == SCHEMA_VERSION:
        return start  # the usual case: no write lock taken
    conn.execute("BEGIN IMMEDIATE")  # waits (busy timeout) for another migrating process
    try:
        start = _version(conn)  # re-read under the lock: another process may have migrated
        for version in range(start, SCHEMA_VERSION):
            for statement in _statements(MIGRATIONS[version]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return start


def _version(conn: sqlite3.Connection) -> int:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"database schema version {version} is newer than this Lampo's "
                           f"({SCHEMA_VERSION}); upgrade Lampo")
    return version


def _statements(script: str) -> list[str]:
    """The SQL statements of `script`, one each (`executescript` would commit the transaction)."""
    out, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):  # not a ";" inside a comment or string
            if pending.strip(" \n;"):
                out.append(pending)
            pending = ""
    if pending.strip(" \n;"):
        raise ValueError(f"incomplete SQL statement in a migration: {pending!r}")
    return out
