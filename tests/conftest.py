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
"""

from __future__ import annotations

import os

# The numpy reference does many small matrix products; a multi-threaded BLAS on a shared 2-core
# CI box spends more time spinning than computing (10 s vs 0.3 s for one golden test). Must be set
# before numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from lampo.models.presets import get_preset
from lampo.models.synthetic import write_checkpoint


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    """`shared/qwen3.6` (real tokenizer.json, chat_template.jinja, configs) beside the repository,
    as CI lays it out; skips the test when it is absent."""
    for root in (Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")):
        path = root / "qwen3.6"
        if (path / "tokenizer.json").is_file() and (path / "chat_template.jinja").is_file():
            return path
    pytest.skip("shared/qwen3.6 (tokenizer.json, chat_template.jinja) not found beside the repository")


@pytest.fixture(scope="session")
def tiny_dense_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("tiny-dense"), get_preset("tiny-dense"), seed=0)


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("tiny-moe"), get_preset("tiny-moe"), seed=0)
