"""Checkpoints in the layout of Qwen's FP8 releases, and their bf16 twins, for the FP8 tests."""

from __future__ import annotations

import json
from pathlib import Path

from lampo.models.checkpoint import SINGLE_NAME, Checkpoint

from .safetensors_file import write_safetensors


def bf16_twin(src: Path, out: Path) -> Path:
    """The checkpoint `src` rewritten in the bf16 release's layout (fused expert banks, no FP8)
    with exactly the weights Lampo reads from it: every tensor as `Checkpoint.raw` gives it."""
    with Checkpoint.open(src) as ck:
        tensors = {n: ck.raw(n) for n in ck.names()}
        specs = {n: ck.spec(n) for n in ck.names()}
        config = json.loads((ck.model_dir / "config.json").read_text(encoding="utf-8"))
    config.pop("quantization_config", None)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    write_safetensors(out / SINGLE_NAME,
                      {n: (specs[n].dtype, specs[n].shape, data.tobytes()) for n, data in tensors.items()})
    return out
