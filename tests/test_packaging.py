"""The installed distribution: one top-level package, `lampo`, with the model code and assets
inside it (no generic top-level `app` / `models` modules leak into site-packages)."""

from __future__ import annotations

import importlib.metadata

import pytest


def _installed_files():
    files = importlib.metadata.files("lampo")
    if files is None:
        pytest.skip("lampo is not installed as a distribution")
    names = [f.as_posix() for f in files]
    if any("editable" in n for n in names):
        pytest.skip("an editable install maps the source folders; checked on a regular install (CI)")
    return names


def test_only_lampo_is_installed_at_the_top_level():
    tops = set()
    for name in _installed_files():
        first = name.split("/")[0]
        if first == ".." or first.endswith(".dist-info"):
            continue  # console script, metadata
        tops.add(first if "/" in name else first.removesuffix(".py"))
    assert tops == {"lampo"}, f"unexpected top-level entries: {sorted(tops - {'lampo'})}"


def test_models_and_assets_install_under_lampo():
    names = set(_installed_files())
    for required in ("lampo/cli.py", "lampo/models/config.py", "lampo/models/reference/model.py",
                     "lampo/models/configs/qwen3.6-35b-a3b.json", "lampo/assets/styles/lampo.tcss"):
        assert required in names, f"{required} missing from the installed distribution"
