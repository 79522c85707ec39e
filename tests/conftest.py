"""Shared pytest fixtures.

Synthetic checkpoints (written once per test session, read-only for tests):
- `tiny_dense_dir`: `Path` of a `tiny-dense` preset checkpoint (`lampo.models.presets`: hidden 128,
  layers [GDN, GDN, GDN, full], the real 248,320-row vocabulary, one MTP layer), seed 0, one
  `model.safetensors` file, all tensors BF16, no tokenizer.json.
- `tiny_moe_dir`: the same for the `tiny-moe` preset (8 experts, top-2, shared expert).
Each is about 130 MB and takes a second or two to write. Their values are reproducible:
`lampo.models.synthetic.synthetic_tensor(name, spec, seed=0)` returns any tensor without reading it.
Open them with `lampo.models.checkpoint.Checkpoint.open(dir)`. Do not modify them; copy first.
- `qwen_dir`: the shared Qwen3.6 data folder (tokenizer.json, chat_template.jinja), or a skip.
- `gpu_script`: `gpu_script("timeline")` imports `tests/gpu/timeline.py` (the GPU scripts,
  whose host-side parts are tested here) once per session and returns the module.
"""

from __future__ import annotations

import importlib.util
import os
import sys

# The numpy reference does many small matrix products; a multi-threaded BLAS on a shared 2-core
# CI box spends more time spinning than computing (10 s vs 0.3 s for one golden test). Must be set
# before numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from lampo.models.presets import get_preset
from lampo.models.synthetic import write_checkpoint


# Property-based fuzzing (the hostile-input suite): derandomized, so CI runs the same examples every
# time; `--hypothesis-profile=deep` (or HYPOTHESIS_PROFILE=deep) runs 20x more of them.
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=4000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    """The released Qwen3.6 data (tokenizer.json, chat_template.jinja, configs): `$LAMPO_QWEN_DATA`,
    else `shared/qwen3.6` beside the repository, as CI lays it out; skips the test when absent."""
    candidates = [Path(__file__).resolve().parents[2] / "shared" / "qwen3.6"]
    if os.environ.get("LAMPO_QWEN_DATA"):
        candidates.insert(0, Path(os.environ["LAMPO_QWEN_DATA"]))
    for path in candidates:
        if (path / "tokenizer.json").is_file() and (path / "chat_template.jinja").is_file():
            return path
    pytest.skip("the Qwen3.6 data (tokenizer.json, chat_template.jinja) is not in $LAMPO_QWEN_DATA "
                "nor in shared/qwen3.6 beside the repository")


@pytest.fixture(scope="session")
def tiny_dense_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("tiny-dense"), get_preset("tiny-dense"), seed=0)


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("tiny-moe"), get_preset("tiny-moe"), seed=0)


@pytest.fixture(scope="session")
def gpu_script():
    def load(name: str):
        if f"gpu_{name}" not in sys.modules:
            spec = importlib.util.spec_from_file_location(f"gpu_{name}", Path(__file__).parent / "gpu" / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod  # dataclasses look their module up
            spec.loader.exec_module(mod)
        return sys.modules[f"gpu_{name}"]

    return load

