"""Which matrices the CUDA engine holds in LQ (models/quant/engine_formats.py): a fused block keeps
one format, the full-size recipes lose nothing to that rule, and `--weights` resolves as the
user guide says."""

from __future__ import annotations

import pytest

from lampo.models.memory_plan import WEIGHT_FORMATS, plan_memory
from lampo.models.presets import get_preset
from lampo.models.quant.engine_formats import FUSED_ROLES, choose_weights, engine_tensor_bits, recipe_tensor_bits
from lampo.models.quant.recipes import RECIPES, get_recipe, tensor_bits
from lampo.models.tensor_specs import LAYER_PREFIX, decoder_layer_roles, expected_tensors

GIB = 1 << 30


@pytest.mark.parametrize("preset", ["qwen3.6-35b-a3b", "qwen3.6-27b"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_full_size_models_keep_every_quantized_matrix_in_lq(preset, recipe):
    cfg = get_preset(preset)
    wanted = {n: b for n, b in tensor_bits(get_recipe(recipe), cfg).items()
              if b != "bf16" and n in expected_tensors(cfg, include_mtp=False)}
    assert recipe_tensor_bits(cfg, recipe) == wanted


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe", "qwen3.6-35b-a3b", "qwen3.6-27b"])
def test_fused_blocks_have_one_format(preset):
    cfg = get_preset(preset)
    bits = recipe_tensor_bits(cfg, "q5")
    for i, layer_type in enumerate(cfg.layer_types):
        roles = decoder_layer_roles(cfg, layer_type)
        for group in FUSED_ROLES:
            parts = [LAYER_PREFIX.format(layer=i) + roles[r][0] for r in group if r in roles]
            assert len({bits.get(p, 0) for p in parts}) <= 1, parts


def test_a_block_with_a_bf16_part_is_bf16_whole():
    cfg = get_preset("tiny-dense")  # its Gated DeltaNet b and a rows are off the tile grid
    widths = tensor_bits(get_recipe("q5"), cfg)
    qkv = LAYER_PREFIX.format(layer=0) + "linear_attn.in_proj_qkv.weight"
    b = LAYER_PREFIX.format(layer=0) + "linear_attn.in_proj_b.weight"
    assert widths[qkv] != "bf16" and widths[b] == "bf16"
    bits = engine_tensor_bits(cfg, widths)
    assert qkv not in bits and b not in bits
    assert bits  # other matrices stay LQ
    assert not any(n.startswith("mtp.") for n in bits)  # the engine loads no MTP weights


def _plans(cfg):
    return {f: plan_memory(cfg, weights=f, with_mtp=False) for f in WEIGHT_FORMATS}


def test_choose_weights():
    cfg = get_preset("qwen3.6-35b-a3b")
    plans = _plans(cfg)
    assert choose_weights("auto", None, plans, 140 * GIB) == "q5"  # the LQ default even where bf16 fits
    assert choose_weights("auto", None, plans, 22 * GIB) == "q4"
    assert choose_weights("auto", None, plans, 8 * GIB) == "q5"  # nothing fits: the plan's refusal explains
    assert choose_weights("bf16", None, plans, 8 * GIB) == "bf16"
    assert choose_weights("auto", "q4", plans, 140 * GIB) == "q4"
    assert choose_weights("q4", "q4", plans, 140 * GIB) == "q4"
    assert choose_weights("bf16", "q4", plans, 140 * GIB) == "bf16"
    with pytest.raises(ValueError, match="already quantized"):
        choose_weights("q5", "q4", plans, 140 * GIB)
    with pytest.raises(ValueError, match="choose one of auto, bf16, q5, q4"):
        choose_weights("q3", None, plans, 140 * GIB)
