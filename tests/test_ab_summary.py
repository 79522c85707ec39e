"""tests/gpu/ab_summary.py: medians of the repeated A/B rounds and which variants are worth testing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def ab(gpu_script):
    return gpu_script("ab_summary")


def write_round(tmp_path: Path, build: str, rnd: int, ms1: float, ms8k: float, model: str = "35b-a3b") -> None:
    report = {"decode": [{"depth": 1, "ms_per_token": ms1}, {"depth": 8192, "ms_per_token": ms8k}]}
    (tmp_path / f"{model}-{build}-r{rnd}.json").write_text(json.dumps(report))


def test_medians_spread_and_difference(ab, tmp_path):
    for rnd, (b1, b8) in enumerate([(2.40, 2.41), (2.39, 2.43), (2.41, 2.42)], start=1):
        write_round(tmp_path, "base", rnd, b1, b8)
    for rnd, (v1, v8) in enumerate([(2.30, 2.35), (2.31, 2.36), (2.50, 2.33)], start=1):
        write_round(tmp_path, "fast+cheap", rnd, v1, v8)
    builds = ab.load_builds(tmp_path)
    assert list(builds) == ["base", "fast+cheap"]
    assert builds["base"].median(8192) == pytest.approx(2.42)
    assert builds["fast+cheap"].median(1) == pytest.approx(2.31)
    text = ab.table(builds)
    assert "base (median of 3): depth 1: 2.400 ms (2.390-2.410); depth 8,192: 2.420 ms (2.410-2.430)" in text
    assert "fast+cheap (median of 3): depth 1: 2.310 ms (2.300-2.500) -0.090; depth 8,192: 2.350 ms (2.330-2.360) -0.070" in text


def test_faster_uses_the_deepest_depth_and_the_threshold(ab, tmp_path):
    write_round(tmp_path, "base", 1, 2.40, 2.42)
    write_round(tmp_path, "a", 1, 2.20, 2.41)  # much faster at depth 1 only
    write_round(tmp_path, "b", 1, 2.40, 2.39)  # 0.03 faster at 8,192
    builds = ab.load_builds(tmp_path)
    assert ab.faster(builds, 0.02) == ["b"]
    assert ab.faster(builds, 0.05) == []
    assert ab.faster(builds, 0.0) == ["a", "b"]


def test_main_prints_names_or_table(ab, tmp_path, capsys):
    write_round(tmp_path, "base", 1, 2.40, 2.42)
    write_round(tmp_path, "v", 1, 2.40, 2.30)
    assert ab.main([str(tmp_path), "--faster"]) == 0
    assert capsys.readouterr().out.strip() == "v"
    ab.main([str(tmp_path)])
    assert capsys.readouterr().out.count("median of 1") == 2


def test_model_picks_its_own_runs(ab, tmp_path, capsys):
    write_round(tmp_path, "base", 1, 2.40, 2.42)  # a 35B-A3B run in the same folder is not the 27B's
    write_round(tmp_path, "base", 1, 13.8, 13.9, model="27b")
    write_round(tmp_path, "no-x", 1, 13.6, 13.7, model="27b")
    builds = ab.load_builds(tmp_path, "27b")
    assert list(builds) == ["base", "no-x"]
    assert builds["base"].median(8192) == pytest.approx(13.9)
    assert ab.main([str(tmp_path), "--model", "27b", "--faster"]) == 0
    assert capsys.readouterr().out.strip() == "no-x"
    with pytest.raises(SystemExit, match="27b-base"):
        ab.load_builds(tmp_path / "missing", "27b")


def test_verify_windows_get_their_own_medians(ab, tmp_path):
    for build, rnd, window in [("base", 1, 9.2), ("base", 2, 9.4), ("v", 1, 8.9), ("v", 2, 9.0)]:
        report = {"decode": [{"depth": 8192, "ms_per_token": 7.3}],
                  "speculative": [{"depth": 8192, "draft_counts": [{"k": 3, "verify_ms": window}]}]}
        (tmp_path / f"27b-{build}-r{rnd}.json").write_text(json.dumps(report))
    builds = ab.load_builds(tmp_path, "27b")
    assert builds["v"].windows == {(8192, 3): [8.9, 9.0]}
    text = ab.table(builds)
    assert "4-token window at 8,192: 9.300 ms (9.200-9.400)" in text
    assert "4-token window at 8,192: 8.950 ms (8.900-9.000) -0.350" in text


def test_no_base_is_a_clear_error(ab, tmp_path):
    write_round(tmp_path, "v", 1, 2.40, 2.30)
    with pytest.raises(SystemExit, match="no base runs"):
        ab.load_builds(tmp_path)
