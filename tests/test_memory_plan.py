"""Memory plan vs the architecture doc §5 and the DESIGN targets; refusal messages."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lampo.models.memory_plan import (
    CONTEXT_STEP,
    GIB,
    MIB,
    WEIGHT_FORMATS,
    format_plans_table,
    plan_memory,
    preferred_plan,
)
from lampo.models.presets import get_preset
from lampo.models.quant.recipes import RECIPES, get_recipe, recipe_size

MOE = get_preset("qwen3.6-35b-a3b")
DENSE = get_preset("qwen3.6-27b")
FULL_CONTEXT = MOE.max_position_embeddings  # both models: 262,144


def _gib(plan, item: str) -> float:
    return plan.item(item).bytes / GIB


@pytest.mark.parametrize(
    "cfg,kv_int8,kv_bf16,mtp_int8,mtp_bf16",
    [(MOE, 2.58, 5.0, 0.26, 0.5), (DENSE, 8.25, 16.0, 0.52, 1.0)],
)
def test_kv_cache_at_full_context(cfg, kv_int8, kv_bf16, mtp_int8, mtp_bf16):
    p8 = plan_memory(cfg, FULL_CONTEXT, kv="int8")
    p16 = plan_memory(cfg, FULL_CONTEXT, kv="bf16")
    assert round(_gib(p8, "KV cache (trunk)"), 2) == kv_int8
    assert _gib(p16, "KV cache (trunk)") == kv_bf16
    assert round(_gib(p8, "KV cache (MTP)"), 2) == mtp_int8
    assert _gib(p16, "KV cache (MTP)") == mtp_bf16


@pytest.mark.parametrize("cfg,state_mib,conv_mib,slot_mib", [(MOE, 60, 1.4, 61), (DENSE, 144, 2.8, 147)])
def test_gdn_state(cfg, state_mib, conv_mib, slot_mib):
    p = plan_memory(cfg, snapshot_slots=2)
    assert p.item("GDN recurrent state").bytes == state_mib * MIB
    assert round(p.item("GDN conv windows").bytes / MIB, 1) == conv_mib
    assert round(p.item("GDN state snapshots").bytes / 2 / MIB) == slot_mib


@pytest.mark.parametrize("cfg,kib_per_layer", [(MOE, 121), (DENSE, 161)])
def test_gdn_window_records(cfg, kib_per_layer):
    """The engine's per-token records of a 5-row verify window: (Hk + Hv) x 128 + Hv floats a row."""
    with pytest.raises(KeyError):
        plan_memory(cfg).item("GDN window records")
    plan = plan_memory(cfg, verify_rows=5)
    records = plan.item("GDN window records").bytes
    assert round(records / len(cfg.linear_layer_ids) / 1024) == kib_per_layer
    # the rows' conv states, no more recurrent states: the window rebuilds one from its records
    assert plan.item("GDN conv ring").bytes == 5 * plan.item("GDN conv windows").bytes
    with pytest.raises(KeyError):
        plan.item("GDN state snapshots")


@pytest.mark.parametrize("cfg,text_gb,mtp_gb", [(MOE, 69.3, 1.69), (DENSE, 53.8, 0.85)])
def test_bf16_weights(cfg, text_gb, mtp_gb):
    bf16 = plan_memory(cfg, weights="bf16")
    assert round(bf16.item("weights (text)").bytes / 1e9, 1) == text_gb
    assert round(bf16.item("weights (MTP)").bytes / 1e9, 2) == mtp_gb
    assert plan_memory(cfg) == bf16


@pytest.mark.parametrize("cfg", [MOE, DENSE])
@pytest.mark.parametrize("recipe", ["q5", "q4"])
def test_lq_weights_are_the_recipes_exact_size(cfg, recipe):
    plan, size = plan_memory(cfg, weights=recipe), recipe_size(get_recipe(recipe), cfg)
    assert plan.item("weights (text)").bytes == size.text_bytes
    assert plan.item("weights (MTP)").bytes == size.mtp_bytes
    assert plan.weight_format == recipe


def test_the_formats_are_bf16_and_every_recipe():
    assert WEIGHT_FORMATS[0] == "bf16" and set(WEIGHT_FORMATS[1:]) == set(RECIPES)


@pytest.mark.parametrize("cfg", [MOE, DENSE])
def test_recipe_targets_at_full_context(cfg):
    assert plan_memory(cfg, weights="q5").total_bytes < 32e9  # DESIGN: q5 fits a 32 GB card
    # the 35B-A3B's q4 fits a 24 GB card (the issue: at most 23 GiB); the 27B's does not quite (23.72 GiB)
    assert (plan_memory(cfg, weights="q4").total_bytes <= 23 * GIB) == (cfg is MOE)


def test_without_mtp_drops_its_items():
    p = plan_memory(MOE, with_mtp=False)
    names = [i.name for i in p.items]
    assert "weights (MTP)" not in names and "KV cache (MTP)" not in names
    assert p.total_bytes < plan_memory(MOE).total_bytes


def test_the_context_defaults_to_the_models():
    short = replace(DENSE, max_position_embeddings=32_768)
    plan = plan_memory(short)
    assert plan.context_max == 32_768
    assert plan.item("KV cache (trunk)").bytes == plan_memory(DENSE, 32_768).item("KV cache (trunk)").bytes
    assert plan_memory(DENSE).context_max == DENSE.max_position_embeddings


def test_kv_scales_with_context():
    a, b = plan_memory(DENSE, 65_536), plan_memory(DENSE, 131_072)
    assert b.total_bytes - a.total_bytes == 65_536 * a.kv_bytes_per_token


def test_fits_and_refusal_suggests_a_context():
    plan = plan_memory(DENSE, weights="q5")
    ok, msg = plan.fits(40 * GIB)
    assert ok and "fits" in msg
    free = 20 * GIB
    ok, msg = plan.fits(free)
    assert not ok and "\n" not in msg
    assert "GiB" in msg and "262,144 tokens" in msg
    suggested = plan.fitting_context_max(free)
    assert f"--context {suggested}" in msg
    assert 0 < suggested < FULL_CONTEXT and suggested % CONTEXT_STEP == 0
    assert plan_memory(DENSE, suggested, "q5").fits(free)[0]
    assert not plan_memory(DENSE, suggested + CONTEXT_STEP, "q5").fits(free)[0]


def test_a_plan_that_fits_exactly_keeps_its_context():
    plan = plan_memory(DENSE, 5000, "q4")  # not a multiple of CONTEXT_STEP
    assert plan.fitting_context_max(plan.total_bytes) == 5000
    assert plan.fitting_context_max(plan.total_bytes - 1) == 4096
    assert plan.fitting_context_max(plan.fixed_bytes) == 0


def test_preferred_plan():
    plans = [plan_memory(MOE, weights=w) for w in WEIGHT_FORMATS]
    assert preferred_plan(plans, 80 * GIB) is plans[0]
    assert preferred_plan(plans, 24 * GIB) is plans[2]  # q5 fits only a shorter context
    assert preferred_plan(plans, plans[1].total_bytes) is plans[1]
    assert preferred_plan(plans, plans[2].fixed_bytes) is None
    tight = plans[1].fixed_bytes + 2 * CONTEXT_STEP * plans[1].kv_bytes_per_token  # q5: 2,048 tokens
    assert preferred_plan(plans[1:], tight) is plans[2]  # q4 allows a longer context


def test_refusal_when_weights_alone_do_not_fit():
    ok, msg = plan_memory(MOE, weights="bf16").fits(24 * GIB)
    assert not ok and "weights" in msg and "--context" in msg and "do not fit" in msg


def test_table_lists_every_item():
    plans = [plan_memory(MOE), plan_memory(MOE, weights="q5", snapshot_slots=3, verify_rows=5)]
    table = format_plans_table(plans, ["bf16", "q5"])
    for item in plans[1].items:
        assert item.name in table
    assert "2.58 GiB" in table and "total" in table
    assert plans[0].format_table().splitlines()[0].split() == ["bf16"]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(context_max=0), "context_max"),
        (dict(context_max=FULL_CONTEXT + 1), "context_max"),
        (dict(weights="fp4"), "weight format"),
        (dict(weights="5bpw"), "weight format"),
        (dict(kv="fp8"), "kv"),
        (dict(snapshot_slots=-1), "snapshot_slots"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_memory(MOE, **kwargs)
