"""`lampo bench` on the CPU: the numpy reference engine through the chat's own step adapter, the
report and its JSON (the CUDA run is the same code with the native adapter, on a GPU)."""

from __future__ import annotations

import json

from lampo.bench import main


def test_reference_bench_reaches_each_depth_and_writes_its_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--preset", "tiny-moe", "--random-weights", "--prompt", "40,70", "--depths", "0,50",
            "--decode-tokens", "3", "--chunk", "16", "--backend", "reference", "--json", str(out)]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["backend"] == "reference" and r["chunk"] == 16
    assert [p["tokens"] for p in r["prefill"]] == [40, 70]
    assert [(d["depth"], d["reached_by"], d["tokens"]) for d in r["decode"]] == [(1, "prefill", 3), (50, "prefill", 3)]
    assert all(d["tokens_per_second"] > 0 and d["bytes_per_token"]["total"] > 0 for d in r["decode"])
    assert "prefill tokens" in capsys.readouterr().out


def test_fast_depth_needs_the_cuda_engine(capsys):
    assert main(["--preset", "tiny-moe", "--random-weights", "--depths", "0,50", "--fast-depth",
                 "--backend", "reference"]) == 2
    assert "--fast-depth needs the CUDA engine" in capsys.readouterr().err
