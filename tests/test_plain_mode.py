"""Plain REPL and pipe mode: in-process on the ScriptedBackend, and end to end through
`python -m lampo chat` in a subprocess (pipe) and a pseudo-terminal (plain REPL) on the demo."""

import io
import os
import re
import subprocess
import sys
import time

import pytest
from helpers import real_tokenizer, seed_lampo_home, tokenizer_json
from helpers.pty_terminal import PtyTerminal
from helpers.scripted_backend import ScriptedBackend

from lampo.chat_session import ChatSession
from lampo.plain import EXIT_OK, EXIT_OVERFLOW, EXIT_USAGE, PlainRepl, run_pipe
from lampo.store import Store

ANSWER = ["<think>", "\n", "pondering", "</think>", "\n\n", "Four", "."]


@pytest.fixture
def session(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    store = Store(tmp_path / "db.sqlite3")
    s = ChatSession(ScriptedBackend([ANSWER], context_max=200), real_tokenizer(), store)
    yield s
    store.close()


def test_pipe_prints_only_the_answer_and_stats_to_stderr(session):
    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session, "What is 2+2?\n", out, err) == EXIT_OK
    assert out.getvalue() == "Four.\n"
    assert "decode" in err.getvalue() and "ctx" in err.getvalue() and "pondering" not in err.getvalue()
    assert session.turns[-1].content == "Four."


def test_pipe_refuses_overflow_and_empty_input(session):
    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session, "word " * 500, out, err) == EXIT_OVERFLOW
    assert "too many" in err.getvalue() and "nothing was truncated" in err.getvalue() and out.getvalue() == ""
    assert run_pipe(session, " \n", out, err) == EXIT_USAGE and "nothing on stdin" in err.getvalue()


def test_pipe_warns_when_the_reply_never_left_thinking(session):
    session.backend = ScriptedBackend([["<think>", "\n", "still"]])
    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session, "q", out, err) == EXIT_OK
    assert out.getvalue() == "\n" and "still thinking" in err.getvalue()


def test_repl_commands(session, tmp_path):
    out = io.StringIO()
    repl = PlainRepl(session, out)
    doc = tmp_path / "notes.txt"
    doc.write_text("alpha beta")
    for line in ["/set temperature 0.25", "/set top_k 3", "/set top_k many", "/set colour 1",
                 "/think off", "/think maybe", "/system Be terse.", f"/attach {doc}",
                 "/attach /no/such/file", "/frobnicate"]:
        assert repl.command(line)
    assert session.sampling.temperature == 0.25 and session.sampling.top_k == 3
    assert not session.thinking and session.system_prompt == "Be terse."
    assert [a.name for a in repl.pending] == ["notes.txt"]
    text = out.getvalue()
    for expected in ["temperature = 0.25", "top_k", "int", "unknown setting colour", "usage: /think on|off",
                     "📎 notes.txt (", "No such file", "Unknown command /frobnicate"]:
        assert expected in text, expected
    repl.send("summarise")
    assert repl.pending == [] and session.turns[0].attachments[0].name == "notes.txt"
    assert "decode" in out.getvalue()  # the footer
    assert repl.command("/chats") and "summarise" in out.getvalue()
    assert repl.command(f"/save {tmp_path / 'out.md'}") and "Four." in (tmp_path / "out.md").read_text()
    assert repl.command("/rename Notes") and session.title == "Notes"
    assert repl.command("/regen") and repl.command("/edit summarise again")
    assert session.turns[-2].content == "summarise again"
    assert repl.command("/new") and session.chat_id is None
    assert not repl.command("/quit")


def test_repl_keeps_the_draft_on_overflow(session):
    repl = PlainRepl(session, io.StringIO())
    repl.send("word " * 500)
    assert repl.draft.startswith("word") and session.turns == []


# ---- end to end --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lampo_home(tmp_path_factory):
    """A LAMPO_HOME with short greedy replies configured; the demo is created by the first run."""
    home = seed_lampo_home(tmp_path_factory.mktemp("home"))
    (home / "config").mkdir()
    (home / "config" / "config.toml").write_text("[sampling]\ntemperature = 0.0\nmax_tokens = 6\n")
    return home


def lampo_env(home):
    return {**os.environ, "LAMPO_HOME": str(home), "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


LAMPO = [sys.executable, "-m", "lampo", "chat", "--backend", "reference"]


@pytest.mark.slow
def test_pipe_end_to_end(lampo_home):
    r = subprocess.run([*LAMPO, "--no-think"], input="Say hi.", capture_output=True, text=True,
                       env=lampo_env(lampo_home), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and r.stdout.endswith("\n")
    assert "6 tokens" in r.stderr and "length limit" in r.stderr
    over = subprocess.run([*LAMPO, "--context", "256"], input="word " * 400, capture_output=True,
                          text=True, env=lampo_env(lampo_home), timeout=300)
    assert over.returncode == EXIT_OVERFLOW and "too many" in over.stderr and over.stdout == ""


@pytest.mark.slow
def test_plain_repl_end_to_end_on_a_terminal(lampo_home):
    term = PtyTerminal([*LAMPO, "--plain"], lampo_env(lampo_home))
    prompt = r"(.|\n)*\n> ?$"  # typing before the prompt is back would go through the cooked tty
    seen = 0

    def expect(pattern: str) -> str:
        """Wait for `pattern` in what came since the last expect (each ends at an idle prompt)."""
        nonlocal seen
        term.wait_for_text(pattern, since=seen)
        screen, seen = term.text(seen), term.mark()
        return screen

    def send(text: str) -> None:
        term.write(text.encode())

    try:
        assert "DEMO" in expect(r"Ctrl-D quits" + prompt)
        send("/help\r")
        expect(r"Commands:(.|\n)*/quit" + prompt)
        send("/think off\r")
        expect(r"Thinking off\." + prompt)
        send("Hello there\x1b\r")  # Esc Enter: a newline, not a send
        time.sleep(0.5)
        send("second line\r")
        expect(r"prefill [\d,]+ / [\d,]+ tokens(.|\n)*6 tokens · ctx .*length limit" + prompt)
        send("/set max_tokens 2000\r")
        expect(r"max_tokens = 2000" + prompt)
        send("Tell me more\r")
        time.sleep(2.0)  # the reply (2,000 tokens, 20+ s) is streaming
        send("\x03")  # Ctrl-C stops the reply, keeps it, and returns to the prompt
        expect(r"\[stopped - the partial reply is kept\](.|\n)*stopped" + prompt)
        send("/chats\r")
        expect(r"\*\s+\d+\s+Hello there second line" + prompt)
        send("/quit\r")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    db = Store(lampo_home / "data" / "lampo.sqlite3")
    chat = db.list_chats()[0]
    turns = db.branch(chat.id, None)
    assert [t.content for t in turns if t.role == "user"] == ["Hello there\nsecond line", "Tell me more"]
    assert turns[-1].role == "assistant" and turns[-1].stopped
    db.close()
    assert (lampo_home / "data" / "plain_history").read_text().count("+Hello there") == 1


# ---- lampo chat start-up failures (in process: they end before any model work) -----------------
def chat_args(*argv):
    from lampo.cli import build_parser

    return build_parser().parse_args(["chat", *argv])


def test_run_chat_reports_bad_settings_and_missing_models(tmp_path, monkeypatch, capsys):
    from lampo.chat_entry import run_chat

    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text('backend = "gpu"\n')
    assert run_chat(chat_args()) == 1
    assert "backend = 'gpu' is invalid" in capsys.readouterr().err
    (tmp_path / "config" / "config.toml").write_text("")
    assert run_chat(chat_args("--model", str(tmp_path / "nowhere"))) == 1
    assert "nowhere (from --model) does not exist" in capsys.readouterr().err


def test_run_chat_refuses_a_forced_cuda_backend_without_the_engine(tmp_path, monkeypatch, capsys):
    import lampo.engine.cuda as cuda_backend
    from lampo.chat_entry import run_chat

    def unavailable():
        raise cuda_backend.EngineUnavailable("no CUDA device is visible")

    monkeypatch.setattr(cuda_backend, "load_native", unavailable)
    monkeypatch.setenv("LAMPO_HOME", str(seed_lampo_home(tmp_path)))
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").symlink_to(tokenizer_json())
    assert run_chat(chat_args("--model", str(model), "--backend", "cuda")) == 1
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--backend reference" in err


# ---- prefill progress and the footer of a reply stopped during prefill ---------------------------
class TerminalOut(io.StringIO):
    def isatty(self):
        return True


class StopDuringPrefill:
    """Wraps a backend: the user presses Ctrl-C once `after` prompt tokens are prefilled."""

    def __init__(self, inner, after: int):
        self.inner, self.after = inner, after

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, request, cancel):
        from lampo.engine.protocol import PrefillProgress

        for event in self.inner.generate(request, cancel):
            yield event
            if isinstance(event, PrefillProgress) and event.done >= self.after:
                cancel.set()


LONG_PASTE = "word " * 300  # about 300 tokens: five 64-token prefill chunks


def long_prefill_session(session, *, stop_after=None):
    backend = ScriptedBackend([ANSWER], context_max=4096, prefill_chunk=64)
    session.backend = backend if stop_after is None else StopDuringPrefill(backend, stop_after)
    return session


def test_plain_shows_prefill_progress_on_a_terminal_and_clears_it(session):
    out = TerminalOut()
    PlainRepl(long_prefill_session(session), out).send(LONG_PASTE)
    text = out.getvalue()
    progress = re.findall(r"\r\x1b\[2K[^\r\n]*prefill ([\d,]+) / ([\d,]+) tokens", text)
    assert len(progress) >= 4 and progress[0][0] == "64"
    total = progress[0][1]
    assert all(t == total for _, t in progress) and progress[-1][0] == total
    assert "Ctrl-C stops" in text
    # the progress line is erased before the reply is printed over it
    assert re.search(r"\r\x1b\[2K(\x1b\[2m)?pondering", text)


def test_plain_shows_no_progress_when_not_on_a_terminal(session):
    out = io.StringIO()
    PlainRepl(long_prefill_session(session), out).send(LONG_PASTE)
    assert "\r" not in out.getvalue() and " / " not in out.getvalue()
    assert "pondering" in out.getvalue()


def test_footer_after_a_stop_during_prefill_says_how_far_it_got(session):
    out = io.StringIO()
    PlainRepl(long_prefill_session(session, stop_after=128), out).send(LONG_PASTE)
    footer = out.getvalue().strip().splitlines()[-1]
    assert "TTFT" not in footer and "decode" not in footer
    assert re.search(r"stopped during prefill at 128 / [\d,]+ tokens", footer), footer


def test_pipe_progress_goes_to_a_terminal_stderr_only(session):
    out, err = io.StringIO(), TerminalOut()
    assert run_pipe(long_prefill_session(session), LONG_PASTE, out, err) == EXIT_OK
    assert "prefill 64 / " in err.getvalue() and "\r" not in out.getvalue() and out.getvalue() == "Four.\n"
