"""Full-width synthetic checkpoints for the GPU tests (tests/cuda/test_engine.py).

The real hidden size and per-layer shapes of Qwen3.6-35B-A3B and Qwen3.6-27B, cut to 4 layers
[GDN, GDN, GDN, attention], with a 32,768-row vocabulary and (35B-A3B) 64 of the 256 experts (top-8
kept), so that writing them and running the numpy reference over them take seconds, not minutes
(the full 248,320-row LM head and all 256 experts are exercised by the tiny models and by
`lampo bench` respectively). tests/gpu/run.sh writes them while the extension builds:

    python3 tests/gpu/full_width.py DIR PRESET [RECIPE]   # -> DIR/PRESET, or DIR/PRESET-RECIPE

With a recipe the checkpoint is written in the converted LQ format (random codes and scales).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from lampo.models.config import ModelConfig
from lampo.models.presets import get_preset
from lampo.models.synthetic import write_checkpoint

PRESETS = ("qwen3.6-35b-a3b", "qwen3.6-27b")
LAYERS = 4
VOCAB = 32_768
EXPERTS = 64
SEED = 3


def full_width_config(preset: str) -> ModelConfig:
    cfg = replace(get_preset(preset).with_layers(LAYERS), vocab_size=VOCAB, name=f"{preset}-{LAYERS}l")
    return replace(cfg, num_experts=EXPERTS) if cfg.is_moe else cfg


def write(root: Path, preset: str, recipe: str | None = None) -> Path:
    name = preset if recipe is None else f"{preset}-{recipe}"
    return write_checkpoint(Path(root) / name, full_width_config(preset), seed=SEED, with_mtp=False,
                            shard_mb=8000, recipe=recipe)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[2] not in PRESETS:
        sys.exit(f"usage: {sys.argv[0]} DIR {{{','.join(PRESETS)}}} [RECIPE]")
    print(write(Path(sys.argv[1]), sys.argv[2], *sys.argv[3:]))
