"""tests/gpu/timeline.py's analysis of timeline events (the events themselves come from a GPU run)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def tl(gpu_script):
    return gpu_script("timeline")


def events(tl, marks):
    """marks: (grid_id, block, stage, time_ns) tuples -> the 24-byte records the engine writes."""
    ev = np.zeros(len(marks), dtype=tl.EVENT)
    for i, (gid, block, stage, t) in enumerate(marks):
        ev[i] = (t, gid, block, 0, stage, 0)
    return ev


def step_events(tl, base=0):
    # router (grid 7) released at 1000, gate_up (grid 8) resident at 900, released 3000, experts
    # known 3500/4500; down (grid 9) released 9000, x staged 9500/9700, warps done 12000 / 13000 /
    # 15000; all `base` ns later.
    r, g, d = 7, 8, 9
    marks = [(r, 0, tl.ENTRY, base + 500), (r, 0, tl.RELEASED, base + 1000)]
    marks += [(g, b, tl.ENTRY, base + 900 + b) for b in range(2)]
    marks += [(g, 0, tl.RELEASED, base + 3000), (g, 1, tl.RELEASED, base + 3400)]
    marks += [(g, 0, tl.SELECTED, base + 3500), (g, 1, tl.SELECTED, base + 4500)]
    marks += [(d, 0, tl.RELEASED, base + 9000), (d, 0, tl.STAGED, base + 9500), (d, 1, tl.STAGED, base + 9700)]
    marks += [(d, b, tl.DONE, base + t) for b, t in ((0, 12000), (0, 13000), (1, 15000))]
    return events(tl, marks[::-1])  # order of the buffer does not matter


def test_launches_are_grouped_by_grid_and_ordered_by_release(tl):
    launches = tl.group_launches(step_events(tl))
    assert [x.grid_id for x in launches] == [7, 8, 9]
    gate_up = launches[1]
    assert (gate_up.blocks, gate_up.resident_ns, gate_up.released_ns, gate_up.released_last_ns) == (2, 900, 3000, 3400)
    assert gate_up.selected_ns == 4000
    assert launches[2].resident_ns == launches[2].released_ns  # no entry mark: resident = released
    down = launches[2]
    assert (down.staged_ns, down.done_ns, down.done_last_ns) == (9600, 13000, 15000)
    assert (gate_up.staged_ns, gate_up.done_ns, gate_up.done_last_ns) == (None, None, None)


def test_step_rows_give_each_launch_the_time_to_the_next_release(tl):
    step = tl.group_launches(step_events(tl))
    rows = tl.step_rows(step, ["router", "gate_up", "down"])
    assert [r["critical_us"] for r in rows] == [2.0, 6.0, None]
    assert rows[1]["head_start_us"] == pytest.approx(2.1) and rows[1]["spread_us"] == pytest.approx(0.4)
    assert rows[1]["selected_us"] == pytest.approx(1.0) and rows[0]["selected_us"] is None
    assert [r["name"] for r in tl.step_rows(step, ["only one name"])] == ["launch 0", "launch 1", "launch 2"]
    down = rows[2]
    assert (down["staged_us"], down["done_us"], down["last_done_us"]) == (pytest.approx(0.6), 4.0, 6.0)
    assert down["handover_us"] is None and rows[1]["staged_us"] is None  # the last launch: no next release


def test_a_windows_settling_replay_is_named_before_the_graphs_launches(tl):
    graph = ["embedding", "gdn in projection", "lm_head"]
    assert tl.pass_names(graph, 4, settles=True) == [tl.SETTLE_NAME, *graph]
    assert tl.pass_names(graph, 3, settles=True) == graph  # nothing to settle: the graph alone
    assert tl.pass_names(graph, 4, settles=False) == graph  # no GDN layers: the counts disagree, unnamed


def test_hand_over_is_the_next_release_after_the_last_warp(tl):
    ev = step_events(tl)
    later = events(tl, [(10, 0, tl.RELEASED, 15800)])  # a launch after down
    rows = tl.step_rows(tl.group_launches(np.concatenate([ev, later])), ["router", "gate_up", "down", "next"])
    assert rows[2]["handover_us"] == pytest.approx(0.8) and rows[2]["critical_us"] == pytest.approx(6.8)


def test_summary_sums_the_critical_path_per_step_and_the_report_lists_it(tl):
    steps = [tl.group_launches(step_events(tl, base)) for base in (0, 10_000)]
    rows = [tl.step_rows(s, ["router", "gate_up", "down"]) for s in steps]
    summary = {r["name"]: r for r in tl.by_name(rows)}
    assert summary["gate_up"]["critical_us_per_step"] == pytest.approx(6.0)
    assert summary["gate_up"]["per_step"] == 1 and summary["down"]["critical_us_mean"] is None
    assert summary["down"]["last_done_us_mean"] == pytest.approx(6.0) and summary["gate_up"]["done_us_mean"] is None
    text = tl.format_report(tl.by_name(rows), rows[0], 8.0, 0.01)
    assert "gate_up" in text and "0.008 ms" in text
    down_line = next(line for line in text.splitlines() if line.strip().startswith("down"))
    assert down_line.split()[-5:] == ["-", "0.60", "4.00", "6.00", "-"]


def test_layers_are_cut_at_their_first_op_and_end_before_the_lm_head(tl):
    names = ["embedding_gather: e", "gdn in projection: gemv", "moe_experts_down_add: d",
             "gdn in projection: gemv", "moe_experts_down_add: d", "attention qkv projection: gemv",
             "attn_decode_int8: split", "attn_decode_int8: combine", "lm_head: gemv", "engine: sample"]
    critical = [1.0, 10.0, 5.0, 12.0, 7.0, 20.0, 3.0, 2.0, 30.0, None]
    rows = [{"name": n, "critical_us": c} for n, c in zip(names, critical)]
    layers = {k["kind"]: k for k in tl.by_layer([rows])}
    gdn = layers["gdn in projection"]
    assert gdn["per_step"] == 2 and gdn["critical_us_mean"] == pytest.approx(17.0)
    assert gdn["parts_us"] == {"gdn in projection: gemv": 11.0, "moe_experts_down_add: d": 6.0}
    assert layers["attention qkv projection"]["critical_us_mean"] == pytest.approx(25.0)  # lm_head not counted
    text = tl.format_report([], [], 1.0, 1.0, tl.by_layer([rows]))
    assert "a layer opened by gdn in projection (2 per step): 17.0 us = gdn in projection 11.0" in text
    assert "attn_decode_int8: split 3.0 + attn_decode_int8: combine 2.0" in text  # one op, two launches


def test_warp_balance_compares_the_last_warp_with_the_latest_sm_mean(tl):
    # one launch released at 1000: SM 0's warps done at 3000 and 7000, SM 1's at 4000 and 5000
    ev = np.zeros(5, dtype=tl.EVENT)
    ev[0] = (1000, 3, 0, 0, tl.RELEASED, 0)
    for i, (sm, t) in enumerate(((0, 3000), (0, 7000), (1, 4000), (1, 5000))):
        ev[i + 1] = (t, 3, sm, sm, tl.DONE, i % 2)
    (row,) = tl.warp_balance(ev)
    assert row["warps"] == 4 and row["done_last_us"] == 6.0 and row["done_median_us"] == 3.5
    assert row["sm_mean_last_us"] == 4.0  # SM 0: (2 + 6) / 2
    assert row["sm_spread_median_us"] == 2.5  # spreads 4 and 1
    assert tl.warp_balance(events(tl, [(7, 0, tl.RELEASED, 10)])) == []  # no warp marks
