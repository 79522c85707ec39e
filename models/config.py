"""Model configuration: parse a HF `config.json` of the Qwen3.5/3.6 family.

Accepts the multimodal wrapper (`qwen3_5` / `qwen3_5_moe` with a nested `text_config`) or the
text model alone (`qwen3_5_text` / `qwen3_5_moe_text`). Everything the engine needs is a field or a
derived property of `ModelConfig`; the CUDA engine takes the object itself and reads them by these
names (native/src/bindings/engine_bindings.cpp). Each field is read and checked against the table of
`config_schema` (type, range, choices); then `validate` checks the relations between fields and
that every size the engine computes fits its 32-bit ints. Any problem raises one `ConfigError`
line naming the file (`load_config`), the field's JSON path, the value and what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from lampo.models.config_schema import (
    FAMILY_CONTEXT_MAX,
    FULL,
    INT32_MAX,
    LINEAR,
    ConfigError,
    check_ranges,
    read_text_config,
)

FUSED_ROW_PAD = 64  # the engine pads its fused projections' rows to a multiple of this


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # "qwen3_5" (dense) or "qwen3_5_moe" (normalised, without "_text")
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    max_position_embeddings: int = FAMILY_CONTEXT_MAX
    tie_word_embeddings: bool = False
    mtp_num_hidden_layers: int = 0
    # dense FFN
    intermediate_size: int | None = None
    # MoE FFN
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    name: str = field(default="", compare=False)

    # ---- derived -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.model_type == "qwen3_5_moe"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def q_proj_rows(self) -> int:
        """q_proj output rows: per head 256 query rows then 256 gate rows."""
        return self.num_attention_heads * self.head_dim * 2

    @property
    def attn_inner(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def attn_proj_rows(self) -> int:
        """Rows of the fused attention input projection q|gate, k, v."""
        return self.q_proj_rows + 2 * self.kv_width

    @property
    def gdn_proj_rows(self) -> int:
        """Rows of the fused GDN input projection qkv, z, b, a."""
        return self.conv_dim + self.value_dim + 2 * self.linear_num_value_heads

    @property
    def gdn_ratio(self) -> int:
        """V heads per QK head: V head j uses QK head j // gdn_ratio."""
        return self.linear_num_value_heads // self.linear_num_key_heads

    @property
    def full_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def real_vocab_size(self) -> int:
        """Ids at or above this are padding rows of the LM head (masked to -inf)."""
        return min(self.vocab_size, 248_077)

    def with_layers(self, n: int) -> "ModelConfig":
        """The same model cut to its first n layers (full-width shapes, fewer layers)."""
        return replace(self, num_hidden_layers=n, layer_types=self.layer_types[:n])

    # ---- (de)serialisation ---------------------------------------------------------------
    def to_text_config(self) -> dict[str, Any]:
        """A HF `text_config` dict that `from_dict` (and transformers) read back."""
        d: dict[str, Any] = {
            "model_type": self.model_type + "_text",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "full_attention_interval": 4,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "attn_output_gate": True,
            "attention_bias": False,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "mamba_ssm_dtype": "float32",
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "partial_rotary_factor": self.partial_rotary_factor,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": True,
            },
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "mtp_num_hidden_layers": self.mtp_num_hidden_layers,
            "mtp_use_dedicated_embeddings": False,
            "bos_token_id": 248044,
            "eos_token_id": 248044,
            "dtype": "bfloat16",
        }
        if self.is_moe:
            d.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                shared_expert_intermediate_size=self.shared_expert_intermediate_size,
            )
        else:
            d["intermediate_size"] = self.intermediate_size
        return d

    def to_hf_dict(self) -> dict[str, Any]:
        """A full multimodal-wrapper config.json, as the published checkpoints have."""
        arch = "Qwen3_5MoeForConditionalGeneration" if self.is_moe else "Qwen3_5ForConditionalGeneration"
        return {
            "architectures": [arch],
            "model_type": self.model_type,
            "tie_word_embeddings": self.tie_word_embeddings,
            "text_config": self.to_text_config(),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any], name: str = "") -> "ModelConfig":
        """Parse a config.json document; ConfigError naming the JSON path of the first bad field."""
        cfg = cls(**read_text_config(raw), name=name)
        cfg.validate()
        return cfg

    def engine_sizes(self) -> dict[str, int]:
        """The widths the engine computes in 32-bit ints (native/src/engine/model.h, ModelDims), before
        the zero-row padding of its fused projections (at most FUSED_ROW_PAD more)."""
        sizes = {
            "q_proj rows + 2 * kv_width (fused attention projection)": self.attn_proj_rows,
            "conv_dim + value_dim + 2 * linear_num_value_heads (fused GDN projection)": self.gdn_proj_rows,
        }
        if self.is_moe:
            sizes["2 * moe_intermediate_size"] = 2 * self.moe_intermediate_size
            sizes["2 * shared_expert_intermediate_size"] = 2 * self.shared_expert_intermediate_size
        else:
            sizes["2 * intermediate_size"] = 2 * (self.intermediate_size or 0)
        return sizes

    def validate(self) -> None:
        """Every field in its range (the table of `config_schema`), then the relations between them."""
        check_ranges({f.name: getattr(self, f.name) for f in fields(self)})
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= {FULL, LINEAR}:
            raise ConfigError(
                f"config: layer_types must be {self.num_hidden_layers} entries of {FULL!r} or {LINEAR!r}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"config: linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.rotary_dim < 2 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ConfigError(
                f"config: partial_rotary_factor {self.partial_rotary_factor} of head_dim {self.head_dim} gives "
                f"rotary dim {self.rotary_dim}, expected an even number in 2..head_dim"
            )
        if self.is_moe and self.num_experts_per_tok > self.num_experts:
            raise ConfigError(
                f"config: num_experts_per_tok ({self.num_experts_per_tok}) must be in 1..num_experts ({self.num_experts})"
            )
        for what, size in self.engine_sizes().items():
            if size > INT32_MAX - FUSED_ROW_PAD:
                raise ConfigError(f"config: {what} is {size:,}, more than the engine's 32-bit sizes allow "
                                  f"({INT32_MAX:,} less {FUSED_ROW_PAD} rows of padding)")


def load_config(path: str | Path) -> ModelConfig:
    """Read `config.json` from a checkpoint directory (or the file itself); every error is one
    ConfigError line naming the file."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config: {p} not found") from None
    except OSError as e:
        raise ConfigError(f"config: {p}: cannot read ({e.strerror or e})") from None
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"config: {p} is not UTF-8 text ({e})") from None
    except RecursionError:
        raise ConfigError(f"config: {p} is not valid JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, or an integer literal of more than 4,300 digits
        raise ConfigError(f"config: {p} is not valid JSON ({e})") from None
    try:
        return ModelConfig.from_dict(raw, name=p.parent.name)
    except ConfigError as e:
        raise ConfigError(f"config: {p}: {str(e).removeprefix('config: ')}") from None
