"""Parameter counts of a model, derived from its tensor specs (never hard-coded).

`active_per_token` is what one decoded token touches: every decoder layer with only k of E routed
experts (plus router and shared expert), the final norm and the lm_head. The embedding is a row
gather and the MTP module is a separate (optional) pass, so neither is included.
"""

from __future__ import annotations

from dataclasses import dataclass

from lampo.models.config import FULL, LINEAR, ModelConfig
from lampo.models.tensor_specs import (
    EMBED,
    FINAL_NORM,
    LM_HEAD,
    ROUTED_EXPERT_TENSORS,
    TensorSpec,
    attention_tensors,
    expected_tensors,
    ffn_tensors,
    gdn_tensors,
    is_mtp,
)


@dataclass(frozen=True)
class ParamCounts:
    total_text: int  # embedding + decoder layers + final norm + lm_head
    mtp: int  # the MTP module (0 when the config has none)
    active_per_token: int
    embedding: int
    lm_head: int
    final_norm: int
    decoder_layers: int  # all decoder layers, including their norms
    full_attention_mixer: int  # one layer's self_attn.* (0 when the model has none)
    gdn_mixer: int  # one layer's linear_attn.*
    ffn: int  # one layer's mlp.* (router + all experts + shared expert for MoE)
    routed_experts: int  # one layer's routed expert banks (0 for dense)


def _total(specs: dict[str, TensorSpec]) -> int:
    return sum(s.numel for s in specs.values())


def count_params(cfg: ModelConfig) -> ParamCounts:
    specs = expected_tensors(cfg, include_mtp=True)
    text = {n: s for n, s in specs.items() if not is_mtp(n)}
    layers = _total(text) - text[EMBED].numel - text[FINAL_NORM].numel - text[LM_HEAD].numel
    ffn = ffn_tensors(cfg)
    routed = sum(ffn[n].numel for n in ROUTED_EXPERT_TENSORS if n in ffn)
    # every layer has one FFN; its idle experts are all that a decoded token does not touch
    idle_experts = cfg.num_experts - cfg.num_experts_per_tok if cfg.is_moe else 0
    per_expert = routed // cfg.num_experts if cfg.is_moe else 0
    untouched = cfg.num_hidden_layers * idle_experts * per_expert
    active = layers - untouched + text[FINAL_NORM].numel + text[LM_HEAD].numel
    return ParamCounts(
        total_text=_total(text),
        mtp=_total(specs) - _total(text),
        active_per_token=active,
        embedding=text[EMBED].numel,
        lm_head=text[LM_HEAD].numel,
        final_norm=text[FINAL_NORM].numel,
        decoder_layers=layers,
        full_attention_mixer=_total(attention_tensors(cfg)) if FULL in cfg.layer_types else 0,
        gdn_mixer=_total(gdn_tensors(cfg)) if LINEAR in cfg.layer_types else 0,
        ffn=_total(ffn),
        routed_experts=routed,
    )


def short_count(n: int) -> str:
    """34.66 B, 394.37 M"""
    return f"{n / 1e9:.2f} B" if n >= 100_000_000 else f"{n / 1e6:.2f} M"
