"""Checkpoints in the layout of Qwen's FP8 releases (FP8 matrices with block scales, routed experts
as each expert's own matrices): opened, read back as bf16, run by the reference engine, converted,
described by `lampo info`, and one clear line for each way they can be broken."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from helpers.fp8_checkpoints import bf16_twin
from lampo.info import describe
from lampo.models.checkpoint import SINGLE_NAME, Checkpoint
from lampo.models.checkpoint_parts import Assembled, Fp8Matrix
from lampo.models.fp8 import FP8, scale_name
from lampo.models.fp8_release import is_fp8, publish_fp8
from lampo.models.presets import get_preset
from lampo.models.quant import convert as convert_module
from lampo.models.quant.convert import NumpyBlockQuantizer, convert
from lampo.models.reference.model import ReferenceModel
from lampo.models.synthetic import write_checkpoint
from lampo.models.tensor_specs import expected_tensors

from test_checkpoint import _error, _rewrite

MICRO = replace(get_preset("tiny-dense"), vocab_size=512, name="micro-dense")
MICRO_MOE = replace(get_preset("tiny-moe"), vocab_size=512, name="micro-moe")
LAYER0 = "model.language_model.layers.0."
GATE_UP = LAYER0 + "mlp.experts.gate_up_proj"
QKV = LAYER0 + "linear_attn.in_proj_qkv.weight"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fp8")
    return {name: write_checkpoint(root / name, cfg, seed=3) for name, cfg in (("dense", MICRO), ("moe", MICRO_MOE))}


@pytest.fixture(scope="module")
def fp8_moe(sources, tmp_path_factory) -> Path:
    return publish_fp8(sources["moe"], tmp_path_factory.mktemp("fp8-moe") / "ck", block=(32, 32))


def test_publish_writes_the_release_layout(fp8_moe):
    config = json.loads((fp8_moe / "config.json").read_text())
    q = config["quantization_config"]
    assert q["quant_method"] == "fp8" and q["fmt"] == "e4m3" and q["weight_block_size"] == [32, 32]
    assert LAYER0 + "mlp.gate" in q["modules_to_not_convert"] and "lm_head" in q["modules_to_not_convert"]
    from lampo.models.safetensors_io import read_header
    stored = {t.name: t for t in read_header(fp8_moe / SINGLE_NAME)}
    assert GATE_UP not in stored and stored[LAYER0 + "mlp.experts.7.up_proj.weight"].dtype == FP8
    assert stored[scale_name(QKV)].dtype == "F32" and stored["lm_head.weight"].dtype == "BF16"
    assert stored[LAYER0 + "linear_attn.in_proj_a.weight"].dtype == "BF16"


@pytest.mark.parametrize("kind,block", [("dense", (32, 32)), ("moe", (32, 32)), ("moe", (128, 128)), ("moe", None)])
def test_fp8_checkpoint_reads_back_as_bf16(sources, tmp_path, kind, block):
    src = Checkpoint.open(sources[kind])
    ck = Checkpoint.open(publish_fp8(sources[kind], tmp_path / "ck", block=block))
    assert ck.fp8_block == block and ck.ignored == () and ck.names() == src.names() and ck.has_mtp
    for name in ck.names():
        spec, raw = ck.spec(name), ck.raw(name)
        assert spec.shape == src.spec(name).shape and raw.shape == spec.shape
        want, got = src.tensor_f32(name), ck.tensor_f32(name)
        if block is None or not isinstance(ck.source(name), Assembled) or not ck.source(name).has_fp8:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:  # FP8's 3 mantissa bits, then bf16: within 1/16 + 2^-8 of each value, 2^-10 of its block's scale
            amax = np.abs(want).max()
            assert np.all(np.abs(got - want) <= np.abs(want) * (1 / 16 + 2.0**-8) + amax / 448 * 2.0**-10), name
    files = sum(p.stat().st_size for p in ck.model_dir.glob("*.safetensors"))
    assert ck.total_bytes < files and sorted(n for _, ns in ck.shards() for n in ns) == sorted(ck.names())


def test_an_expert_bank_is_its_experts_rows_in_order(fp8_moe):
    ck = Checkpoint.open(fp8_moe)
    bank = ck.source(GATE_UP)
    assert isinstance(bank, Assembled) and len(bank.parts) == 2 * MICRO_MOE.num_experts
    assert all(isinstance(p, Fp8Matrix) for p in bank.parts)
    up3 = bank.parts[2 * 3 + 1]
    assert up3.codes.name == LAYER0 + "mlp.experts.3.up_proj.weight"
    i = MICRO_MOE.moe_intermediate_size
    np.testing.assert_array_equal(ck.raw(GATE_UP)[3, i:], up3.bf16(ck.view))
    assert ck.path_of(GATE_UP) == fp8_moe / SINGLE_NAME
    with pytest.raises(TypeError, match="assembled from 16 stored parts"):
        ck.stored(GATE_UP)


def test_reference_engine_runs_the_fp8_weights_as_their_bf16_twin(fp8_moe, tmp_path):
    twin = bf16_twin(fp8_moe, tmp_path / "twin")
    ids = np.arange(5, 45, dtype=np.int32)
    rows = []
    for model_dir in (fp8_moe, twin):
        model = ReferenceModel.from_checkpoint(Checkpoint.open(model_dir))
        rows.append(model.prefill(ids, last_only=True))
    np.testing.assert_array_equal(rows[0], rows[1])


class _RecordingQuantizer(NumpyBlockQuantizer):
    """The numpy quantizer, noting the rows of every FP8 block it is given."""

    def __init__(self):
        self.fp8_rows: list[int] = []

    def quantize_fp8(self, codes, scales, block_rows, block_cols, bits):
        assert scales.shape == (-(-codes.shape[0] // block_rows), -(-codes.shape[1] // block_cols))
        self.fp8_rows.append(codes.shape[0])
        return super().quantize_fp8(codes, scales, block_rows, block_cols, bits)


@pytest.mark.parametrize("block_elements", [None, 32 * 64])
def test_convert_from_fp8_equals_convert_from_its_bf16_twin(fp8_moe, tmp_path, monkeypatch, block_elements):
    """FP8 parts go to the quantizer as codes and scales, in blocks of whole 32-row weight blocks
    (several a part when the blocks are small), and give the bytes of the bf16 twin's conversion."""
    twin = bf16_twin(fp8_moe, tmp_path / "twin")
    if block_elements:
        monkeypatch.setattr(convert_module, "BLOCK_ELEMENTS", block_elements)
    quantizer = _RecordingQuantizer()
    convert(fp8_moe, tmp_path / "from-fp8", "q5", quantizer=quantizer)
    convert(twin, tmp_path / "from-twin", "q5")
    a, b = Checkpoint.open(tmp_path / "from-fp8"), Checkpoint.open(tmp_path / "from-twin")
    assert a.names() == b.names() and a.lq.recipe == "q5"
    for name in a.names():
        np.testing.assert_array_equal(a.raw(name), b.raw(name), err_msg=name)
    src = Checkpoint.open(fp8_moe)
    fp8_parts = [p for n in a.names() if a.lq.tensors[n].quantized
                 for p in getattr(src.source(n), "parts", ()) if isinstance(p, Fp8Matrix)]
    assert sum(quantizer.fp8_rows) == sum(p.shape[0] for p in fp8_parts) > 0
    assert all(rows % 32 == 0 for rows in quantizer.fp8_rows)
    if block_elements:
        assert max(quantizer.fp8_rows) == 32 < max(p.shape[0] for p in fp8_parts)


def test_info_names_the_fp8_weights(fp8_moe):
    text = describe(fp8_moe)
    assert "FP8 (e4m3, 32x32 blocks)" in text and "0 tensors ignored" in text


# ---- broken FP8 checkpoints: one line each ------------------------------------------------------
def _fp8_copy(fp8_moe: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ck"
    out.mkdir()
    for f in fp8_moe.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def test_missing_scales_are_named(fp8_moe, tmp_path):
    ck = _fp8_copy(fp8_moe, tmp_path)
    _rewrite(ck / SINGLE_NAME, lambda t: t.pop(scale_name(QKV)))
    msg = _error(ck)
    assert repr(QKV) in msg and "block scales" in msg and repr(scale_name(QKV)) in msg


def test_misshapen_scales_are_named(fp8_moe, tmp_path):
    ck = _fp8_copy(fp8_moe, tmp_path)

    def edit(t):
        dtype, shape, data = t[scale_name(QKV)]
        t[scale_name(QKV)] = [dtype, (shape[0] - 1, shape[1]), data[: (shape[0] - 1) * shape[1] * 4]]

    _rewrite(ck / SINGLE_NAME, edit)
    msg = _error(ck)
    assert repr(scale_name(QKV)) in msg and "32x32 blocks" in msg


def test_fp8_without_its_quantization_config(fp8_moe, tmp_path):
    ck = _fp8_copy(fp8_moe, tmp_path)
    config = json.loads((ck / "config.json").read_text())
    del config["quantization_config"]
    (ck / "config.json").write_text(json.dumps(config))
    assert "no fp8 quantization_config" in _error(ck)


def test_another_quantization_method_is_refused(sources, tmp_path):
    ck = _fp8_copy(sources["dense"], tmp_path)
    config = json.loads((ck / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (ck / "config.json").write_text(json.dumps(config))
    assert "quant_method 'awq'" in _error(ck)


def test_a_missing_expert_is_named(fp8_moe, tmp_path):
    ck = _fp8_copy(fp8_moe, tmp_path)
    part = LAYER0 + "mlp.experts.5.down_proj.weight"
    _rewrite(ck / SINGLE_NAME, lambda t: (t.pop(part), t.pop(scale_name(part))))
    msg = _error(ck)
    assert repr(part) in msg and "7 of 8 present" in msg and repr(LAYER0 + "mlp.experts.down_proj") in msg


def test_an_fp8_vector_is_refused(fp8_moe, tmp_path):
    ck = _fp8_copy(fp8_moe, tmp_path)
    norm = LAYER0 + "input_layernorm.weight"

    def edit(t):
        _dtype, shape, data = t[norm]
        t[norm] = [FP8, shape, data[: shape[0]]]

    _rewrite(ck / SINGLE_NAME, edit)
    assert "FP8 matrices only" in _error(ck)


def test_every_projection_of_the_release_is_fp8():
    specs = expected_tensors(MICRO_MOE)
    assert is_fp8(QKV, specs[QKV]) and is_fp8("mtp.layers.0.self_attn.q_proj.weight", specs["mtp.layers.0.self_attn.q_proj.weight"])
    for kept in ("lm_head.weight", "mtp.fc.weight", LAYER0 + "mlp.gate.weight", LAYER0 + "mlp.shared_expert_gate.weight",
                 LAYER0 + "linear_attn.in_proj_b.weight", LAYER0 + "linear_attn.conv1d.weight", LAYER0 + "input_layernorm.weight"):
        assert not is_fp8(kept, specs[kept]), kept
