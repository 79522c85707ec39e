"""Which matrices the CUDA engine holds in the LQ format, and at which width.

The engine stores some projections as one fused block (attention q|k|v, Gated DeltaNet
qkv|z|b|a, dense gate|up, shared-expert gate|up: native/src/weights/weights.cpp), and a block has
one format. `engine_tensor_bits` takes the width each tensor is stored at (a converted
checkpoint's lampo-format.json) or is to be quantized to (a recipe, quantize-on-load) and keeps a
fused block in LQ only when all its parts have one width; otherwise the whole block is bf16 (the
engine dequantizes the parts that arrive packed). Everything outside the tile grid, and every
vector, stays bf16 already in the recipes.

`choose_weights` picks the format of a run: `auto` is the checkpoint's own recipe for a converted
directory, and for a bf16 checkpoint the best LQ recipe that fits the VRAM (q5, else q4:
quantized while loading); `bf16` opts out (a converted directory is then dequantized on load);
`q5` / `q4` ask for a recipe (only from a bf16 checkpoint, or the recipe a converted one has).
"""

from __future__ import annotations

from collections.abc import Mapping

from lampo.models.config import FULL, ModelConfig
from lampo.models.memory_plan import MemoryPlan, preferred_plan
from lampo.models.quant.recipes import BF16, RECIPES, get_recipe, tensor_bits
from lampo.models.tensor_specs import decoder_layer_roles, expected_tensors, layer_prefix, mtp_layer_prefix

# Roles the engine stores as one block each (weights.cpp's add_fused), by layer.
FUSED_ROLES = (
    ("attn.q", "attn.k", "attn.v"),
    ("gdn.qkv", "gdn.z", "gdn.b", "gdn.a"),
    ("dense.gate", "dense.up"),
    ("moe.shared_expert.gate", "moe.shared_expert.up"),
)
WEIGHT_CHOICES = ("auto", "bf16", *RECIPES)


def engine_tensor_bits(cfg: ModelConfig, widths: Mapping[str, int | str], mtp: bool = False) -> dict[str, int]:
    """Checkpoint name -> LQ width of each tensor the engine loads (`mtp`: the MTP module too) and
    holds in LQ, from `widths` (name -> 4, 5, 6 or "bf16"; names absent are bf16); fused blocks of
    mixed widths are bf16."""
    loaded = expected_tensors(cfg, include_mtp=mtp)
    bits = {n: int(b) for n, b in widths.items() if b != BF16 and n in loaded}
    layers = [(layer_prefix(i), layer_type) for i, layer_type in enumerate(cfg.layer_types)]
    if mtp:
        layers += [(mtp_layer_prefix(i), FULL) for i in range(cfg.mtp_num_hidden_layers)]
    for prefix, layer_type in layers:
        roles = decoder_layer_roles(cfg, layer_type)
        for group in FUSED_ROLES:
            parts = [prefix + roles[r][0] for r in group if r in roles]
            if len({bits.get(p, BF16) for p in parts}) > 1:
                for p in parts:
                    bits.pop(p, None)
    return bits


def recipe_tensor_bits(cfg: ModelConfig, recipe: str, mtp: bool = False) -> dict[str, int]:
    """The engine's widths for quantizing a bf16 checkpoint with `recipe` while loading."""
    return engine_tensor_bits(cfg, tensor_bits(get_recipe(recipe), cfg), mtp)


def choose_weights(requested: str, stored_recipe: str | None, plans: Mapping[str, MemoryPlan],
                   free_bytes: int) -> str:
    """The weight format of a run: "bf16" or a recipe name. `stored_recipe`: the recipe of a
    converted checkpoint (None: a bf16 one); `plans`: the memory plan of each recipe at the run's
    context. Raises ValueError for a choice that cannot be made."""
    if requested not in WEIGHT_CHOICES:
        raise ValueError(f"--weights {requested!r}: choose one of {', '.join(WEIGHT_CHOICES)}")
    if stored_recipe is not None:
        if requested in ("auto", stored_recipe):
            return stored_recipe
        if requested == BF16:
            return BF16
        raise ValueError(f"--weights {requested}: this checkpoint is already quantized ({stored_recipe}); "
                         f"convert the bf16 checkpoint with --recipe {requested} instead (re-quantizing "
                         f"quantized weights loses quality)")
    if requested != "auto":
        return requested
    best = preferred_plan([plans[r] for r in RECIPES], free_bytes)
    return best.weight_format if best is not None else next(iter(RECIPES))
