"""Model configuration: parse a HF `config.json` of the Qwen3.5/3.6 family.

Accepts the multimodal wrapper (`qwen3_5` / `qwen3_5_moe` with a nested `text_config`) or the
text model alone (`qwen3_5_text` / `qwen3_5_moe_text`). Everything the engine needs is a field or a
derived property of `ModelConfig`; unsupported values raise `ConfigError` naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DENSE_TYPES = ("qwen3_5", "qwen3_5_text")
MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
LINEAR = "linear_attention"
FULL = "full_attention"


class ConfigError(ValueError):
    """A config.json that Lampo cannot run, with the offending field named."""


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
    max_position_embeddings: int = 262_144
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
        top_type = raw.get("model_type")
        text = raw.get("text_config", raw)
        if not isinstance(text, dict):
            raise ConfigError("config: 'text_config' must be an object")
        mtype = text.get("model_type", top_type)
        if mtype not in DENSE_TYPES + MOE_TYPES:
            raise ConfigError(
                f"config: model_type {mtype!r} is not supported "
                f"(Lampo runs {', '.join(DENSE_TYPES + MOE_TYPES)})"
            )
        is_moe = mtype in MOE_TYPES

        def need(key: str) -> Any:
            if key not in text:
                raise ConfigError(f"config: required field text_config.{key} is missing")
            return text[key]

        n_layers = int(need("num_hidden_layers"))
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = int(text.get("full_attention_interval", 4))
            layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]
        layer_types = tuple(layer_types)
        if len(layer_types) != n_layers:
            raise ConfigError(
                f"config: layer_types has {len(layer_types)} entries but num_hidden_layers is {n_layers}"
            )
        bad = sorted(set(layer_types) - {FULL, LINEAR})
        if bad:
            raise ConfigError(f"config: layer_types contains unsupported values {bad}")

        rope = text.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise ConfigError(f"config: rope_parameters.rope_type {rope['rope_type']!r} is not supported")
        act = text.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"config: hidden_act {act!r} is not supported (only 'silu')")
        if text.get("attn_output_gate", True) is not True:
            raise ConfigError("config: attn_output_gate must be true for this family")
        if text.get("attention_bias", False):
            raise ConfigError("config: attention_bias=true is not supported")
        if text.get("mtp_use_dedicated_embeddings", False):
            raise ConfigError("config: mtp_use_dedicated_embeddings=true is not supported")

        partial = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
        cfg = cls(
            model_type="qwen3_5_moe" if is_moe else "qwen3_5",
            hidden_size=int(need("hidden_size")),
            num_hidden_layers=n_layers,
            layer_types=layer_types,
            num_attention_heads=int(need("num_attention_heads")),
            num_key_value_heads=int(need("num_key_value_heads")),
            head_dim=int(text.get("head_dim", 256)),
            linear_num_key_heads=int(need("linear_num_key_heads")),
            linear_num_value_heads=int(need("linear_num_value_heads")),
            linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
            vocab_size=int(need("vocab_size")),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10_000_000.0))),
            partial_rotary_factor=partial,
            max_position_embeddings=int(text.get("max_position_embeddings", 262_144)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers", 0)),
            intermediate_size=None if is_moe else int(need("intermediate_size")),
            num_experts=int(need("num_experts")) if is_moe else 0,
            num_experts_per_tok=int(need("num_experts_per_tok")) if is_moe else 0,
            moe_intermediate_size=int(need("moe_intermediate_size")) if is_moe else 0,
            shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size", 0)) if is_moe else 0,
            name=name,
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise ConfigError(f"config: {f.name} must not be negative (got {v})")
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
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ConfigError(f"config: partial_rotary_factor gives an invalid rotary dim {self.rotary_dim}")
        if self.tie_word_embeddings:
            raise ConfigError("config: tie_word_embeddings=true is not supported (Qwen3.6 has an untied lm_head)")
        if self.mtp_num_hidden_layers > 1:
            raise ConfigError(f"config: mtp_num_hidden_layers={self.mtp_num_hidden_layers} (only 0 or 1 supported)")
        if self.is_moe and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ConfigError(
                f"config: num_experts_per_tok ({self.num_experts_per_tok}) must be in 1..num_experts ({self.num_experts})"
            )


def load_config(path: str | Path) -> ModelConfig:
    """Read `config.json` from a checkpoint directory (or the file itself)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config: {p} not found") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"config: {p} is not valid JSON ({e})") from None
    return ModelConfig.from_dict(raw, name=p.parent.name)
