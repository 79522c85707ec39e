"""A config directory that cannot be written is one line and the chat runs on the default
settings (it used to stop Lampo); a settings file that exists but is invalid still stops it."""

from __future__ import annotations

import io
import sys

import pytest
from helpers import real_tokenizer
from helpers.scripted_backend import ScriptedBackend

from lampo import chat_entry
from lampo.cli import build_parser
from lampo.settings import SettingsUnsaved, load_settings


def test_no_settings_file_and_no_way_to_write_one_is_settings_unsaved(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the config directory should be")
    with pytest.raises(SettingsUnsaved, match=r"the settings file cannot be created .*using the default settings"):
        load_settings(blocker / "config.toml")


def _pipe_chat(monkeypatch, home, text="hello"):
    monkeypatch.setenv("LAMPO_HOME", str(home))
    backend = ScriptedBackend(["Hi."])
    monkeypatch.setattr(chat_entry, "_backend", lambda kind, model_dir, context, args, speculation: (backend, real_tokenizer()))
    monkeypatch.setattr(chat_entry, "_model_dir", lambda args, settings: home)
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))  # not a terminal: pipe mode
    return chat_entry.run_chat(build_parser().parse_args(["chat", "--no-think"]))


def test_an_uncreatable_config_directory_runs_the_chat_on_the_defaults(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config").write_text("a file where the config directory should be")
    assert _pipe_chat(monkeypatch, home) == 0
    out, err = capsys.readouterr()
    assert out == "Hi.\n"
    first = err.splitlines()[0]
    assert first.startswith(f"lampo: {home / 'config' / 'config.toml'}: the settings file cannot be created")
    assert first.endswith("using the default settings, and changes to them will not be saved")
    assert "Traceback" not in err


def test_an_invalid_settings_file_still_stops_lampo(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("context = 5\n")
    assert _pipe_chat(monkeypatch, home) == 1
    assert "context = 5 is invalid" in capsys.readouterr().err

