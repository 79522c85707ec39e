"""ProcessBackend (engine/process_backend.py): a backend built and run in a child process streams
the same events as in this one, raises its refusals and start-up errors here, passes cancel on,
survives a consumer that stops early, and turns the child's death into an error of the call."""

from __future__ import annotations

import os
import re
import sys
import threading
from functools import partial

import pytest
from helpers.scripted_backend import ScriptedBackend

from lampo.engine.process_backend import BackendProcessError, ProcessBackend
from lampo.engine.protocol import ContextOverflow, Done, GenerationRequest, Stats, TokenEvent
from lampo.engine.speculation import Speculation
from lampo.models.sampling_params import GREEDY, SamplingParams


def scripted(replies, say, delay=0.0):
    say("scripted backend ready")
    return ScriptedBackend(replies, delay=delay, context_max=64)


def failing(say):
    say("about to fail")
    raise ValueError("model directory /nowhere does not exist")


class Dying(ScriptedBackend):
    def generate(self, request, cancel):
        events = super().generate(request, cancel)

        def stream():
            for event in events:
                yield event
                if isinstance(event, TokenEvent):
                    os._exit(3)  # a crash inside the engine takes the process down

        return stream()


def dying(say):
    print("engine: about to crash")  # the child's output: in the log, not on the terminal
    return Dying(["abcdef"], context_max=64)


def request(n_prompt=3, max_tokens=100):
    return GenerationRequest(tuple(range(1, n_prompt + 1)), SamplingParams(**{**GREEDY.to_dict(), "max_tokens": max_tokens}))


def text(events):
    return "".join(e.text for e in events if isinstance(e, TokenEvent))


@pytest.fixture
def backend():
    said = []
    b = ProcessBackend(partial(scripted, ["Hello there.", "Second reply."]), say=said.append)
    b.said = said
    yield b
    b.close()


def test_the_child_streams_the_backends_events_and_its_say_lines_come_back(backend):
    assert backend.said == ["scripted backend ready"]
    assert backend.info.backend == "scripted" and backend.info.context_max == 64
    events = list(backend.generate(request(), threading.Event()))
    assert text(events) == "Hello there." and isinstance(events[-1], Done) and events[-1].reason == "stop"
    assert any(isinstance(e, Stats) for e in events)
    assert text(backend.generate(request(), threading.Event())) == "Second reply."


def test_a_refusal_is_raised_here_with_its_numbers_and_the_next_call_works(backend):
    with pytest.raises(ContextOverflow) as e:
        backend.generate(request(n_prompt=80), threading.Event())
    assert (e.value.prompt_tokens, e.value.context_max) == (80, 64)
    assert text(backend.generate(request(), threading.Event())) == "Hello there."


def test_cancel_reaches_the_child():
    b = ProcessBackend(partial(scripted, ["x" * 1000], delay=0.01))
    try:
        cancel = threading.Event()
        events = []
        for event in b.generate(request(), cancel):
            events.append(event)
            if isinstance(event, TokenEvent):
                cancel.set()
        assert events[-1].reason == "cancelled" and len(text(events)) < 100
    finally:
        b.close()


def test_a_consumer_that_stops_early_leaves_the_backend_ready(backend):
    stream = backend.generate(request(), threading.Event())
    next(e for e in stream if isinstance(e, TokenEvent))
    stream.close()
    backend.reset()
    assert text(backend.generate(request(), threading.Event())) == "Second reply."


def test_a_start_up_error_is_raised_by_the_constructor_after_the_lines_said():
    said = []
    with pytest.raises(ValueError, match="/nowhere does not exist"):
        ProcessBackend(failing, say=said.append)
    assert said == ["about to fail"]


def test_a_dead_child_fails_the_call_and_every_later_one(tmp_path, capfd):
    log = tmp_path / "backend.log"
    b = ProcessBackend(dying, log=log)
    try:
        with pytest.raises(BackendProcessError, match=re.escape(f"(exit code 3); its output is in {log}")):
            list(b.generate(request(), threading.Event()))
        assert "about to crash" in log.read_text() and "about to crash" not in capfd.readouterr().out
        with pytest.raises(BackendProcessError):
            b.generate(request(), threading.Event())
    finally:
        b.close()


@pytest.mark.parametrize("tty, plain, apart", [(True, False, True), (True, True, False), (False, False, False)])
def test_lampo_chat_runs_the_backend_apart_for_the_terminal_interface_only(monkeypatch, tmp_path, tty, plain, apart):
    """`lampo chat` on a terminal (the TUI) builds the backend in a ProcessBackend whose output goes
    to backend.log; --plain and pipe mode build it in their own process."""
    from lampo import chat_entry
    from lampo.cli import build_parser
    from lampo.engine import process_backend

    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    made = []
    monkeypatch.setattr(process_backend, "ProcessBackend",
                        lambda factory, say=None, log=None: made.append((factory, log)) or "apart")
    monkeypatch.setattr(chat_entry, "open_checkpoint_backend", lambda *a: "here")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: tty)
    monkeypatch.setattr("lampo.models.tokenizer.Tokenizer.from_checkpoint", lambda d: "tokenizer")
    args = build_parser().parse_args(["chat", *(["--plain"] if plain else [])])
    backend, tokenizer = chat_entry._backend("auto", tmp_path, 4096, args, Speculation())
    assert (backend, tokenizer) == ("apart" if apart else "here", "tokenizer")
    if apart:
        (factory, log), = made
        assert factory.func is chat_entry.open_checkpoint_backend and factory.args[:2] == ("auto", tmp_path)
        assert log == tmp_path / "cache" / "backend.log"
