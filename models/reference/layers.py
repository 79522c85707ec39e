"""One decoder layer of the Qwen3.5/3.6 trunk (also the MTP layer), fp32, readable top to bottom.

`w` maps full tensor names to float32 arrays; `p` is the layer prefix, e.g.
"model.language_model.layers.3." or "mtp.layers.0.". Ops are looked up through their modules at call
time (norms.rmsnorm1p, attention.split_q_gate, ...) so tests can swap one op for a wrong variant.

    h = rmsnorm1p(x, input_layernorm);          x = x + Mixer(h)     # GDN or gated attention
    h = rmsnorm1p(x, post_attention_layernorm); x = x + FFN(h)       # SwiGLU or sparse MoE
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lampo.models.config import FULL, ModelConfig

from . import attention, ffn, norms, rope
from . import gated_deltanet as gdn
from .activations import sigmoid
from .state import GdnState, KVCache


def attention_mixer(cfg: ModelConfig, w: Mapping[str, np.ndarray], p: str, h: np.ndarray,
                    cache: KVCache, positions: np.ndarray) -> np.ndarray:
    """Gated full attention; appends this call's K/V rows (positions must continue the cache)."""
    T, nq, nkv, D, eps = h.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    if positions[0] != cache.length:
        raise ValueError(f"attention: positions start at {positions[0]} but the KV cache holds {cache.length} rows")
    a = p + "self_attn."
    q, gate = attention.split_q_gate(h @ w[a + "q_proj.weight"].T, nq, D)
    q = norms.rmsnorm1p(q, w[a + "q_norm.weight"], eps)
    k = norms.rmsnorm1p((h @ w[a + "k_proj.weight"].T).reshape(T, nkv, D), w[a + "k_norm.weight"], eps)
    v = (h @ w[a + "v_proj.weight"].T).reshape(T, nkv, D)
    q = rope.rope_partial(q, positions, cfg.rotary_dim, cfg.rope_theta)
    k = rope.rope_partial(k, positions, cfg.rotary_dim, cfg.rope_theta)
    cache.append(k, v)
    o = attention.attention(q, cache.k, cache.v, positions) * sigmoid(gate)
    return o @ w[a + "o_proj.weight"].T


def gdn_mixer(cfg: ModelConfig, w: Mapping[str, np.ndarray], p: str, h: np.ndarray,
              state: GdnState, serial: bool) -> np.ndarray:
    """Gated DeltaNet; updates `state` in place. serial=True: token loop, else the chunked form."""
    T, Hk, Hv = h.shape[0], cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    a = p + "linear_attn."
    qkv = h @ w[a + "in_proj_qkv.weight"].T
    z = (h @ w[a + "in_proj_z.weight"].T).reshape(T, Hv, dv)
    gate_b = h @ w[a + "in_proj_b.weight"].T
    gate_a = h @ w[a + "in_proj_a.weight"].T
    conv_w = w[a + "conv1d.weight"].reshape(cfg.conv_dim, cfg.linear_conv_kernel_dim)
    qkv, state.conv = gdn.causal_conv1d_silu(qkv, conv_w, state.conv)
    q = qkv[:, : cfg.key_dim].reshape(T, Hk, dk)
    k = qkv[:, cfg.key_dim : 2 * cfg.key_dim].reshape(T, Hk, dk)
    v = qkv[:, 2 * cfg.key_dim :].reshape(T, Hv, dv)
    g, beta = gdn.gdn_gates(gate_a, gate_b, w[a + "A_log"], w[a + "dt_bias"])
    q = gdn.l2norm(q) * np.float32(1.0 / np.sqrt(dk))
    k = gdn.l2norm(k)
    rule = gdn.gated_delta_rule_recurrent if serial else gdn.gated_delta_rule_chunked
    o, state.recurrent = rule(q, k, v, g, beta, state.recurrent)
    o = norms.gated_rmsnorm(o, z, w[a + "norm.weight"], cfg.rms_norm_eps)
    return o.reshape(T, cfg.value_dim) @ w[a + "out_proj.weight"].T


def ffn_block(cfg: ModelConfig, w: Mapping[str, np.ndarray], p: str, h: np.ndarray,
              routing: ffn.Routing | None = None) -> np.ndarray:
    m = p + "mlp."
    if not cfg.is_moe:
        return ffn.swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    s = m + "shared_expert."
    return ffn.moe_block(
        h, w[m + "gate.weight"], w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"],
        w[m + "shared_expert_gate.weight"], w[s + "gate_proj.weight"], w[s + "up_proj.weight"],
        w[s + "down_proj.weight"], cfg.num_experts_per_tok, routing,
    )


def decoder_layer(cfg: ModelConfig, w: Mapping[str, np.ndarray], p: str, kind: str, x: np.ndarray,
                  layer_state: KVCache | GdnState, positions: np.ndarray, serial: bool,
                  routing: ffn.Routing | None = None) -> np.ndarray:
    """x [T, H] residual stream in, out. kind is FULL ("full_attention") or LINEAR; `routing`
    records or replays the MoE experts (ffn.Routing)."""
    h = norms.rmsnorm1p(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
    if kind == FULL:
        x = x + attention_mixer(cfg, w, p, h, layer_state, positions)
    else:
        x = x + gdn_mixer(cfg, w, p, h, layer_state, serial)
    h = norms.rmsnorm1p(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
    return x + ffn_block(cfg, w, p, h, routing)
