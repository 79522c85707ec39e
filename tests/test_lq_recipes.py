"""The q5 / q4 recipes (models/quant/recipes.py): widths per tensor class and the sizes they give."""

from __future__ import annotations

import pytest

from lampo.models.presets import get_preset
from lampo.models.quant import recipes
from lampo.models.tensor_specs import EMBED, LM_HEAD, expected_tensors, layer_prefix


@pytest.mark.parametrize("preset", ["qwen3.6-35b-a3b", "qwen3.6-27b"])
@pytest.mark.parametrize("recipe, low, high", [("q5", 4.85, 5.1), ("q4", 4.2, 4.5)])
def test_average_widths(preset, recipe, low, high):
    size = recipes.recipe_size(recipes.get_recipe(recipe), get_preset(preset))
    assert low <= size.text_bpw <= high


def test_the_35b_a3b_q4_leaves_room_for_the_full_context_on_a_24_gb_card():
    size = recipes.recipe_size(recipes.get_recipe("q4"), get_preset("qwen3.6-35b-a3b"))
    assert size.text_bytes < 18 * 2**30


def test_what_stays_bf16():
    cfg = get_preset("qwen3.6-35b-a3b")
    bits = recipes.tensor_bits(recipes.get_recipe("q5"), cfg)
    layer = layer_prefix(0)
    assert bits[layer + "mlp.gate.weight"] == recipes.BF16  # the router
    assert bits[layer + "mlp.shared_expert_gate.weight"] == recipes.BF16
    assert bits[layer + "linear_attn.conv1d.weight"] == recipes.BF16
    assert bits[layer + "input_layernorm.weight"] == recipes.BF16
    assert bits[layer + "mlp.experts.gate_up_proj"] == 4 and bits[layer + "mlp.experts.down_proj"] == 6
    assert bits[EMBED] == 5 and bits[LM_HEAD] == 6
    assert bits["mtp.fc.weight"] == 5 and bits["mtp.layers.0.mlp.experts.down_proj"] == 5


def test_every_tensor_has_a_width_and_off_grid_matrices_stay_bf16():
    cfg = get_preset("tiny-moe")
    bits = recipes.tensor_bits(recipes.get_recipe("q4"), cfg)
    assert set(bits) == set(expected_tensors(cfg, include_mtp=True))
    assert bits[layer_prefix(0) + "linear_attn.in_proj_a.weight"] == recipes.BF16  # 2 rows: off the grid


def test_unknown_recipe_is_named():
    with pytest.raises(ValueError, match="unknown recipe 'q3': the recipes are q5, q4"):
        recipes.get_recipe("q3")
