"""Opening the chat database so that only real damage is set aside and nothing stops the chat.

`open_database(path, busy_timeout)` returns an `Opened`: a connection (autocommit, WAL,
`synchronous=FULL`, foreign keys on, migrated, proven writable), whether it is the file
(`persistent`) or an in-memory stand-in, and `notice` (a sentence for every front end, or None).
By what SQLite reports:
- a lock held by another process past the busy timeout: in memory; the notice names the file and
  says another process holds it. The file is not touched.
- not a database or malformed (SQLITE_NOTADB, SQLITE_CORRUPT, or `quick_check` not "ok"), and
  `integrity_check` agrees (or cannot run at all): the file and its -wal/-shm are renamed to
  `<name>.corrupt-<timestamp>` (never deleted) and a new database is started; said in the notice.
- anything else (a read-only file or directory, a full disk, an I/O error): in memory, said so.
- a schema newer than this Lampo: `SchemaTooNew` propagates (the caller refuses to run).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from lampo.store.errors import describe, is_busy, is_damage
from lampo.store.migrations import migrate

NOT_SAVED = "Chats in this run will not be saved because"


@dataclass(frozen=True)
class Opened:
    conn: sqlite3.Connection
    persistent: bool
    notice: str | None = None


class _Damaged(Exception):
    """`quick_check` found problems (its first findings are the message)."""


def connect(target: Path | str, busy_timeout: float) -> sqlite3.Connection:
    return sqlite3.connect(target, timeout=busy_timeout, check_same_thread=False, isolation_level=None)


def open_in_memory(notice: str | None) -> Opened:
    conn = connect(":memory:", 0.0)
    conn.execute("PRAGMA foreign_keys = ON")
    migrate(conn)
    return Opened(conn, persistent=False, notice=notice)


def open_database(path: Path, busy_timeout: float) -> Opened:
    try:
        return Opened(_open_file(path, busy_timeout), persistent=True)
    except _Damaged as e:
        problem = str(e)
    except sqlite3.Error as e:
        if not is_damage(e):
            return _unusable(path, e, busy_timeout)
        problem = str(e)
    try:
        sound = _integrity_check_passes(path, busy_timeout)
    except sqlite3.Error as e:
        if is_busy(e):
            return _unusable(path, e, busy_timeout)
        sound = False  # the check cannot run at all: SQLite's own report of damage stands
    if sound:
        return open_in_memory(f"{NOT_SAVED} the chat database {path} reported a problem ({problem}) "
                              f"that its integrity check does not confirm; the file was left as it is.")
    try:
        moved = _move_aside(path)
    except OSError as e:
        return open_in_memory(f"{NOT_SAVED} the chat database {path} is damaged ({problem}) and could "
                              f"not be moved aside ({e.strerror or e}).")
    damaged = f"The chat database {path} was damaged ({problem}); it was moved to {moved.name}"
    try:
        return Opened(_open_file(path, busy_timeout), persistent=True, notice=f"{damaged} and a new one was started.")
    except sqlite3.Error as e:
        return open_in_memory(f"{damaged}, and a new one cannot be started: {describe(e, busy_timeout)}; "
                              f"chats in this run will not be saved.")


def _unusable(path: Path, error: sqlite3.Error, busy_timeout: float) -> Opened:
    return open_in_memory(f"{NOT_SAVED} the chat database {path} cannot be used: {describe(error, busy_timeout)}.")


def _open_file(path: Path, busy_timeout: float) -> sqlite3.Connection:
    conn = connect(path, busy_timeout)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        verdict = _check(conn, "quick_check")  # before anything writes to a damaged file
        if verdict:
            raise _Damaged(verdict)
        _use_wal(conn, busy_timeout)
        conn.execute("PRAGMA synchronous = FULL")  # WAL synced at every commit: it survives power loss too
        migrate(conn)
        _prove_writable(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _use_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Switch the file to WAL (a persistent setting, so usually a no-op). The switch needs the file
    to itself and SQLite answers SQLITE_BUSY at once, without its busy handler, while another
    connection (a second Lampo starting on the same fresh file) reads it: retry until the timeout."""
    deadline = time.monotonic() + busy_timeout
    delay = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if not is_busy(e) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _check(conn: sqlite3.Connection, pragma: str) -> str:
    """"" when `PRAGMA quick_check` / `integrity_check` says "ok", else its first findings."""
    rows = [r[0] for r in conn.execute(f"PRAGMA {pragma}(5)").fetchall()]
    return "" if rows == ["ok"] else "; ".join(rows)


def _prove_writable(conn: sqlite3.Connection) -> None:
    """A read-only file opens and reads fine; find out now, not at the first message."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"PRAGMA user_version = {conn.execute('PRAGMA user_version').fetchone()[0]}")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _integrity_check_passes(path: Path, busy_timeout: float) -> bool:
    """`PRAGMA integrity_check` on a read-only connection: True when it finds nothing, False when
    it finds damage or fails as damaged; raises sqlite3.Error when it cannot run (e.g. locked)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout)
    try:
        return not _check(conn, "integrity_check")
    except sqlite3.Error as e:
        if is_damage(e):
            return False
        raise
    finally:
        conn.close()


def _move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    path.rename(target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    return target
