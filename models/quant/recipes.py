"""Recipes: the width each tensor class gets in the LQ format.

A tensor's class comes from its role (`tensor_specs`); a recipe maps each class to 4, 5 or 6
bits, or to bf16 for what stays unquantized: vectors, the conv weights, the router (its top-k
decides which experts run), the shared-expert gate, and any matrix off the 16 x 64 tile grid.
The Gated DeltaNet's small b and a projections share the class of its qkv and z: the engine holds
the four as one block (quant/engine_formats.py).

- `q5`: about 5 bits per weight on average; both models with the full 262,144-token INT8 KV
  cache on a 32 GB card.
- `q4`: about 4.4 bits per weight; the 35B-A3B with the full context on a 24 GB card.
"""

from __future__ import annotations

from dataclasses import dataclass

from lampo.models.config import FULL, ModelConfig
from lampo.models.quant.layout import bits_per_weight, quantizable
from lampo.models.tensor_specs import (
    EMBED,
    LAYER_PREFIX,
    ROUTED_EXPERT_TENSORS,
    MTP_PREFIX,
    TensorSpec,
    decoder_layer_roles,
    expected_tensors,
    model_roles,
    mtp_layer_prefix,
)

BF16 = "bf16"

# role -> tensor class (roles not listed are bf16 whatever the recipe)
ROLE_CLASS = {
    "embed": "embedding",
    "lm_head": "lm_head",
    "attn.q": "attention", "attn.k": "attention", "attn.v": "attention", "attn.o": "attention",
    "gdn.qkv": "gdn", "gdn.z": "gdn", "gdn.b": "gdn", "gdn.a": "gdn", "gdn.out": "gdn",
    "dense.gate": "ffn_gate_up", "dense.up": "ffn_gate_up", "dense.down": "ffn_down",
    "moe.experts_gate_up": "experts_gate_up", "moe.experts_down": "experts_down",
    "moe.shared_expert.gate": "shared_expert", "moe.shared_expert.up": "shared_expert",
    "moe.shared_expert.down": "shared_expert",
}
MTP_FC = MTP_PREFIX + "fc.weight"
CLASSES = ("embedding", "lm_head", "attention", "gdn", "ffn_gate_up", "ffn_down", "experts_gate_up",
           "experts_down", "shared_expert", "mtp")


@dataclass(frozen=True)
class Recipe:
    name: str
    bits: dict[str, int]  # tensor class -> width
    summary: str


RECIPES = {
    "q5": Recipe("q5", {
        "embedding": 5, "lm_head": 6, "attention": 6, "gdn": 5, "ffn_gate_up": 4, "ffn_down": 5,
        "experts_gate_up": 4, "experts_down": 6, "shared_expert": 6, "mtp": 5,
    }, "about 5.0 bits per weight: both models with the full context on a 32 GB card"),
    "q4": Recipe("q4", {
        "embedding": 4, "lm_head": 5, "attention": 5, "gdn": 4, "ffn_gate_up": 4, "ffn_down": 4,
        "experts_gate_up": 4, "experts_down": 4, "shared_expert": 5, "mtp": 4,
    }, "about 4.4 bits per weight: the 35B-A3B with the full context on a 24 GB card"),
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}: the recipes are {', '.join(RECIPES)}")
    return RECIPES[name]


def tensor_classes(cfg: ModelConfig) -> dict[str, str]:
    """Checkpoint name -> tensor class of every quantizable tensor of `cfg`; the MTP module's
    matrices (its fc and its decoder layer's projections) are all class `mtp`."""
    classes = {name: ROLE_CLASS[role] for role, (name, _) in model_roles(cfg).items() if role in ROLE_CLASS}
    for i, layer_type in enumerate(cfg.layer_types):
        for role, (rel, _) in decoder_layer_roles(cfg, layer_type).items():
            if role in ROLE_CLASS:
                classes[LAYER_PREFIX.format(layer=i) + rel] = ROLE_CLASS[role]
    if cfg.mtp_num_hidden_layers:
        classes[MTP_FC] = "mtp"
        projections = [rel for role, (rel, _) in decoder_layer_roles(cfg, FULL).items() if role in ROLE_CLASS]
        for i in range(cfg.mtp_num_hidden_layers):
            classes.update((mtp_layer_prefix(i) + rel, "mtp") for rel in projections)
    return classes


def tensor_bits(recipe: Recipe, cfg: ModelConfig) -> dict[str, int | str]:
    """Checkpoint name -> width (or "bf16") of every tensor the engine loads, MTP included."""
    classes = tensor_classes(cfg)
    out: dict[str, int | str] = {}
    for name, spec in expected_tensors(cfg, include_mtp=True).items():
        cls = classes.get(name)
        out[name] = recipe.bits[cls] if cls is not None and quantizable(spec.shape) else BF16
    return out


def tensor_bytes(spec: TensorSpec, bits: int | str) -> float:
    """Bytes of one tensor at a width (bf16: 2 per element)."""
    return spec.numel * (2.0 if bits == BF16 else bits_per_weight(bits) / 8)


@dataclass(frozen=True)
class RecipeSize:
    text_bytes: float  # embedding + decoder layers + final norm + LM head
    mtp_bytes: float
    text_bpw: float  # average bits per weight of the text model

    @property
    def total_bytes(self) -> float:
        return self.text_bytes + self.mtp_bytes


def recipe_size(recipe: Recipe, cfg: ModelConfig) -> RecipeSize:
    specs = expected_tensors(cfg, include_mtp=True)
    bits = tensor_bits(recipe, cfg)
    text = [(s, bits[n]) for n, s in specs.items() if not n.startswith(MTP_PREFIX)]
    mtp = [(s, bits[n]) for n, s in specs.items() if n.startswith(MTP_PREFIX)]
    text_bytes = sum(tensor_bytes(s, b) for s, b in text)
    return RecipeSize(text_bytes, sum(tensor_bytes(s, b) for s, b in mtp),
                      text_bytes * 8 / sum(s.numel for s, _ in text))


def active_bytes_per_token(recipe: Recipe, cfg: ModelConfig) -> float:
    """Weight bytes one decoded token reads at `recipe` (params.count_params' active_per_token in
    bytes): every text tensor but the embedding (a row gather), the routed expert banks at
    top-k / E of their size."""
    bits = tensor_bits(recipe, cfg)
    share = cfg.num_experts_per_tok / cfg.num_experts if cfg.is_moe else 1.0
    total = 0.0
    for name, spec in expected_tensors(cfg, include_mtp=False).items():
        if name == EMBED:
            continue
        routed = name.endswith(ROUTED_EXPERT_TENSORS)
        total += tensor_bytes(spec, bits[name]) * (share if routed else 1.0)
    return total
