"""The MTP (multi-token prediction) module, fp32 (architecture §4.7, as vLLM's qwen3_5_mtp).

Row t fuses the trunk's final-normed hidden h_t with the embedding of the next token x_{t+1} and sits
at position p_t in the MTP layer's own KV cache:
    e = rmsnorm1p(embed(x_{t+1}), mtp.pre_fc_norm_embedding)
    u = concat(e, rmsnorm1p(h_t, mtp.pre_fc_norm_hidden)) @ mtp.fc^T       # embedding part first
    u = full-attention decoder layer mtp.layers.0 (model's FFN type) at p_t
    d = rmsnorm1p(u, mtp.norm)                 # draft logits = d @ lm_head^T; d chains the next step
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lampo.models.config import FULL, ModelConfig
from lampo.models.tensor_specs import MTP_PREFIX, mtp_layer_prefix

from . import layers, norms
from .state import KVCache


def mtp_layer(cfg: ModelConfig, w: Mapping[str, np.ndarray], next_embeds: np.ndarray, hiddens: np.ndarray,
              cache: KVCache, positions: np.ndarray) -> np.ndarray:
    """next_embeds, hiddens [T, H] -> d [T, H] (after mtp.norm); appends T rows to `cache`."""
    eps = cfg.rms_norm_eps
    e = norms.rmsnorm1p(next_embeds, w[MTP_PREFIX + "pre_fc_norm_embedding.weight"], eps)
    hh = norms.rmsnorm1p(hiddens, w[MTP_PREFIX + "pre_fc_norm_hidden.weight"], eps)
    u = np.concatenate([e, hh], axis=-1) @ w[MTP_PREFIX + "fc.weight"].T
    u = layers.decoder_layer(cfg, w, mtp_layer_prefix(0), FULL, u, cache, positions, serial=True)
    return norms.rmsnorm1p(u, w[MTP_PREFIX + "norm.weight"], eps)
