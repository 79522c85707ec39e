"""Checkpoint.open: round trips through the synthetic writer, and one clear line per broken input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers.safetensors_file import write_safetensors

from lampo.models.bf16 import from_bf16, round_bf16
from lampo.models.checkpoint import INDEX_NAME, SINGLE_NAME, Checkpoint, CheckpointError
from lampo.models.presets import get_preset
from lampo.models.safetensors_io import read_header
from lampo.models.synthetic import synthetic_tensor, tensor_blocks, write_checkpoint
from lampo.models.tensor_specs import expected_tensors, is_mtp

# The tiny presets with a 512-row vocabulary: a whole checkpoint is ~1.5 MB and writes in ms.
MICRO = replace(get_preset("tiny-dense"), vocab_size=512, name="micro-dense")
MICRO_MOE = replace(get_preset("tiny-moe"), vocab_size=512, name="micro-moe")
Q_PROJ = "model.language_model.layers.3.self_attn.q_proj.weight"
Z_PROJ = "model.language_model.layers.1.linear_attn.in_proj_z.weight"


def _error(model_dir: Path, **kw) -> str:
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(model_dir, **kw)
    msg = str(e.value)
    assert msg.startswith("checkpoint: ") and "\n" not in msg
    return msg


def _rewrite(path: Path, edit) -> None:
    """Rewrite a safetensors file through `edit(tensors)`, tensors: name -> [dtype, shape, bytes]."""
    with open(path, "rb") as f:
        tensors = {}
        for t in read_header(path):
            f.seek(t.start)
            tensors[t.name] = [t.dtype, t.shape, f.read(t.nbytes)]
    edit(tensors)
    write_safetensors(path, tensors)


# ---- round trips -------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,fixture", [("tiny-dense", "tiny_dense_dir"), ("tiny-moe", "tiny_moe_dir")])
def test_fixture_round_trip(preset: str, fixture: str, request):
    model_dir = request.getfixturevalue(fixture)
    cfg = get_preset(preset)
    ck = Checkpoint.open(model_dir)
    specs = expected_tensors(cfg)
    assert ck.config == cfg and ck.has_mtp and ck.notes == () and ck.ignored == ()
    assert ck.names() == list(specs)
    assert ck.total_bytes == sum(s.nbytes for s in specs.values())
    assert [(p.name, names) for p, names in ck.shards()] == [(SINGLE_NAME, list(specs))]
    for name in ("model.language_model.layers.0.linear_attn.A_log", "model.language_model.layers.3.self_attn.q_proj.weight",
                 "model.language_model.layers.2.mlp.down_proj.weight" if not cfg.is_moe
                 else "model.language_model.layers.2.mlp.experts.gate_up_proj", "mtp.fc.weight"):
        raw = ck.raw(name)
        assert raw.dtype == np.uint16 and raw.shape == specs[name].shape
        assert not raw.flags.writeable and not raw.flags.owndata  # a view of the map, not a copy
        np.testing.assert_array_equal(ck.tensor_f32(name), synthetic_tensor(name, specs[name], seed=0))
        assert ck.spec(name).shape == specs[name].shape and ck.spec(name).dtype == "BF16"
    # the big ones: the first block of their random stream
    for name in ("model.language_model.embed_tokens.weight", "lm_head.weight"):
        first = round_bf16(next(tensor_blocks(name, specs[name], seed=0)))
        np.testing.assert_array_equal(from_bf16(ck.raw(name).reshape(-1)[: first.size]), first)


def test_sharded_round_trip(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO_MOE, shard_mb=0.2)
    ck = Checkpoint.open(tmp_path)
    shards = ck.shards()
    assert len(shards) > 2 and (tmp_path / INDEX_NAME).is_file() and not (tmp_path / SINGLE_NAME).exists()
    assert [p.name for p, _ in shards] == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    in_files = [n for _, names in shards for n in names]
    assert in_files == ck.names() == list(expected_tensors(MICRO_MOE))
    gate_up = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    assert ck.raw(gate_up).shape == (8, 128, 128)


def test_f32_vectors_are_accepted(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO, vector_dtype="F32")
    ck = Checkpoint.open(tmp_path)
    name = "model.language_model.layers.0.linear_attn.A_log"
    assert ck.raw(name).dtype == np.float32 and ck.spec(name).dtype == "F32"
    assert ck.raw(Q_PROJ).dtype == np.uint16
    # same values as a BF16 write, before the BF16 rounding
    assert np.allclose(ck.tensor_f32(name), synthetic_tensor(name, expected_tensors(MICRO)[name]), rtol=1e-2)


def test_unused_tensors_are_ignored_and_counted(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO, shard_mb=0.5)
    extra = tmp_path / "model-vision.safetensors"
    write_safetensors(extra, {"model.visual.blocks.0.attn.qkv.weight": ["BF16", (4, 2), bytes(16)],
                              "model.visual.pos_embed.weight": ["F16", (3,), bytes(6)]})
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    index["weight_map"].update({"model.visual.blocks.0.attn.qkv.weight": extra.name,
                                "model.visual.pos_embed.weight": extra.name})
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    ck = Checkpoint.open(tmp_path)
    assert len(ck.ignored) == 2 and extra not in [p for p, _ in ck.shards()]


def test_checkpoint_without_mtp_opens_without_it(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO, with_mtp=False)
    ck = Checkpoint.open(tmp_path)
    assert not ck.has_mtp and "MTP" in ck.notes[0]
    assert ck.names() == list(expected_tensors(MICRO, include_mtp=False))


def test_include_mtp_false_skips_present_mtp(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO)
    ck = Checkpoint.open(tmp_path, include_mtp=False)
    assert not ck.has_mtp and not any(is_mtp(n) for n in ck.names())
    assert len(ck.ignored) == sum(is_mtp(n) for n in expected_tensors(MICRO))


# ---- error paths: exactly one line naming the problem ----------------------------------------
def test_missing_tensor(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO)
    _rewrite(tmp_path / SINGLE_NAME, lambda t: t.pop(Z_PROJ))
    msg = _error(tmp_path)
    assert f"tensor '{Z_PROJ}' (BF16 [256, 128]) is missing" in msg


def test_wrong_shape(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO)

    def halve(t):
        dtype, shape, data = t[Q_PROJ]
        t[Q_PROJ] = [dtype, (shape[0] // 2, shape[1]), data[: len(data) // 2]]

    _rewrite(tmp_path / SINGLE_NAME, halve)
    assert _error(tmp_path) == (
        f"checkpoint: model.safetensors: tensor '{Q_PROJ}' has shape [512, 128], expected [1024, 128]"
    )


def test_wrong_dtype(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO)

    def to_f32(t):
        dtype, shape, data = t[Q_PROJ]
        t[Q_PROJ] = ["F32", shape, from_bf16(np.frombuffer(data, np.uint16)).tobytes()]

    _rewrite(tmp_path / SINGLE_NAME, to_f32)
    assert _error(tmp_path) == f"checkpoint: model.safetensors: tensor '{Q_PROJ}' has dtype F32, expected BF16"


def test_truncated_shard(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO, shard_mb=0.5)
    last = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    size = last.stat().st_size
    with open(last, "r+b") as f:
        f.truncate(size - 100)
    msg = _error(tmp_path)
    assert last.name in msg and "truncated" in msg and "'mtp.norm.weight'" in msg
    assert f"up to {size}" in msg and f"only {size - 100} bytes" in msg


def test_bad_header_length(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO)
    path = tmp_path / SINGLE_NAME
    data = bytearray(path.read_bytes())
    data[:8] = (10**12).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    msg = _error(tmp_path)
    assert "model.safetensors: bad header" in msg


def test_bad_header_json(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO)
    path = tmp_path / SINGLE_NAME
    data = bytearray(path.read_bytes())
    data[8:12] = b"{{{{"
    path.write_bytes(bytes(data))
    assert "model.safetensors: bad header: not valid JSON" in _error(tmp_path)


def test_short_file(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO)
    (tmp_path / SINGLE_NAME).write_bytes(b"\x01\x02")
    assert "too short" in _error(tmp_path)


def test_missing_shard_file(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO, shard_mb=0.5)
    second = sorted(tmp_path.glob("model-*.safetensors"))[1]
    second.unlink()
    assert f"names shard {second.name}, which is missing" in _error(tmp_path)


def test_index_and_shard_disagree(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO, shard_mb=0.5)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    files = sorted(set(index["weight_map"].values()))
    index["weight_map"][Q_PROJ] = next(f for f in files if f != index["weight_map"][Q_PROJ])
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    assert f"tensor '{Q_PROJ}'" in _error(tmp_path)


def test_bad_index_json(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO, shard_mb=0.5)
    (tmp_path / INDEX_NAME).write_text("{")
    assert f"{INDEX_NAME} is not valid JSON" in _error(tmp_path)


def test_duplicate_tensor(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO, shard_mb=0.5)
    first, second = sorted(tmp_path.glob("model-*.safetensors"))[:2]
    name = read_header(first)[0].name

    def add(t):
        t[name] = ["BF16", (1,), bytes(2)]

    _rewrite(second, add)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    del index["weight_map"][name]  # the index cannot say which one is meant
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    msg = _error(tmp_path)
    assert f"tensor '{name}' also appears in" in msg


def test_partial_mtp(tmp_path: Path):
    write_checkpoint(tmp_path, MICRO)
    _rewrite(tmp_path / SINGLE_NAME, lambda t: t.pop("mtp.fc.weight"))
    msg = _error(tmp_path)
    assert "MTP module is incomplete" in msg and "'mtp.fc.weight'" in msg


def test_no_weights_and_no_config(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(MICRO.to_hf_dict()))
    assert "neither" in _error(tmp_path)
    (tmp_path / "config.json").unlink()
    assert "config.json not found" in _error(tmp_path)
    assert "is not a directory" in _error(tmp_path / "nope")
