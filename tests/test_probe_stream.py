"""tests/gpu/probe_stream.py's schedules (the stream itself needs an NVIDIA GPU)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ps(gpu_script):
    return gpu_script("probe_stream")


def test_the_step_has_the_35b_a3b_layers_and_bytes(ps):
    phases = ps.step_phases()
    names = [name for name, *_ in phases]
    assert names.count("gdn in projection") == 30 and names.count("attention qkv") == 10
    assert names.count("routed gate_up") == 40 and names[-1] == "lm head"
    assert all(b % 256 == 0 for _, b, _, _ in phases)
    assert ps.plan("ahead").total == pytest.approx(6.04e9, rel=0.01)  # ~6.1 GB per token at 8,192


def test_schedules_differ_only_in_who_waits_for_what(ps):
    ahead, lockstep, merged, stream = (ps.plan(s) for s in ("ahead", "lockstep", "merged", "stream"))
    assert ahead.bytes == lockstep.bytes == merged.bytes and ahead.work_ns == lockstep.work_ns
    assert stream.total == ahead.total and len(stream.bytes) == 1
    every_previous = list(range(-1, len(lockstep.bytes) - 1))
    assert lockstep.prod_dep == lockstep.cons_dep == ahead.cons_dep == every_previous
    assert merged.prod_dep == ahead.prod_dep
    names = [name for name, *_ in ps.step_phases()]
    for p, d in enumerate(ahead.prod_dep):
        if names[p] in ("routed gate_up", "down (routed + shared)"):
            assert names[d] == "top-k" and p - d in (2, 3)  # this layer's top-k
        else:
            assert d == -1
    for p, d in enumerate(merged.cons_dep):
        if names[p] in ps.PARTIAL_INPUT:
            assert d == -1
        elif names[p] == "routed gate_up":
            assert names[d] == "top-k" and p - d == 2
        else:
            assert d == p - 1


def test_nowork_drops_only_the_spins(ps):
    merged, bare = ps.plan("merged"), ps.plan("merged-nowork")
    assert sum(merged.work_ns) > 0 and sum(bare.work_ns) == 0
    assert (bare.bytes, bare.prod_dep, bare.cons_dep) == (merged.bytes, merged.prod_dep, merged.cons_dep)


def test_unknown_schedule_is_refused(ps):
    with pytest.raises(ValueError, match="unknown schedule"):
        ps.plan("sideways")
    with pytest.raises(ValueError, match="unknown schedule"):
        ps.plan("ahead-fast")


def test_a_recipe_shrinks_the_weight_phases_only(ps):
    """--weights q5: the same phases and spins, each weight phase at its class's bits per weight; the
    router, the GDN state and the KV rows keep their bytes. The weights then add up to what the
    recipe says a 35B-A3B token reads (recipes.active_bytes_per_token)."""
    from lampo.models.presets import get_preset
    from lampo.models.quant.recipes import active_bytes_per_token, get_recipe

    bf16, q5 = ps.step_phases(), ps.step_phases("q5")
    assert [(n, w, r) for n, _, w, r in bf16] == [(n, w, r) for n, _, w, r in q5]
    kept = {"router", "gdn step (state)", "attention over the cache"}
    unscaled = 0
    for (name, b16, *_), (_, b5, *_) in zip(bf16, q5):
        if name in kept:
            assert b5 == b16
            unscaled += b16
        else:
            assert b5 < b16 * 0.45 or b16 == 0
    weights = ps.plan("merged", "q5").total - unscaled
    want = active_bytes_per_token(get_recipe("q5"), get_preset("qwen3.6-35b-a3b"))
    assert weights == pytest.approx(want, rel=0.03)
    assert ps.plan("merged", "q4").total < ps.plan("merged", "q5").total


def test_unknown_recipe_is_refused(ps):
    with pytest.raises(ValueError, match="unknown recipe"):
        ps.step_phases("q3")
