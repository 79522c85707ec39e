"""Where Lampo keeps its files: platformdirs locations, or everything under `$LAMPO_HOME`.

`LAMPO_HOME` (used by tests and portable installs) puts config/, data/ and cache/ under one
directory. Each function creates its directory (mode 0o700) on first use; one that cannot be
created raises `DirectoryError` (an OSError) whose message names it and where it came
from (`config_file` alone still answers: see there).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "lampo"
HOME_ENV = "LAMPO_HOME"


class DirectoryError(OSError):
    """One of Lampo's directories cannot be created (`path` is the directory)."""

    def __init__(self, kind: str, path: Path, cause: OSError):
        source = f"under ${HOME_ENV}" if os.environ.get(HOME_ENV) else "the platform's default"
        super().__init__(f"Lampo's {kind} directory {path} ({source}) cannot be created: {cause.strerror or cause}")
        self.errno, self.path = cause.errno, path


def _location(kind: str) -> Path:
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home).expanduser() / kind
    return Path({
        "config": platformdirs.user_config_dir,
        "data": platformdirs.user_data_dir,
        "cache": platformdirs.user_cache_dir,
    }[kind](APP_NAME, appauthor=False))


def _dir(kind: str) -> Path:
    path = _location(kind)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:  # read-only, not a directory, no permission
        raise DirectoryError(kind, path, e) from None
    return path


def config_dir() -> Path:
    return _dir("config")


def data_dir() -> Path:
    return _dir("data")


def cache_dir() -> Path:
    return _dir("cache")


def config_file() -> Path:
    """Where the settings file is. Its directory is created when it can be; when it cannot, the
    path is still given (for messages), and writing the file says why it failed."""
    try:
        return config_dir() / "config.toml"
    except DirectoryError as e:
        return e.path / "config.toml"


def database_file() -> Path:
    return data_dir() / "lampo.sqlite3"


def tokenizer_file() -> Path:
    """The Qwen3.6 tokenizer.json in the cache folder, built there on first use (a few seconds)."""
    from lampo.models.tokenizer import ensure_tokenizer_json

    return ensure_tokenizer_json(cache_dir() / "tokenizer" / "qwen3.6-tokenizer.json")


def backend_log_file() -> Path:
    """What the chat's backend process prints (engine/process_backend.py)."""
    return cache_dir() / "backend.log"


def history_file() -> Path:
    """prompt_toolkit input history of plain mode."""
    return data_dir() / "plain_history"
