"""`--context N`: the command line takes exactly the range config.toml does, and a model whose
max_position_embeddings is smaller than the asked context is said to be so, not clamped silently."""

from __future__ import annotations

import io
import sys

import pytest
from helpers import real_tokenizer
from helpers.scripted_backend import ScriptedBackend

from lampo import chat_entry
from lampo.cli import build_parser
from lampo.settings import CONTEXT_RANGE

LOW, HIGH = CONTEXT_RANGE


@pytest.mark.parametrize("value", [str(LOW), "32768", str(HIGH)])
def test_context_in_range_is_accepted(value):
    assert build_parser().parse_args(["chat", "--context", value]).context == int(value)


@pytest.mark.parametrize("value", ["100", str(LOW - 1), str(HIGH + 1), "9999999", "0", "-5", "abc", "1e5", "4.5"])
def test_context_out_of_range_is_refused_naming_the_range(value, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["chat", "--context", value])
    assert e.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--context" in error and repr(value) in error and f"{LOW:,} to {HIGH:,}" in error


def test_a_model_with_a_shorter_context_says_so(tmp_path, monkeypatch, capsys):
    """The backend holds 4,096 tokens (its model's max_position_embeddings) but 8,192 were asked."""
    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    backend = ScriptedBackend(["Hi."], context_max=4096)
    monkeypatch.setattr(chat_entry, "_backend", lambda kind, model_dir, context, args, speculation: (backend, real_tokenizer()))
    monkeypatch.setattr(chat_entry, "_model_dir", lambda args, settings: tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello"))  # not a terminal: pipe mode
    assert chat_entry.run_chat(build_parser().parse_args(["chat", "--context", "8192", "--no-think"])) == 0
    err = capsys.readouterr().err
    assert "4,096" in err and "8,192" in err and "max_position_embeddings" in err


def test_no_notice_when_the_model_holds_the_asked_context(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    backend = ScriptedBackend(["Hi."], context_max=4096)
    monkeypatch.setattr(chat_entry, "_backend", lambda kind, model_dir, context, args, speculation: (backend, real_tokenizer()))
    monkeypatch.setattr(chat_entry, "_model_dir", lambda args, settings: tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello"))
    assert chat_entry.run_chat(build_parser().parse_args(["chat", "--context", "4096", "--no-think"])) == 0
    assert "max_position_embeddings" not in capsys.readouterr().err
