"""Where Lampo keeps its files: platformdirs locations, or everything under `$LAMPO_HOME`.

`LAMPO_HOME` (used by tests and portable installs) puts config/, data/ and cache/ under one
directory. Each function creates its directory (mode 0o700) on first use.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "lampo"
HOME_ENV = "LAMPO_HOME"


def _dir(kind: str) -> Path:
    home = os.environ.get(HOME_ENV)
    if home:
        path = Path(home).expanduser() / kind
    else:
        path = Path({
            "config": platformdirs.user_config_dir,
            "data": platformdirs.user_data_dir,
            "cache": platformdirs.user_cache_dir,
        }[kind](APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def config_dir() -> Path:
    return _dir("config")


def data_dir() -> Path:
    return _dir("data")


def cache_dir() -> Path:
    return _dir("cache")


def config_file() -> Path:
    return config_dir() / "config.toml"


def database_file() -> Path:
    return data_dir() / "lampo.sqlite3"


def history_file() -> Path:
    """prompt_toolkit input history of plain mode."""
    return data_dir() / "plain_history"
