"""tests/gpu/expert_reuse.py: distinct experts per window of consecutive tokens, against brute force
and against the uniform-routing expectation, and the whole measurement on the tiny MoE model's
numpy reference routing."""

from __future__ import annotations

import json
import shutil

import numpy as np


def test_window_distinct_counts_each_windows_experts(gpu_script):
    reuse = gpu_script("expert_reuse")
    rng = np.random.default_rng(0)
    ids = np.stack([np.stack([rng.choice(16, 4, replace=False) for _ in range(20)]) for _ in range(3)])
    for T in range(1, 6):
        got = reuse.window_distinct(ids, T)
        want = [[len(set(ids[l, i:i + T].ravel())) for i in range(20 - T + 1)] for l in range(3)]
        assert got.tolist() == want


def test_uniform_distinct_is_the_mean_of_uniform_routing(gpu_script):
    reuse = gpu_script("expert_reuse")
    rng = np.random.default_rng(1)
    E, k, T = 32, 4, 4
    draws = [len({int(e) for _ in range(T) for e in rng.choice(E, k, replace=False)}) for _ in range(20000)]
    assert abs(np.mean(draws) - reuse.uniform_distinct(E, k, T)) < 0.05
    assert reuse.uniform_distinct(E, k, 1) == k


def test_measurement_on_the_reference_routing(gpu_script, tiny_moe_dir, qwen_dir, tmp_path):
    reuse = gpu_script("expert_reuse")
    model = shutil.copytree(tiny_moe_dir, tmp_path / "model")
    shutil.copy(qwen_dir / "tokenizer.json", model / "tokenizer.json")
    text = tmp_path / "text.md"
    text.write_text("The verify window reads each expert that its tokens choose. " * 8)
    out = tmp_path / "reuse.json"
    assert reuse.main([str(model), "--text", str(text), "--tokens", "40", "--backend", "reference",
                       "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    k, E = report["top_k"], report["experts"]
    rows = {r["tokens"]: r for r in report["windows"]}
    assert report["tokens"] == 40 and sorted(rows) == list(range(1, 9))
    assert rows[1]["distinct"] == k and rows[1]["share_of_pairs"] == 1.0
    for T, r in rows.items():
        assert r["layer_min"] <= r["distinct"] <= r["layer_max"] <= min(E, T * k)
        assert r["uniform"] == reuse.uniform_distinct(E, k, T)
