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


def test_the_report_says_where_the_weights_came_from_and_the_host_memory(tmp_path, capsys):
    from lampo.models.presets import get_preset
    from lampo.models.synthetic import write_checkpoint

    small = ["--prompt", "8", "--depths", "0", "--decode-tokens", "2", "--backend", "reference"]
    model = write_checkpoint(tmp_path / "q5", get_preset("tiny-dense"), with_mtp=False, recipe="q5")
    runs = {"random": ["--preset", "tiny-dense", "--random-weights"], "files": ["--model", str(model)]}
    for source, argv in runs.items():
        out = tmp_path / f"{source}.json"
        assert main([*argv, *small, "--json", str(out)]) == 0
        r = json.loads(out.read_text())
        assert r["weights_from"] == source and r["stored_format"] == (None if source == "random" else "q5")
        host = r["host_memory"]
        assert 0 < host["peak_rss_after_load_mib"] <= host["peak_rss_end_mib"]
        assert 0 < host["load_peak_anon_mib"] <= host["peak_rss_end_mib"]  # /proc: the tests run on Linux
        assert r["load"]["seconds"] > 0
        assert f"from {source}; anonymous at most" in capsys.readouterr().out


def test_the_bandwidth_probe_fits_beside_the_engine_under_a_vram_limit():
    from lampo.bench import BANDWIDTH_PROBE_BYTES, MIN_PROBE_BYTES, probe_bytes

    gib = 1 << 30
    assert probe_bytes(0, 100 * gib) == BANDWIDTH_PROBE_BYTES  # no limit: the full probe
    assert probe_bytes(23 * gib, 10 * gib) == BANDWIDTH_PROBE_BYTES
    # 23 GiB limit, 21.58 GiB held by the engine: two buffers of what is left, whole MiB
    left = probe_bytes(23 * gib, int(21.58 * gib))
    assert 2 * left <= 23 * gib - int(21.58 * gib) and left % (1 << 20) == 0 and left >= MIN_PROBE_BYTES
    assert probe_bytes(23 * gib, 23 * gib - 2 * MIN_PROBE_BYTES + 1) == 0  # too little room: no probe
    assert probe_bytes(23 * gib, 24 * gib) == 0
