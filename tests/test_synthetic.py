"""Synthetic checkpoint writer: determinism, value scales, layout, bounded RAM, CLI."""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lampo.models.checkpoint import INDEX_NAME, SINGLE_NAME, Checkpoint
from lampo.models.presets import get_preset
from lampo.models.synthetic import main, plan_shards, write_checkpoint
from lampo.models.tensor_specs import EMBED, expected_tensors

MICRO_MOE = replace(get_preset("tiny-moe"), vocab_size=512, name="micro-moe")
L = "model.language_model.layers."


def _all_bytes(model_dir: Path) -> dict[str, bytes]:
    ck = Checkpoint.open(model_dir)
    return {n: ck.raw(n).tobytes() for n in ck.names()}


def test_identical_tensors_across_shard_sizes(tmp_path: Path):
    single = _all_bytes(write_checkpoint(tmp_path / "a", MICRO_MOE, seed=3))
    sharded = _all_bytes(write_checkpoint(tmp_path / "b", MICRO_MOE, seed=3, shard_mb=0.1))
    assert single == sharded
    other = _all_bytes(write_checkpoint(tmp_path / "c", MICRO_MOE, seed=4))
    assert all(other[n] != single[n] for n in single)


def test_shards_written_in_parallel_are_the_same(tmp_path: Path):
    for recipe in (None, "q5"):
        one = write_checkpoint(tmp_path / f"one-{recipe}", MICRO_MOE, seed=3, shard_mb=0.1, recipe=recipe)
        many = write_checkpoint(tmp_path / f"many-{recipe}", MICRO_MOE, seed=3, shard_mb=0.1, recipe=recipe, jobs=3)
        files = sorted(f.name for f in one.iterdir())
        assert len(files) > 3 and files == sorted(f.name for f in many.iterdir())
        assert all((one / f).read_bytes() == (many / f).read_bytes() for f in files)
    with pytest.raises(ValueError, match="jobs"):
        write_checkpoint(tmp_path / "x", MICRO_MOE, jobs=0)


def test_index_describes_the_shards(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO_MOE, shard_mb=0.1)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    specs = expected_tensors(MICRO_MOE)
    assert index["metadata"]["total_size"] == sum(s.nbytes for s in specs.values())
    assert set(index["weight_map"]) == set(specs)
    assert set(index["weight_map"].values()) == {p.name for p in tmp_path.glob("model-*.safetensors")}
    assert json.loads((tmp_path / "config.json").read_text()) == MICRO_MOE.to_hf_dict()


def test_rewriting_replaces_old_model_files(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO_MOE, shard_mb=0.1)
    write_checkpoint(tmp_path, MICRO_MOE)
    assert [p.name for p in tmp_path.glob("model*")] == [SINGLE_NAME]


def test_value_scales(tiny_moe_dir: Path):
    ck = Checkpoint.open(tiny_moe_dir)

    def stats(name):
        x = ck.tensor_f32(name)
        return float(x.mean()), float(x.std())

    mean, std = stats("model.language_model.embed_tokens.weight")
    assert abs(mean) < 0.01 and abs(std - 1) < 0.01
    _, std = stats("lm_head.weight")
    assert abs(std - 128**-0.5) < 0.01 * 128**-0.5
    _, std = stats(L + "0.mlp.experts.down_proj")  # fan_in = moe width 64
    assert abs(std - 64**-0.5) < 0.03 * 64**-0.5
    norm = np.concatenate([ck.tensor_f32(n) for n in ck.names() if n.endswith("layernorm.weight")])
    assert abs(norm.mean()) < 0.02 and 0.08 < norm.std() < 0.12  # zero-centred: a missing +1 shows
    gated = ck.tensor_f32(L + "0.linear_attn.norm.weight")
    assert abs(gated.mean() - 1) < 0.05
    a_log = np.concatenate([ck.tensor_f32(L + f"{i}.linear_attn.A_log") for i in range(3)])
    assert np.all((a_log >= 0) & (a_log <= np.log(16) + 0.01))


def test_streaming_uses_bounded_memory(tmp_path: Path):
    # embedding and lm_head are 12.8 M values each (51 MB as float32, 26 MB as bf16)
    cfg = replace(get_preset("tiny-dense"), vocab_size=100_000).with_layers(1)
    tracemalloc.start()
    try:
        write_checkpoint(tmp_path, cfg, with_mtp=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 25e6


def test_full_size_shard_plan():
    specs = expected_tensors(get_preset("qwen3.6-35b-a3b"))
    shards = plan_shards(specs, 5_000_000_000)
    assert [n for s in shards for n in s] == list(specs)
    sizes = [sum(specs[n].nbytes for n in s) for s in shards]
    assert all(size <= 5e9 for size in sizes) and len(shards) >= sum(sizes) / 5e9


def test_tokenizer_is_copied(tmp_path: Path):
    tok = tmp_path / "tok.json"
    tok.write_text('{"fake": true}')
    out = write_checkpoint(tmp_path / "ck", MICRO_MOE, tokenizer=tok)
    assert (out / "tokenizer.json").read_text() == '{"fake": true}'
    with pytest.raises(FileNotFoundError):
        write_checkpoint(tmp_path / "ck2", MICRO_MOE, tokenizer=tmp_path / "missing.json")


def test_cli(tmp_path: Path, capsys):
    out = tmp_path / "ck"
    assert main(["tiny-moe", str(out), "--layers", "1", "--no-mtp", "--seed", "7", "--shard-mb", "40"]) == 0
    ck = Checkpoint.open(out)
    assert ck.config.num_hidden_layers == 1 and not ck.has_mtp and len(ck.shards()) == 3
    assert "wrote" in capsys.readouterr().out
    assert main(["tiny-moe", str(out), "--layers", "9"]) == 2
    assert main(["qwen9", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--layers" in err[0] and "qwen9" in err[1]


def test_a_recipe_writes_the_converted_format_directly(tmp_path: Path):
    from lampo.models.quant.recipes import get_recipe, tensor_bits

    cfg = get_preset("tiny-moe")
    write_checkpoint(tmp_path / "a", cfg, seed=3, recipe="q4", shard_mb=0.5)
    write_checkpoint(tmp_path / "b", cfg, seed=3, recipe="q4")
    a, b = Checkpoint.open(tmp_path / "a"), Checkpoint.open(tmp_path / "b")
    assert a.lq.recipe == "q4"
    bits = tensor_bits(get_recipe("q4"), cfg)
    for name in a.names():
        t = a.quantized(name)
        assert (t.bits if t else "bf16") == bits[name]
        np.testing.assert_array_equal(a.raw(name), b.raw(name))  # the shard size changes nothing
        if t is not None:
            w = a.tensor_f32(name)
            target = 1.0 if name == EMBED else w.shape[-1] ** -0.5
            assert abs(w.std() / target - 1) < 0.1, name
    assert any(a.quantized(n) for n in a.names())
