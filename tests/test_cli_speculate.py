"""`--speculate MODE[:DRAFTS]` and config.toml's [speculation]: the spellings, one clear error for a
bad one, the command line over the settings file, and what the CUDA engine (which does not draft
yet) says about a setting it cannot honour."""

from __future__ import annotations

import io
import sys

import pytest
from helpers import real_tokenizer
from helpers.scripted_backend import ScriptedBackend

from lampo import chat_entry
from lampo.cli import build_parser
from lampo.engine import cuda, picker
from lampo.engine.speculation import Speculation, parse_speculation


@pytest.mark.parametrize("text, want", [
    ("auto", Speculation()), ("off", Speculation("off")), ("mtp", Speculation("mtp")),
    ("ngram", Speculation("ngram")), ("mtp:3", Speculation("mtp", 3)), (" NGRAM:1 ", Speculation("ngram", 1)),
    ("auto:4", Speculation("auto", 4)),
])
def test_spellings(text, want):
    assert parse_speculation(text) == want
    assert parse_speculation(str(want)) == want


@pytest.mark.parametrize("text, words", [
    ("always", ["'always'", "one of auto, off, mtp, ngram"]),
    ("mtp:5", ["'mtp:5'", "(got 5)", "from 1 to 4"]),
    ("mtp:0", ["(got 0)", "from 1 to 4"]),
    ("mtp:", ["(got '')", "from 1 to 4"]),
    ("mtp:two", ["(got 'two')", "whole number"]),
    ("off:2", ["'off:2'", "no draft count"]),
    ("", ["one of auto, off"]),
])
def test_bad_spellings_say_what_is_allowed(text, words, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["chat", "--speculate", text])
    assert e.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--speculate" in error and "MODE:DRAFTS" in error
    for word in words:
        assert word in error, (word, error)


def _pipe_chat(monkeypatch, home, argv):
    """Run `lampo chat ARGV` in pipe mode on a scripted backend; returns the speculation the
    backend was asked for."""
    monkeypatch.setenv("LAMPO_HOME", str(home))
    asked = []

    def backend(kind, model_dir, context, args, speculation):
        asked.append(speculation)
        return ScriptedBackend(["Hi."]), real_tokenizer()

    monkeypatch.setattr(chat_entry, "_backend", backend)
    monkeypatch.setattr(chat_entry, "_model_dir", lambda args, settings: home)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello"))
    assert chat_entry.run_chat(build_parser().parse_args(["chat", "--no-think", *argv])) == 0
    return asked[0]


def test_the_command_line_wins_over_the_settings_file(tmp_path, monkeypatch):
    assert _pipe_chat(monkeypatch, tmp_path, []) == Speculation()  # the default file: auto
    (tmp_path / "config" / "config.toml").write_text('[speculation]\nmode = "ngram"\ndrafts = 2\n')
    assert _pipe_chat(monkeypatch, tmp_path, []) == Speculation("ngram", 2)
    assert _pipe_chat(monkeypatch, tmp_path, ["--speculate", "off"]) == Speculation("off")


@pytest.mark.parametrize("speculation", [Speculation("mtp", 3), Speculation(), Speculation("off")])
def test_the_picker_hands_the_setting_and_the_voice_to_the_cuda_backend(monkeypatch, tmp_path, speculation):
    said, made = [], []
    monkeypatch.setattr(picker, "native_for", lambda kind, say: object())
    monkeypatch.setattr(cuda, "CudaBackend", lambda *args, **kw: made.append((kw["speculation"], kw["say"]))
                        or "the cuda backend")
    backend = picker.open_backend("cuda", tmp_path, context_max=4096, tokenizer=None, say=said.append,
                                  speculation=speculation)
    assert backend == "the cuda backend" and made == [(speculation, said.append)]  # it says what it runs
    assert said == []
