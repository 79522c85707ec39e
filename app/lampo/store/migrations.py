"""Numbered schema migrations, tracked with `PRAGMA user_version`.

`MIGRATIONS[i]` upgrades a database from version i to i+1. Append new steps; never edit old ones.
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
)

SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    """The database was written by a newer Lampo."""


def migrate(conn: sqlite3.Connection) -> int:
    """Bring `conn` to SCHEMA_VERSION; returns the version it started at."""
    start = conn.execute("PRAGMA user_version").fetchone()[0]
    if start > SCHEMA_VERSION:
        raise SchemaTooNew(f"database schema version {start} is newer than this Lampo's "
                           f"({SCHEMA_VERSION}); upgrade Lampo")
    for version in range(start, SCHEMA_VERSION):
        with conn:
            conn.executescript(f"BEGIN;\n{MIGRATIONS[version]}\nPRAGMA user_version = {version + 1};\nCOMMIT;")
    return start
