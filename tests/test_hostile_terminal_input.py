"""End to end, `python -m lampo chat` on the tiny model (reference backend) under hostile input: bytes
that are not UTF-8 typed and pasted, text and Enter in one terminal write, a 3 MB binary paste -
on the TUI and the plain REPL under a real pseudo-terminal, and in pipe mode. Lampo stays up,
stores the messages with U+FFFD where the bytes were invalid, and quits cleanly."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import seed_lampo_home, tokenizer_json
from helpers.pty_terminal import PtyTerminal

LAMPO = [sys.executable, "-m", "lampo", "chat", "--backend", "reference"]
PASTE_START, PASTE_END = b"\x1b[200~", b"\x1b[201~"


@pytest.fixture(scope="module")
def model_dir(tiny_dense_dir, tmp_path_factory) -> Path:
    """The tiny-dense checkpoint with the Qwen3.6 tokenizer beside it (links: the fixture is read-only)."""
    model = tmp_path_factory.mktemp("model")
    for path in tiny_dense_dir.iterdir():
        (model / path.name).symlink_to(path)
    (model / "tokenizer.json").symlink_to(tokenizer_json())
    return model


@pytest.fixture
def home(tmp_path) -> Path:
    home = seed_lampo_home(tmp_path / "home")
    (home / "config").mkdir()
    (home / "config" / "config.toml").write_text("thinking = false\n[sampling]\ntemperature = 0.0\nmax_tokens = 4\n")
    return home


def lampo_env(home: Path) -> dict[str, str]:
    return {**os.environ, "LAMPO_HOME": str(home), "TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def stored(home: Path) -> list[tuple[str, str, str | None]]:
    """(role, content, done reason or None while streaming) of every stored message, oldest first."""
    path = home / "data" / "lampo.sqlite3"
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT role, content, json_extract(stats, '$.reason') FROM messages ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # not created yet, or busy: asked again
        return []
    finally:
        db.close()


def user_messages(home: Path) -> list[str]:
    return [content for role, content, _ in stored(home) if role == "user"]


def send(term: PtyTerminal, home: Path, keys: bytes, sent: list[str], ready: str) -> None:
    """Write `keys`; wait until the store holds exactly the user messages `sent`, each with its
    finished reply, and the screen shows `ready` (the front end takes input again)."""
    def replied() -> bool:
        rows = stored(home)
        return ([c for r, c, _ in rows if r == "user"] == sent
                and sum(r == "assistant" and reason is not None for r, _, reason in rows) == len(sent))

    mark = term.mark()
    term.write(keys)
    term.wait_for(replied, f"the replies to {sent!r} in the store", timeout=180)
    term.wait_for_text(ready, since=mark)


def binary_paste(size: int) -> bytes:
    """A bracketed paste of `size` random bytes (fixed seed); the end marker cannot occur inside."""
    return PASTE_START + random.Random(size).randbytes(size).replace(PASTE_END, b"") + PASTE_END


@pytest.mark.slow
def test_the_tui_survives_invalid_utf8_a_typing_burst_and_a_3_mb_binary_paste(model_dir, home):
    term = PtyTerminal([*LAMPO, "--model", str(model_dir)], lampo_env(home))
    try:
        term.wait_for_text(r"Enter sends, ctrl\+j newline")
        done = "length limit"  # the reply's footer, shown once the app takes a message again
        send(term, home, b"caf\xe9 au lait\r", ["caf\ufffd au lait"], done)  # Latin-1: not UTF-8
        send(term, home, b"hi\r", ["caf\ufffd au lait", "hi"], done)  # text and Enter in one write
        mark = term.mark()
        term.write(binary_paste(3 * 2**20))
        term.wait_for_text(r"Pasted text #1: [\d,]+ tokens attached", timeout=600, since=mark)
        term.write(b"\x11")  # ctrl+q: quit
        assert term.wait_exit(timeout=300) == 0
    finally:
        term.kill()
    assert user_messages(home) == ["caf\ufffd au lait", "hi"]


@pytest.mark.slow
def test_the_plain_repl_takes_invalid_utf8_typed_and_pasted(model_dir, home):
    term = PtyTerminal([*LAMPO, "--plain", "--model", str(model_dir)], lampo_env(home))
    try:
        term.wait_for_text(r"Ctrl-D quits(.|\n)*\n>")
        done = r"length limit(.|\n)*\n>"  # the reply's footer, then the prompt
        send(term, home, b"caf\xe9 au lait\r", ["caf\ufffd au lait"], done)
        pasted = "pasted \ufffd\ufffd bytes \x1b[31mred\x00 end"
        send(term, home, PASTE_START + b"pasted \xff\xfe bytes \x1b[31mred\x00 end" + PASTE_END + b"\r",
             ["caf\ufffd au lait", pasted], done)
        send(term, home, b"hi\r", ["caf\ufffd au lait", pasted, "hi"], done)
        term.write(b"/quit\r")
        assert term.wait_exit() == 0
    finally:
        term.kill()


@pytest.mark.slow
def test_pipe_mode_sends_invalid_utf8_as_replacement_characters(model_dir, home):
    run = subprocess.run([*LAMPO, "--model", str(model_dir)], input=b"caf\xe9 au lait", capture_output=True,
                         env=lampo_env(home), timeout=300)
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    assert user_messages(home) == ["caf\ufffd au lait"]
