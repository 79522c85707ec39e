"""Fixtures for the TUI tests: an isolated LAMPO_HOME, and apps on a scripted or real backend.

`make_app(backend, **app_kwargs)` builds a `LampoApp` over a fresh `ChatSession` (the real
Qwen3.6 tokenizer, the store and settings under the test's LAMPO_HOME), with fixed clocks so
nothing in a screenshot depends on the time the test ran.
"""

from __future__ import annotations

import pytest
from helpers import real_tokenizer
from tui_helpers import FIXED_WALL_CLOCK

from lampo import paths
from lampo.chat_session import ChatSession
from lampo.settings import load_settings
from lampo.store import Store
from lampo.tui.app import LampoApp



@pytest.fixture
def lampo_home(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def make_app(lampo_home, tmp_path):
    stores: list[Store] = []

    def make(backend, **app_kwargs) -> LampoApp:
        settings = load_settings()
        store = Store()
        stores.append(store)
        session = ChatSession(backend, real_tokenizer(), store, sampling=settings.sampling,
                              thinking=settings.thinking)
        app_kwargs.setdefault("export_dir", tmp_path)
        app_kwargs.setdefault("clock", lambda: 100.0)
        app_kwargs.setdefault("wall_clock", lambda: FIXED_WALL_CLOCK)
        return LampoApp(session, settings, **app_kwargs)

    yield make
    for store in stores:
        store.close()



def pytest_collect_file(file_path, parent):
    """The bench_*.py scripts hold CPU tests of their harnesses (their names say what they are):
    collect them."""
    if file_path.name.startswith("bench_") and file_path.suffix == ".py":
        return pytest.Module.from_parent(parent, path=file_path)
