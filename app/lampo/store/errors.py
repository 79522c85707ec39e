"""What a failed SQLite call means for the chat store, in words a user can act on.

SQLite reports why a call failed in its result code (`sqlite3.Error.sqlite_errorcode`; the low
byte is the primary code). Only SQLITE_CORRUPT and SQLITE_NOTADB say the file itself is damaged;
SQLITE_BUSY / SQLITE_LOCKED say another connection holds a lock (the file is fine); the rest
(read-only, full disk, I/O error, cannot open) are about where the file lives. `StoreError` is
what the store raises for any of them: an `OSError` whose message names the file.
"""

from __future__ import annotations

import sqlite3

_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_BUSY = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_PLAIN_WORDS = {
    sqlite3.SQLITE_FULL: "the disk is full",
    sqlite3.SQLITE_READONLY: "it is read-only",
    sqlite3.SQLITE_CANTOPEN: "it cannot be opened (is its directory writable?)",
    sqlite3.SQLITE_PERM: "permission denied",
}


class StoreError(OSError):
    """A read or write of the chat database failed; the message names the file and the cause."""


def primary_code(error: BaseException) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_damage(error: BaseException) -> bool:
    """SQLite itself says the file is not a database or is malformed."""
    return primary_code(error) in _DAMAGED


def is_busy(error: BaseException) -> bool:
    """Another connection holds a lock that did not go away within the busy timeout."""
    return primary_code(error) in _BUSY


def describe(error: BaseException, busy_timeout: float) -> str:
    """Why `error` happened, as a clause: "it is read-only", "the disk is full (database or disk
    is full)", "another process holds a lock on it (waited 10 s)"."""
    code = primary_code(error)
    if code in _BUSY:
        return f"another process holds a lock on it (waited {busy_timeout:g} s)"
    if code in _DAMAGED:
        return f"it is damaged ({error})"
    if code in _PLAIN_WORDS:
        return f"{_PLAIN_WORDS[code]} ({error})"
    if code == sqlite3.SQLITE_IOERR:
        return f"an I/O error ({getattr(error, 'sqlite_errorname', 'SQLITE_IOERR')}: {error})"
    return str(error)
