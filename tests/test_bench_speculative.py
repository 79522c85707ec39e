"""`lampo bench --speculate-accept` on the reference backend (the CUDA engine runs the same code
through Engine.verify / accept): the verify costs and the set-acceptance runs are measured at each
depth, the state is put back after each, and the acceptance measured follows the one set."""

from __future__ import annotations

import json

import pytest
from lampo import bench, bench_speculative


def run_bench(tiny_dense_dir, tmp_path, *extra):
    out = tmp_path / "bench.json"
    rc = bench.main(["--model", str(tiny_dense_dir), "--backend", "reference", "--prompt", "5", "--depths", "0,9",
                     "--decode-tokens", "24", "--chunk", "8", "--json", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


def test_speculative_rounds_at_set_acceptance_rates(tiny_dense_dir, tmp_path, capsys):
    r = run_bench(tiny_dense_dir, tmp_path, "--speculate-accept", "1,0.5", "--draft-k", "1,3")
    assert [s["depth"] for s in r["speculative"]] == [d["depth"] for d in r["decode"]]
    for s in r["speculative"]:
        assert [d["k"] for d in s["draft_counts"]] == [1, 3]
        for d in s["draft_counts"]:
            assert d["verify_ms"] > 0 and d["verify_cost"] > 0
            full, half = d["runs"]
            assert (full["a"], half["a"]) == (1.0, 0.5)
            assert full["acceptance"] >= 0.9  # every draft right but where two rows' numerics tie
            assert 0.15 <= half["acceptance"] <= 0.85
            assert full["tokens_per_round"] > half["tokens_per_round"] >= 1.0
            assert full["tokens"] >= 24 and full["tokens_per_second"] > 0 and full["speedup"] > 0
            for run in (full, half):  # tok/s at the set rate: its mean tokens a round over the round's time
                assert run["expected_tokens_per_round"] == pytest.approx(sum(run["a"] ** i for i in range(d["k"] + 1)))
                assert run["tokens_per_second"] == pytest.approx(
                    run["expected_tokens_per_round"] * 1000.0 / run["ms_per_round"])
                assert run["tokens_per_second_measured"] == pytest.approx(run["tokens"] / run["seconds"])
                assert run["speedup"] / run["speedup_measured"] == pytest.approx(
                    run["expected_tokens_per_round"] / run["tokens_per_round"])
    out = capsys.readouterr().out
    assert "tok/round" in out and "at measured" in out


@pytest.mark.parametrize("a, k, want", [(1.0, 3, 4.0), (0.5, 1, 1.5), (0.8, 4, 1 + 0.8 + 0.64 + 0.512 + 0.4096)])
def test_a_round_emits_the_geometric_sum_of_its_acceptance_on_average(a, k, want):
    assert bench_speculative.expected_tokens_per_round(a, k) == pytest.approx(want)


def test_the_speculative_measurement_needs_valid_rates_and_counts(tiny_dense_dir, tmp_path):
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--speculate-accept", "1.5"])
    assert bench.main(["--model", str(tiny_dense_dir), "--backend", "reference", "--speculate-accept", "0.8",
                       "--draft-k", "9"]) == 2
    assert "speculative" not in run_bench(tiny_dense_dir, tmp_path)


def test_the_mtp_draft_chain_is_timed_and_run_in_the_rounds(tiny_dense_dir, tmp_path, capsys):
    r = run_bench(tiny_dense_dir, tmp_path, "--speculate-accept", "0.8", "--draft-k", "2", "--mtp")
    for s in r["speculative"]:
        (d,) = s["draft_counts"]
        assert d["draft_ms"] > 0 and d["draft_cost"] == pytest.approx(d["draft_ms"] / s["plain_ms_per_token"])
        assert d["runs"][0]["tokens"] >= 24
    assert "draft ms" in capsys.readouterr().out
    assert "draft_ms" not in json.dumps(run_bench(tiny_dense_dir, tmp_path, "--speculate-accept", "0.8",
                                                  "--draft-k", "2"))


def test_the_draft_chain_over_a_prefix_of_the_vocabulary_is_timed_beside_every_id(tiny_dense_dir, tmp_path,
                                                                                  capsys):
    r = run_bench(tiny_dense_dir, tmp_path, "--speculate-accept", "0.8", "--draft-k", "2", "--mtp",
                  "--draft-vocab", "98304")
    for s in r["speculative"]:
        (d,) = s["draft_counts"]
        assert s["draft_vocab"] == 98304 and d["draft_ms"] > 0 and d["draft_ms_every_id"] > 0
    assert "all ids" in capsys.readouterr().out
    assert bench.main(["--model", str(tiny_dense_dir), "--backend", "reference", "--speculate-accept", "0.8",
                       "--draft-vocab", "98304"]) == 2  # without --mtp
