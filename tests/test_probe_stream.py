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
