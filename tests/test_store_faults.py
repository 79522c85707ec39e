"""Fault injection into the chat store: locks, a full disk, a file going read-only, read-only
files and directories, damaged files (garbage, empty), a -wal left behind, and processes racing to
create a fresh database. What must hold: only a file SQLite reports damaged is moved aside (never
deleted); anything else leaves the file as it was and the chat running (in memory when it must,
said so); a failed write keeps the conversation and saves it once the store takes writes again;
every front end is told in one line."""

import contextlib
import io
import multiprocessing
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
from helpers import real_tokenizer
from helpers.scripted_backend import ScriptedBackend
from helpers.unprivileged import foreign_dir, hand_over, remove_foreign_dir, run_unprivileged

from lampo import paths
from lampo.chat_session import ChatSession
from lampo.models.sampling_params import GREEDY
from lampo.store import Store

TITLES = ["alpha", "beta", "gamma"]


def seed(path: Path) -> None:
    """A database with three chats of two messages each, cleanly closed (no -wal left)."""
    s = Store(path)
    for title in TITLES:
        c = s.create_chat(title, "", GREEDY, True)
        u = s.add_message(c, None, "user", f"question for {title}")
        s.add_message(c, u, "assistant", f"answer for {title}")
    s.close()


def stored_chats(path: Path) -> list[tuple[str, int]]:
    """(title, messages) of every chat, read through a read-only connection."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT title, (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id) "
                            "FROM chats c ORDER BY id").fetchall()
    finally:
        conn.close()


SEEDED = [(title, 2) for title in TITLES]


def moved_aside(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if ".corrupt-" in p.name]


def session_on(store: Store, reply: str = "Fine, thanks.") -> ChatSession:
    return ChatSession(ScriptedBackend([reply]), real_tokenizer(), store, thinking=False)


def chat_runs(store: Store) -> bool:
    session = session_on(store)
    list(session.send("hello?"))
    return [t.content for t in session.turns] == ["hello?", "Fine, thanks."]


@contextlib.contextmanager
def exclusive_lock(path: Path):
    """Another connection holding the file to itself (readers and writers wait) until exit."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("SELECT COUNT(*) FROM chats").fetchall()
    try:
        yield holder
    finally:
        holder.close()


# ---- locks ---------------------------------------------------------------------------------------
def test_a_lock_held_past_the_timeout_is_not_damage(tmp_path):
    path = tmp_path / "lampo.sqlite3"
    seed(path)
    with exclusive_lock(path):
        store = Store(path, busy_timeout=0.2)
        assert not store.persistent
        assert store.notice == (f"Chats in this run will not be saved because the chat database {path} cannot be "
                                f"used: another process holds a lock on it (waited 0.2 s).")
        assert chat_runs(store)
        store.close()
    assert not moved_aside(tmp_path)
    assert stored_chats(path) == SEEDED


def test_a_lock_released_within_the_timeout_is_waited_out(tmp_path):
    path = tmp_path / "lampo.sqlite3"
    seed(path)
    with exclusive_lock(path) as holder:
        threading.Timer(0.3, holder.close).start()
        store = Store(path, busy_timeout=60.0)  # bounded: returns as soon as the lock goes
    assert store.persistent and store.notice is None
    assert [c.title for c in store.list_chats()] == TITLES[::-1]
    assert chat_runs(store)
    store.close()
    assert not moved_aside(tmp_path)


def test_processes_racing_on_a_fresh_data_dir_never_move_it_aside(tmp_path):
    """Several Lampos starting at once on a data dir with no database yet (the issue saw the
    fresh file moved aside as "damaged" in 4 of 5 tries with two)."""
    ctx = multiprocessing.get_context("fork")
    rounds, openers = 25, 3
    for n in range(rounds):
        path = tmp_path / f"round{n}" / "lampo.sqlite3"
        path.parent.mkdir()
        barrier, results = ctx.Barrier(openers), ctx.Queue()
        procs = [ctx.Process(target=_open_at_once, args=(path, barrier, results)) for _ in range(openers)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        assert outcomes == [(True, None)] * openers, f"round {n}"
        assert not moved_aside(path.parent), f"round {n}"
        assert len(stored_chats(path)) == openers


def _open_at_once(path: Path, barrier, results) -> None:
    barrier.wait()
    try:
        store = Store(path)
        results.put((store.persistent, store.notice))
        store.create_chat("racer", "", GREEDY, True)
        store.close()
    except BaseException as e:
        results.put((False, f"{type(e).__name__}: {e}"))


# ---- failures mid-session ------------------------------------------------------------------------
@contextlib.contextmanager
def disk_full(store: Store):
    """The file may not grow (SQLITE_FULL), as on a full disk."""
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    yield
    store._conn.execute("PRAGMA max_page_count = 4294967294")


@contextlib.contextmanager
def read_only(store: Store):
    """The connection may not write (SQLITE_READONLY), as when the file turns read-only."""
    store._conn.execute("PRAGMA query_only = ON")
    yield
    store._conn.execute("PRAGMA query_only = OFF")


@contextlib.contextmanager
def write_locked(store: Store):
    """Another process holds the write lock past the busy timeout (SQLITE_BUSY)."""
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    yield
    holder.close()


@pytest.mark.parametrize("fault, cause", [
    (disk_full, "the disk is full"),
    (read_only, "it is read-only"),
    (write_locked, "another process holds a lock on it"),
], ids=["disk-full", "read-only", "locked"])
def test_a_failed_write_keeps_the_chat_and_saves_it_later(tmp_path, fault, cause):
    path = tmp_path / "lampo.sqlite3"
    store = Store(path, busy_timeout=0.2)
    session = session_on(store, reply="reply " * 2000)  # big enough to need new pages
    list(session.send("first"))
    assert session.take_warnings() == []
    with fault(store):
        list(session.send("second " * 2000))
        session.set_system_prompt("be brief")
        list(session.send("third"))
        assert [t.role for t in session.turns] == ["user", "assistant"] * 3  # nothing lost in memory
        assert [t.id == 0 for t in session.turns] == [False] * 2 + [True] * 4
        warnings = session.take_warnings()
        assert len(warnings) == 1  # told once, not at every write
        assert warnings[0].startswith(f"Not saved: could not save to the chat database {path}: {cause}")
        assert "saving is retried" in warnings[0]
    session.set_thinking(True)  # any later change retries the whole backlog
    assert session.take_warnings() == ["Saving works again: this chat is stored."]
    stored = store.branch(session.chat_id, None)
    assert [_fields(m) for m in stored] == [_fields(t) for t in session.turns]
    assert [m.parent_id for m in stored] == [None] + [m.id for m in stored[:-1]]
    chat = store.get_chat(session.chat_id)
    assert chat.system_prompt == "be brief" and chat.thinking and chat.head_id == stored[-1].id
    assert not any(m.interrupted for m in stored)
    store.close()


def _fields(m):
    return m.id, m.chat_id, m.parent_id, m.role, m.content, m.reasoning, m.stopped, m.stats, m.attachments


def test_a_chat_whose_first_write_fails_is_created_later(tmp_path):
    store = Store(tmp_path / "lampo.sqlite3", busy_timeout=0.2)
    session = session_on(store)
    with read_only(store):
        list(session.send("hello?"))
        doc = session.add_attachment("notes.txt", "some notes")
        assert session.chat_id is None and len(session.turns) == 2
    list(session.send("and this", [doc]))
    assert [c.title for c in store.list_chats()] == ["hello?"]
    assert [m.content for m in store.branch(session.chat_id, None)] == ["hello?", "Fine, thanks.", "and this",
                                                                        "Fine, thanks."]
    assert store.branch(session.chat_id, None)[2].attachments == (doc,)
    store.close()


def test_switching_chats_while_saving_fails_says_what_was_not_saved(tmp_path):
    store = Store(tmp_path / "lampo.sqlite3", busy_timeout=0.2)
    session = session_on(store)
    list(session.send("kept"))
    with read_only(store):
        list(session.send("lost"))
        session.new_chat()
    assert session.take_warnings()[1:] == ['"kept" was left with 2 messages the chat database never got.']
    store.close()


# ---- damaged and odd files -----------------------------------------------------------------------
def test_an_empty_file_is_a_new_database_not_damage(tmp_path):
    path = tmp_path / "lampo.sqlite3"
    path.write_bytes(b"")
    store = Store(path)
    assert store.persistent and store.notice is None and chat_runs(store)
    store.close()
    assert not moved_aside(tmp_path)


def test_a_wal_left_behind_by_a_crash_is_replayed(tmp_path):
    path = tmp_path / "lampo.sqlite3"
    live = Store(path)
    c = live.create_chat("in the wal", "", GREEDY, True)
    live.add_message(c, None, "user", "not checkpointed yet")
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for suffix in ("", "-wal"):  # what a killed process leaves: the file and its live -wal
        shutil.copyfile(f"{path}{suffix}", crashed / f"lampo.sqlite3{suffix}")
    live.close()
    assert (crashed / "lampo.sqlite3-wal").stat().st_size > 0
    store = Store(crashed / "lampo.sqlite3")
    assert store.notice is None
    assert [m.content for m in store.branch(c, None)] == ["not checkpointed yet"]
    store.close()


def test_a_garbage_wal_is_ignored_not_damage(tmp_path):
    path = tmp_path / "lampo.sqlite3"
    seed(path)
    Path(f"{path}-wal").write_bytes(b"\x00garbage\xff" * 1000)
    store = Store(path)
    assert store.persistent and store.notice is None
    assert [c.title for c in store.list_chats()] == TITLES[::-1]
    store.close()
    assert not moved_aside(tmp_path)


def test_pipe_mode_says_the_database_was_moved_aside(tmp_path):
    from lampo.plain import run_pipe

    path = tmp_path / "lampo.sqlite3"
    path.write_bytes(b"not a database " * 300)
    store = Store(path)
    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session_on(store), "hi", out, err) == 0
    first = err.getvalue().splitlines()[0]
    assert first.startswith(f"lampo: The chat database {path} was damaged (file is not a database); it was moved "
                            f"to lampo.sqlite3.corrupt-") and first.endswith("and a new one was started.")
    assert out.getvalue() == "Fine, thanks.\n"
    store.close()


# ---- directories and permissions -----------------------------------------------------------------
def test_a_data_dir_that_cannot_be_created_runs_the_chat_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where LAMPO_HOME should be")
    monkeypatch.setenv(paths.HOME_ENV, str(blocker))
    with pytest.raises(paths.DirectoryError, match=f"Lampo's data directory {blocker / 'data'} "
                                                   r"\(under \$LAMPO_HOME\) cannot be created: Not a directory"):
        paths.data_dir()
    store = Store()
    assert not store.persistent and store.path is None
    assert store.notice == (f"Chats in this run will not be saved because Lampo's data directory {blocker / 'data'} "
                            f"(under $LAMPO_HOME) cannot be created: Not a directory.")
    assert chat_runs(store)
    store.close()


@pytest.fixture
def shared(tmp_path):
    """A folder the unprivileged child can use (see helpers.unprivileged); removed afterwards."""
    folder = foreign_dir()
    yield folder
    remove_foreign_dir(folder)


def _open_and_chat(path: Path | None) -> tuple[bool, str | None, bool]:
    store = Store(path, busy_timeout=0.2)
    try:
        return store.persistent, store.notice, chat_runs(store)
    finally:
        store.close()


@pytest.mark.parametrize("what", ["directory", "file"])
def test_a_read_only_database_leaves_the_file_alone_and_runs_in_memory(shared, what):
    data = shared / "data"
    data.mkdir()
    path = data / "lampo.sqlite3"
    seed(path)
    before = path.read_bytes()
    hand_over(shared)
    (data if what == "directory" else path).chmod(0o555 if what == "directory" else 0o444)
    real_tokenizer()  # loaded before the fork: the child may not read the tokenizer file
    persistent, notice, runs = run_unprivileged(_open_and_chat, path)
    assert not persistent and runs
    assert notice.startswith(f"Chats in this run will not be saved because the chat database {path} cannot be used: ")
    assert path.read_bytes() == before and not moved_aside(data)
    assert stored_chats(path) == SEEDED


def test_a_damaged_file_in_a_read_only_directory_is_said_and_kept(shared):
    data = shared / "data"
    data.mkdir()
    path = data / "lampo.sqlite3"
    path.write_bytes(b"garbage " * 1000)
    hand_over(shared)
    data.chmod(0o555)
    real_tokenizer()
    persistent, notice, runs = run_unprivileged(_open_and_chat, path)
    assert not persistent and runs
    assert notice == (f"Chats in this run will not be saved because the chat database {path} is damaged (file is "
                      f"not a database) and could not be moved aside (Permission denied).")
    assert path.read_bytes() == b"garbage " * 1000


def test_an_unwritable_lampo_home_runs_the_chat_in_memory_in_pipe_mode(shared, monkeypatch):
    """The issue's case 3 in pipe mode: one line on stderr, the answer on stdout, exit 0."""
    from lampo.plain import _input_history, run_pipe

    home = shared / "home"
    home.mkdir()
    hand_over(shared)
    home.chmod(0o555)
    monkeypatch.setenv(paths.HOME_ENV, str(home))
    real_tokenizer()
    import prompt_toolkit.history  # noqa: F401 - `_input_history` imports it: load it before the fork

    def run() -> tuple[int, str, str, str]:
        store = Store()
        out, err = io.StringIO(), io.StringIO()
        code = run_pipe(session_on(store), "hi", out, err)
        store.close()
        return code, out.getvalue(), err.getvalue(), type(_input_history()).__name__

    code, out, err, history = run_unprivileged(run)
    assert code == 0 and out == "Fine, thanks.\n"
    assert err.splitlines()[0] == (f"lampo: Chats in this run will not be saved because Lampo's data directory "
                                   f"{home / 'data'} (under $LAMPO_HOME) cannot be created: Permission denied.")
    assert "Traceback" not in err
    assert history == "InMemoryHistory"  # the plain REPL's input history too
