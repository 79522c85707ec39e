"""The dependency direction of the tree: app -> models -> nothing.

`models/` (installed as `lampo.models`) describes the model family and may import only itself; the
engine front (`lampo.engine`) and the store (`lampo.store`) know no user interface. Read from the
sources' import statements (module level and inside functions alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lampo_imports(folder: Path) -> list[tuple[str, str]]:
    """(file, imported module) for every absolute `lampo...` import under `folder`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "lampo"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [(str(path.relative_to(ROOT)), n) for n in names if n.split(".")[0] == "lampo"]
    return found


def test_models_import_only_models():
    wrong = [(f, m) for f, m in lampo_imports(ROOT / "models") if not m.startswith("lampo.models")
             and m != "lampo"]
    assert wrong == []


@pytest.mark.parametrize("package", ["engine", "store"])
def test_engine_and_store_know_no_user_interface(package):
    ui = ("lampo.tui", "lampo.plain", "lampo.cli", "lampo.chat_entry", "lampo.chat_session")
    wrong = [(f, m) for f, m in lampo_imports(ROOT / "app" / "lampo" / package) if m.startswith(ui)]
    assert wrong == []


def test_the_check_sees_imports():
    assert ("app/lampo/engine/cuda.py", "lampo.models.config") in lampo_imports(ROOT / "app" / "lampo" / "engine")
