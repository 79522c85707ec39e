"""tests/gpu/expert_reuse.py: distinct experts per window of consecutive tokens, against brute force
and against the uniform-routing expectation; the whole measurement on the tiny MoE model's numpy
reference routing, and the CUDA branch's recorded routing on the fake native module."""

from __future__ import annotations

import json
import shutil

import numpy as np
import test_engine_cuda_cpu as fake

from lampo.engine import cuda
from lampo.models.checkpoint import Checkpoint
from lampo.models.presets import get_preset


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


def test_the_engine_routing_of_one_prefill(gpu_script, tiny_moe_dir, monkeypatch):
    """The CUDA branch on the fake native module: the engine records the routing of the one prefill
    of every id, and its [layers, N, k] ids are what is measured."""
    reuse = gpu_script("expert_reuse")
    cfg = get_preset("tiny-moe")

    class RoutingEngine(fake.FakeEngine):
        def set_record_routing(self, on):
            self.recording = on

        def routing(self):
            assert self.recording and self.calls[-1] == ("prefill", 40, True)
            n = len(self.history)
            return np.stack([(np.arange(n)[:, None] + np.arange(cfg.num_experts_per_tok) + layer) % cfg.num_experts
                             for layer in range(cfg.num_hidden_layers)]).astype(np.int32)

    native = fake.FakeNative(cfg)
    native.Engine = lambda config, names, bits, **options: RoutingEngine(native, config, names, bits, **options)
    monkeypatch.setattr(cuda, "load_native", lambda: native)
    ids = np.arange(100, 140, dtype=np.int32)
    with Checkpoint.open(tiny_moe_dir) as ck:
        routing = reuse.recorded_routing(ck, ids, "cuda")
    engine = native.engines[0]
    assert engine.context_max > len(ids) and engine.prefill_chunk == len(ids) and engine.history == ids.tolist()
    assert routing.shape == (cfg.num_hidden_layers, 40, cfg.num_experts_per_tok)
    rows = reuse.measure(routing, cfg.num_experts)
    assert [r["distinct"] for r in rows[:3]] == [min(cfg.num_experts, cfg.num_experts_per_tok + T - 1) for T in (1, 2, 3)]
