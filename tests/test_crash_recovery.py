"""`kill -9` during a streamed reply: the real `lampo` CLI (pipe mode, reference backend, the tiny
synthetic checkpoint) is killed while it streams, and a restart finds the partial reply in the
store, marked interrupted - in the session, the TUI footer, the plain REPL and the export - and
regenerate / edit work on it."""

import io
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from helpers import real_tokenizer, seed_lampo_home, tokenizer_json
from helpers.scripted_backend import ScriptedBackend

from lampo.chat_session import ChatSession
from lampo.plain import PlainRepl
from lampo.store import Store
from lampo.tui.message_view import reply_footer

WAIT_S = 180.0  # bound on each wait; a healthy run needs a few seconds


def _model_dir(tiny_dense_dir: Path, where: Path) -> Path:
    """The tiny checkpoint plus the real tokenizer (it ships none)."""
    where.mkdir()
    for f in tiny_dense_dir.iterdir():
        (where / f.name).symlink_to(f)
    (where / "tokenizer.json").symlink_to(tokenizer_json())
    return where


def _assistant_rows(db: Path) -> list[tuple[int, str, int]]:
    """(id, content, complete) of the assistant rows, read as another process would."""
    if not db.exists():
        return []
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return []
    try:
        return conn.execute("SELECT id, content, complete FROM messages WHERE role = 'assistant'").fetchall()
    except sqlite3.Error:  # not created yet
        return []
    finally:
        conn.close()


def test_kill_9_during_a_reply_keeps_it_and_a_restart_finds_it_interrupted(tiny_dense_dir, tmp_path):
    home = seed_lampo_home(tmp_path / "home")
    (home / "config").mkdir()
    (home / "config" / "config.toml").write_text(  # long enough to be killed mid-reply
        'backend = "reference"\ncontext = 8192\n[sampling]\nmax_tokens = 8000\n')
    model = _model_dir(tiny_dense_dir, tmp_path / "model")
    db = home / "data" / "lampo.sqlite3"
    proc = subprocess.Popen([sys.executable, "-m", "lampo", "--model", str(model), "--no-think"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "LAMPO_HOME": str(home)})
    streamed = bytearray()
    reader = threading.Thread(target=lambda: [streamed.extend(b) for b in iter(lambda: proc.stdout.read1(4096), b"")],
                              daemon=True)
    reader.start()
    proc.stdin.write(b"Tell me a long story.")
    proc.stdin.close()
    try:
        first = None
        deadline = time.monotonic() + WAIT_S
        while True:  # until the partial reply has been written at least twice (insert, then a rewrite)
            assert proc.poll() is None, f"lampo exited ({proc.returncode}): {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, f"no growing partial reply in the store after {WAIT_S:.0f} s"
            rows = _assistant_rows(db)
            if rows:
                first = first or rows[0][1]
                if len(rows[0][1]) > len(first):
                    break
            assert rows or len(streamed) < 2000, f"{len(streamed)} bytes streamed, nothing of them in the store"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT_S)
    reader.join(WAIT_S)
    [(reply_id, at_kill, complete)] = _assistant_rows(db)
    assert complete == 0 and at_kill
    shown = streamed.decode("utf-8", errors="replace")
    assert shown.startswith(at_kill) or at_kill.startswith(shown)  # what the user saw, up to a token

    store = Store(db)  # the restart: the -wal the kill left behind is replayed, nothing set aside
    assert store.persistent and store.notice is None
    session = ChatSession(ScriptedBackend(["A fresh reply."]), real_tokenizer(), store, thinking=False)
    [chat] = store.list_chats()
    session.load(chat.id)
    user, reply = session.turns
    assert (user.content, reply.id, reply.content) == ("Tell me a long story.", reply_id, at_kill)
    assert reply.interrupted and not reply.stopped and chat.head_id == reply_id
    assert reply_footer(reply.stats).endswith(" · interrupted")  # the TUI's footer
    assert "*(interrupted: Lampo quit before this reply was finished)*" in session.export_markdown()
    out = io.StringIO()
    PlainRepl(session, out).command(f"/load {chat.id}")
    assert "Its last reply was interrupted" in out.getvalue()

    list(session.regenerate())  # a new reply beside the interrupted one, which stays as a branch
    assert [t.content for t in session.turns] == ["Tell me a long story.", "A fresh reply."]
    assert not session.turns[-1].interrupted
    assert store.branch(chat.id, reply_id)[-1].interrupted
    list(session.edit_last_user("A short one, then."))
    assert [m.content for m in store.branch(chat.id, None)] == ["A short one, then.", "A fresh reply."]
    store.close()
