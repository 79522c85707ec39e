"""Every tensor the text engine reads from a Qwen3.5/3.6 checkpoint: HF name, shape, dtype.

Names and shapes follow the published checkpoints (architecture doc §3): linear weights are
[out, in]; the MoE expert banks are fused 3-D tensors without a `.weight` suffix
(`mlp.experts.gate_up_proj` [E, 2I, H], rows 0..I-1 gate then I..2I-1 up; `mlp.experts.down_proj`
[E, H, I]); the GDN conv weight is [conv_dim, 1, K]. Matrices must be BF16; 1-D tensors (norm
weights, `A_log`, `dt_bias`) may be BF16 or F32, since published checkpoints differ there.
`model.visual.*` and anything else not listed is not needed by the text engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lampo.models.config import FULL, LINEAR, ModelConfig
from lampo.models.safetensors_io import DTYPE_BYTES

BF16 = "BF16"
F32 = "F32"
MATRIX_DTYPES = frozenset({BF16})
VECTOR_DTYPES = frozenset({BF16, F32})

TEXT_PREFIX = "model.language_model."
EMBED = TEXT_PREFIX + "embed_tokens.weight"
FINAL_NORM = TEXT_PREFIX + "norm.weight"
LM_HEAD = "lm_head.weight"
MTP_PREFIX = "mtp."
ROUTED_EXPERT_TENSORS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: `dtype` is the one checkpoints normally store (and the synthetic writer uses);
    `allowed_dtypes` is what a reader accepts."""

    shape: tuple[int, ...]
    dtype: str = BF16
    allowed_dtypes: frozenset[str] = MATRIX_DTYPES

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    def accepts(self, dtype: str) -> bool:
        return dtype in self.allowed_dtypes


def _matrix(*shape: int) -> TensorSpec:
    return TensorSpec(tuple(shape))


def _vector(n: int) -> TensorSpec:
    return TensorSpec((n,), BF16, VECTOR_DTYPES)


def layer_prefix(i: int) -> str:
    return f"{TEXT_PREFIX}layers.{i}."


def mtp_layer_prefix(i: int) -> str:
    return f"{MTP_PREFIX}layers.{i}."


def is_mtp(name: str) -> bool:
    return name.startswith(MTP_PREFIX)


# ---- parts of one decoder layer (names relative to the layer prefix) -------------------------
def attention_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Gated full attention (`self_attn.*`): q_proj rows are per head [query | gate]."""
    h, d = cfg.hidden_size, cfg.head_dim
    return {
        "self_attn.q_proj.weight": _matrix(cfg.q_proj_rows, h),
        "self_attn.k_proj.weight": _matrix(cfg.kv_width, h),
        "self_attn.v_proj.weight": _matrix(cfg.kv_width, h),
        "self_attn.q_norm.weight": _vector(d),
        "self_attn.k_norm.weight": _vector(d),
        "self_attn.o_proj.weight": _matrix(h, cfg.attn_inner),
    }


def gdn_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Gated DeltaNet (`linear_attn.*`): four separate input projections, depthwise conv."""
    h, hv = cfg.hidden_size, cfg.linear_num_value_heads
    return {
        "linear_attn.in_proj_qkv.weight": _matrix(cfg.conv_dim, h),
        "linear_attn.in_proj_z.weight": _matrix(cfg.value_dim, h),
        "linear_attn.in_proj_a.weight": _matrix(hv, h),
        "linear_attn.in_proj_b.weight": _matrix(hv, h),
        "linear_attn.conv1d.weight": _matrix(cfg.conv_dim, 1, cfg.linear_conv_kernel_dim),
        "linear_attn.A_log": _vector(hv),
        "linear_attn.dt_bias": _vector(hv),
        "linear_attn.norm.weight": _vector(cfg.linear_value_head_dim),
        "linear_attn.out_proj.weight": _matrix(h, cfg.value_dim),
    }


def ffn_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Dense SwiGLU, or the sparse MoE block (router, fused expert banks, gated shared expert)."""
    h = cfg.hidden_size
    if not cfg.is_moe:
        i = cfg.intermediate_size
        return {
            "mlp.gate_proj.weight": _matrix(i, h),
            "mlp.up_proj.weight": _matrix(i, h),
            "mlp.down_proj.weight": _matrix(h, i),
        }
    e, i, s = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    return {
        "mlp.gate.weight": _matrix(e, h),
        "mlp.experts.gate_up_proj": _matrix(e, 2 * i, h),
        "mlp.experts.down_proj": _matrix(e, h, i),
        "mlp.shared_expert.gate_proj.weight": _matrix(s, h),
        "mlp.shared_expert.up_proj.weight": _matrix(s, h),
        "mlp.shared_expert.down_proj.weight": _matrix(h, s),
        "mlp.shared_expert_gate.weight": _matrix(1, h),
    }


def decoder_layer_tensors(cfg: ModelConfig, layer_type: str) -> dict[str, TensorSpec]:
    """One whole decoder layer: both pre-norms, the mixer of `layer_type`, the FFN."""
    if layer_type not in (FULL, LINEAR):
        raise ValueError(f"unknown layer type {layer_type!r}")
    mixer = attention_tensors(cfg) if layer_type == FULL else gdn_tensors(cfg)
    return {
        "input_layernorm.weight": _vector(cfg.hidden_size),
        **mixer,
        "post_attention_layernorm.weight": _vector(cfg.hidden_size),
        **ffn_tensors(cfg),
    }


def mtp_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """The MTP module (full names): input norms, fc [H, 2H], full-attention layers, final norm;
    empty when the config has no MTP layer."""
    if cfg.mtp_num_hidden_layers == 0:
        return {}
    h = cfg.hidden_size
    out = {
        MTP_PREFIX + "pre_fc_norm_embedding.weight": _vector(h),
        MTP_PREFIX + "pre_fc_norm_hidden.weight": _vector(h),
        MTP_PREFIX + "fc.weight": _matrix(h, 2 * h),
    }
    for i in range(cfg.mtp_num_hidden_layers):
        for rel, spec in decoder_layer_tensors(cfg, FULL).items():
            out[mtp_layer_prefix(i) + rel] = spec
    out[MTP_PREFIX + "norm.weight"] = _vector(h)
    return out


def expected_tensors(cfg: ModelConfig, include_mtp: bool = True) -> dict[str, TensorSpec]:
    """All tensors the text engine needs, in a canonical order: embedding, layers 0..L-1, final
    norm, lm_head, then (if `include_mtp` and the config has an MTP layer) the MTP module."""
    out = {EMBED: _matrix(cfg.vocab_size, cfg.hidden_size)}
    for i, layer_type in enumerate(cfg.layer_types):
        for rel, spec in decoder_layer_tensors(cfg, layer_type).items():
            out[layer_prefix(i) + rel] = spec
    out[FINAL_NORM] = _vector(cfg.hidden_size)
    out[LM_HEAD] = _matrix(cfg.vocab_size, cfg.hidden_size)
    if include_mtp:
        out.update(mtp_tensors(cfg))
    return out
