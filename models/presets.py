"""Named model configurations: the two real Qwen3.6 checkpoints and two tiny test models.

`qwen3.6-35b-a3b` / `qwen3.6-27b` are read from the published config.json files shipped in
`lampo/models/configs/`. `tiny-dense` / `tiny-moe` keep the real per-head geometry (head_dim 256,
rotary 64, GDN dk = dv = 128, conv 4) and the real 248,320-row vocabulary but are only 128 wide and
4 layers deep ([GDN, GDN, GDN, full]) with one MTP layer, so that tests exercise every real kernel
shape cheaply.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lampo.models.config import FULL, LINEAR, ConfigError, ModelConfig, load_config

CONFIG_DIR = Path(__file__).parent / "configs"
SHIPPED = {"qwen3.6-35b-a3b": "qwen3.6-35b-a3b.json", "qwen3.6-27b": "qwen3.6-27b.json"}
PRESETS = ("tiny-dense", "tiny-moe", *SHIPPED)


def _tiny(name: str, moe: bool) -> ModelConfig:
    ffn = (
        dict(model_type="qwen3_5_moe", num_experts=8, num_experts_per_tok=2,
             moe_intermediate_size=64, shared_expert_intermediate_size=64)
        if moe
        else dict(model_type="qwen3_5", intermediate_size=256)
    )
    cfg = ModelConfig(
        hidden_size=128,
        num_hidden_layers=4,
        layer_types=(LINEAR, LINEAR, LINEAR, FULL),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        vocab_size=248_320,
        mtp_num_hidden_layers=1,
        name=name,
        **ffn,
    )
    cfg.validate()
    return cfg


def get_preset(name: str) -> ModelConfig:
    """The ModelConfig of a preset name (see PRESETS); ConfigError listing the names otherwise."""
    if name == "tiny-dense":
        return _tiny(name, moe=False)
    if name == "tiny-moe":
        return _tiny(name, moe=True)
    if name in SHIPPED:
        return replace(load_config(CONFIG_DIR / SHIPPED[name]), name=name)
    raise ConfigError(f"unknown model preset {name!r} (presets: {', '.join(PRESETS)})")
