"""Every tensor the text engine reads from a Qwen3.5/3.6 checkpoint: HF name, shape, dtype.

Names and shapes follow the published checkpoints (architecture doc §3): linear weights are
[out, in]; the MoE expert banks are fused 3-D tensors without a `.weight` suffix
(`mlp.experts.gate_up_proj` [E, 2I, H], rows 0..I-1 gate then I..2I-1 up; `mlp.experts.down_proj`
[E, H, I]; `expert_parts` names the per-expert matrices a checkpoint may hold instead, as the FP8
releases do); the GDN conv weight is [conv_dim, 1, K]. Matrices must be BF16; 1-D tensors (norm
weights, `A_log`, `dt_bias`) may be BF16 or F32, since published checkpoints differ there.
`model.visual.*` and anything else not listed is not needed by the text engine.

Each tensor of the text model has a role (the engine's word for it, e.g. `attn.q`); the tables
`model_roles` and `decoder_layer_roles` pair each role with its name and spec, and are the one
place where a name is spelled: `expected_tensors` lists them by name (what a checkpoint must hold)
and `engine_tensor_names` gives the CUDA engine its names by role (the engine spells none).
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
LAYER_PREFIX = TEXT_PREFIX + "layers.{layer}."  # {layer}: the layer index
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
    return LAYER_PREFIX.format(layer=i)


# The MTP module's tensors outside its decoder layer, "mtp.<part>.weight" (the engine's roles "mtp.<part>").
MTP_PARTS = ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "norm")


def mtp_layer_prefix(i: int) -> str:
    return f"{MTP_PREFIX}layers.{i}."


def is_mtp(name: str) -> bool:
    return name.startswith(MTP_PREFIX)


# ---- the tables: role -> (name, spec) ---------------------------------------------------------
# A role is the engine's word for a tensor (native/src/weights/weights.cpp plans its weights by
# role, after native/src/engine/model.h's structs); these tables are the one place where a
# checkpoint name is spelled. Per-layer names are relative to the layer prefix.
Roles = dict[str, tuple[str, TensorSpec]]


def model_roles(cfg: ModelConfig) -> Roles:
    """The tensors outside the decoder layers (full names)."""
    v, h = cfg.vocab_size, cfg.hidden_size
    return {
        "embed": (EMBED, _matrix(v, h)),
        "final_norm": (FINAL_NORM, _vector(h)),
        "lm_head": (LM_HEAD, _matrix(v, h)),
    }


def attention_roles(cfg: ModelConfig) -> Roles:
    """Gated full attention (`self_attn.*`): q_proj rows are per head [query | gate]."""
    h, d = cfg.hidden_size, cfg.head_dim
    return {
        "attn.q": ("self_attn.q_proj.weight", _matrix(cfg.q_proj_rows, h)),
        "attn.k": ("self_attn.k_proj.weight", _matrix(cfg.kv_width, h)),
        "attn.v": ("self_attn.v_proj.weight", _matrix(cfg.kv_width, h)),
        "attn.q_norm": ("self_attn.q_norm.weight", _vector(d)),
        "attn.k_norm": ("self_attn.k_norm.weight", _vector(d)),
        "attn.o": ("self_attn.o_proj.weight", _matrix(h, cfg.attn_inner)),
    }


def gdn_roles(cfg: ModelConfig) -> Roles:
    """Gated DeltaNet (`linear_attn.*`): four separate input projections, depthwise conv."""
    h, hv = cfg.hidden_size, cfg.linear_num_value_heads
    return {
        "gdn.qkv": ("linear_attn.in_proj_qkv.weight", _matrix(cfg.conv_dim, h)),
        "gdn.z": ("linear_attn.in_proj_z.weight", _matrix(cfg.value_dim, h)),
        "gdn.a": ("linear_attn.in_proj_a.weight", _matrix(hv, h)),
        "gdn.b": ("linear_attn.in_proj_b.weight", _matrix(hv, h)),
        "gdn.conv": ("linear_attn.conv1d.weight", _matrix(cfg.conv_dim, 1, cfg.linear_conv_kernel_dim)),
        "gdn.A_log": ("linear_attn.A_log", _vector(hv)),
        "gdn.dt_bias": ("linear_attn.dt_bias", _vector(hv)),
        "gdn.norm": ("linear_attn.norm.weight", _vector(cfg.linear_value_head_dim)),
        "gdn.out": ("linear_attn.out_proj.weight", _matrix(h, cfg.value_dim)),
    }


def ffn_roles(cfg: ModelConfig) -> Roles:
    """Dense SwiGLU, or the sparse MoE block (router, fused expert banks, gated shared expert)."""
    h = cfg.hidden_size
    if not cfg.is_moe:
        i = cfg.intermediate_size
        return {
            "dense.gate": ("mlp.gate_proj.weight", _matrix(i, h)),
            "dense.up": ("mlp.up_proj.weight", _matrix(i, h)),
            "dense.down": ("mlp.down_proj.weight", _matrix(h, i)),
        }
    e, i, s = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    return {
        "moe.router": ("mlp.gate.weight", _matrix(e, h)),
        "moe.experts_gate_up": (ROUTED_EXPERT_TENSORS[0], _matrix(e, 2 * i, h)),
        "moe.experts_down": (ROUTED_EXPERT_TENSORS[1], _matrix(e, h, i)),
        "moe.shared_expert.gate": ("mlp.shared_expert.gate_proj.weight", _matrix(s, h)),
        "moe.shared_expert.up": ("mlp.shared_expert.up_proj.weight", _matrix(s, h)),
        "moe.shared_expert.down": ("mlp.shared_expert.down_proj.weight", _matrix(h, s)),
        "moe.shared_gate": ("mlp.shared_expert_gate.weight", _matrix(1, h)),
    }


def decoder_layer_roles(cfg: ModelConfig, layer_type: str) -> Roles:
    """One whole decoder layer: both pre-norms, the mixer of `layer_type`, the FFN."""
    if layer_type not in (FULL, LINEAR):
        raise ValueError(f"unknown layer type {layer_type!r}")
    mixer = attention_roles(cfg) if layer_type == FULL else gdn_roles(cfg)
    return {
        "input_norm": ("input_layernorm.weight", _vector(cfg.hidden_size)),
        **mixer,
        "post_norm": ("post_attention_layernorm.weight", _vector(cfg.hidden_size)),
        **ffn_roles(cfg),
    }


def engine_tensor_names(cfg: ModelConfig, mtp: bool = False) -> dict[str, str]:
    """Role -> checkpoint name of every tensor the engine loads for `cfg` (the `tensor_names` of
    `lampo._native.Engine`); a per-layer name is a template holding `{layer}`. With `mtp` (and an
    MTP layer in the config) also the MTP module's: "mtp.fc" ... and its layer's roles as
    "mtp.layer.<role>"."""
    names = {role: name for role, (name, _spec) in model_roles(cfg).items()}
    for layer_type in dict.fromkeys(cfg.layer_types):
        for role, (rel, _spec) in decoder_layer_roles(cfg, layer_type).items():
            names[role] = LAYER_PREFIX + rel
    if mtp and cfg.mtp_num_hidden_layers:
        names.update({f"mtp.{part}": f"{MTP_PREFIX}{part}.weight" for part in MTP_PARTS})
        for role, (rel, _spec) in decoder_layer_roles(cfg, FULL).items():
            names[f"mtp.layer.{role}"] = mtp_layer_prefix(0) + rel
    return names


# ---- the same tables by name (relative to the layer prefix) ----------------------------------
def _by_name(roles: Roles) -> dict[str, TensorSpec]:
    return dict(roles.values())


def attention_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    return _by_name(attention_roles(cfg))


def gdn_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    return _by_name(gdn_roles(cfg))


def ffn_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    return _by_name(ffn_roles(cfg))


def decoder_layer_tensors(cfg: ModelConfig, layer_type: str) -> dict[str, TensorSpec]:
    return _by_name(decoder_layer_roles(cfg, layer_type))


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


def expert_parts(name: str, spec: TensorSpec) -> list[tuple[str, TensorSpec]] | None:
    """The per-expert matrices whose rows, in order, make the fused expert bank `name` of `spec`
    (`experts.{e}.gate_proj.weight` then `experts.{e}.up_proj.weight` for each e of gate_up_proj
    [E, 2I, H]; `experts.{e}.down_proj.weight` of down_proj [E, H, I]); None for any other tensor."""
    gate_up, down = (n.rpartition(".")[2] for n in ROUTED_EXPERT_TENSORS)
    base, _, leaf = name.rpartition(".")
    if not base.endswith("mlp.experts") or leaf not in (gate_up, down):
        return None
    e, rows, cols = spec.shape
    if leaf == gate_up:
        part = _matrix(rows // 2, cols)
        return [(f"{base}.{i}.{proj}_proj.weight", part) for i in range(e) for proj in ("gate", "up")]
    return [(f"{base}.{i}.down_proj.weight", _matrix(rows, cols)) for i in range(e)]


def expected_tensors(cfg: ModelConfig, include_mtp: bool = True) -> dict[str, TensorSpec]:
    """All tensors the text engine needs, in a canonical order: embedding, layers 0..L-1, final
    norm, lm_head, then (if `include_mtp` and the config has an MTP layer) the MTP module."""
    outside = _by_name(model_roles(cfg))
    out = {EMBED: outside[EMBED]}
    for i, layer_type in enumerate(cfg.layer_types):
        for rel, spec in decoder_layer_tensors(cfg, layer_type).items():
            out[layer_prefix(i) + rel] = spec
    out[FINAL_NORM] = outside[FINAL_NORM]
    out[LM_HEAD] = outside[LM_HEAD]
    if include_mtp:
        out.update(mtp_tensors(cfg))
    return out
