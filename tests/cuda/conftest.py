"""GPU tests: every item under tests/cuda/ is marked `cuda` (deselected by default through
`addopts = -m 'not cuda'`) and skipped unless the `lampo._native` extension imports and sees a
CUDA device. The per-op tests (the `ops` fixture) also need `lampo._native_ops`, the op-test
bindings, which only a build configured with -DLAMPO_OP_TESTS=ON has (tests/gpu/run.sh builds it).
Run them on a machine with an NVIDIA GPU with `python -m pytest -m cuda tests/cuda`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _native_status() -> str | None:
    """None when the extension and a device are available, else the reason to skip."""
    try:
        from lampo import _native
    except ImportError as e:
        return f"lampo._native is not built ({e})"
    if _native.device_count() == 0:
        return "no CUDA device visible"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    if not mine:
        return
    reason = _native_status()
    for item in mine:
        item.add_marker(pytest.mark.cuda)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def ops():
    """The per-op test bindings, `lampo._native_ops` (skips the test when that module is not built)."""
    try:
        from lampo import _native_ops
    except ImportError as e:
        pytest.skip(f"lampo._native_ops is not built (configure native/ with -DLAMPO_OP_TESTS=ON): {e}")
    return _native_ops
