"""Run test code where file permissions apply: root ignores them, so a read-only file or directory
is only read-only to another user.

`run_unprivileged(fn, *args)` forks; the child becomes uid/gid `NOBODY` when the tests run as
root (otherwise it keeps the tests' user), calls `fn(*args)` and sends back its result, or its
exception's traceback as an `AssertionError` in the parent. The child imports nothing new (it
may not be able to read the interpreter's files): import what `fn` needs before calling.
`foreign_dir()` makes a directory that child can use - under the system temp dir (pytest's
`tmp_path` sits inside a directory only root may enter), owned by the child's user;
`hand_over(path)` gives what the test wrote there to that user too.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

NOBODY = 65534


def _is_root() -> bool:
    return os.geteuid() == 0


def hand_over(path: Path) -> None:
    """Give `path` (and everything under it) to the child's user."""
    if not _is_root():
        return
    for p in [path, *path.rglob("*")]:
        os.chown(p, NOBODY, NOBODY, follow_symlinks=False)


def foreign_dir() -> Path:
    """A new directory the unprivileged child may use; remove it with `remove_foreign_dir`."""
    path = Path(tempfile.mkdtemp(prefix="lampo-unprivileged-"))
    hand_over(path)
    return path


def remove_foreign_dir(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o700)
    shutil.rmtree(path)


def run_unprivileged(fn: Callable[..., Any], *args: Any) -> Any:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        try:
            if _is_root():
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            payload = ("ok", fn(*args))
        except BaseException:
            payload = ("error", traceback.format_exc())
        with os.fdopen(write, "wb") as out:
            pickle.dump(payload, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        data = inp.read()
    os.waitpid(pid, 0)
    if not data:
        raise AssertionError("the unprivileged child died without a result")
    kind, value = pickle.loads(data)
    if kind == "error":
        raise AssertionError(f"in the unprivileged child:\n{value}")
    return value
