"""The engine's NaN/Inf census of the weights in VRAM (native/src/weights/nonfinite_scan.cu, returned by
`Engine.nonfinite_census`) against the numpy reference (`lampo.models.finite_scan`): tiny checkpoints
with non-finite values planted in chosen tensors (parts of fused blocks, single values in the middle
and at the end of the big embedding and LM head, F32 tensors in F32 and in BF16 slots) must be
reported with exactly those tensors, counts and first indices; a clean checkpoint reports nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers.nonfinite import BF16_INF, BF16_NAN, BF16_NEG_INF, F32_INF, F32_NAN, plant
from lampo.engine.cuda import load_weights
from lampo.models.checkpoint import Checkpoint, CheckpointError
from lampo.models.finite_scan import scan_checkpoint
from lampo.models.presets import get_preset
from lampo.models.synthetic import write_checkpoint
from lampo.models.tensor_specs import engine_tensor_names

_native = pytest.importorskip("lampo._native")
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device")]

LAYER = "model.language_model.layers."
EMBED = "model.language_model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
EMBED_N = 248_320 * 128  # the tiny presets keep the real vocabulary: 31.8 M values

# (tensor, flat indices, bit pattern): the damage planted in both presets
COMMON = [
    (f"{LAYER}3.self_attn.k_proj.weight", [0, 5, 255], BF16_INF),  # middle part of the fused q|k|v block
    (f"{LAYER}3.self_attn.v_proj.weight", [256 * 128 - 1], 0xFFC1),  # last value of the block's last part, a -NaN
    (f"{LAYER}1.linear_attn.in_proj_b.weight", [3], BF16_NEG_INF),  # third part of the fused GDN projection
    (EMBED, [EMBED_N // 2 + 1, EMBED_N // 2, EMBED_N - 1], BF16_NAN),  # the middle and the end of 63 MB
    (LM_HEAD, [EMBED_N // 3], 0x7F81),  # a signalling-NaN pattern
    (f"{LAYER}0.linear_attn.A_log", [1], F32_NAN),  # F32 in the checkpoint and in VRAM
    (f"{LAYER}2.input_layernorm.weight", [127], F32_INF),  # F32 in the checkpoint, BF16 in VRAM
]
BY_PRESET = {
    "tiny-dense": [(f"{LAYER}2.mlp.up_proj.weight", [256 * 128 - 2], BF16_NAN)],  # second part of gate|up
    "tiny-moe": [(f"{LAYER}2.mlp.shared_expert.up_proj.weight", [64], BF16_INF),  # fused shared gate|up
                 (f"{LAYER}1.mlp.experts.gate_up_proj", [8 * 128 * 128 - 1], BF16_NAN)],  # end of an expert bank
}


@pytest.fixture(scope="module", params=sorted(BY_PRESET))
def preset(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def clean(preset: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp(preset)
    return write_checkpoint(d, get_preset(preset), seed=2, with_mtp=False, vector_dtype="F32")


@pytest.fixture
def damaged(preset: str, clean: Path, tmp_path: Path) -> tuple[Path, dict[str, tuple[int, int]]]:
    """A damaged copy and the census it must give: {tensor: (count, first index)}."""
    d = Path(shutil.copytree(clean, tmp_path / "ck"))
    expected = {}
    for name, indices, bits in COMMON + BY_PRESET[preset]:
        plant(d, name, indices, bits)
        expected[name] = (len(indices), min(indices))
    return d, expected


def _engine(ck: Checkpoint):
    return _native.Engine(ck.config, engine_tensor_names(ck.config), context_max=256, prefill_chunk=64,
                          snapshot_slots=1)


def engine_census(model_dir: Path) -> dict[str, tuple[int, int]]:
    ck = Checkpoint.open(model_dir, include_mtp=False)
    engine = _engine(ck)
    wanted = {name for name, _shape, _dtype in engine.weight_specs()}
    for _path, names in ck.shards():
        for name in names:
            if name in wanted:
                engine.load_tensor(name, ck.raw(name))
    engine.finish_loading()
    return {name: (count, first) for name, count, first in engine.nonfinite_census()}


def test_clean_checkpoint_reports_nothing(clean: Path):
    assert engine_census(clean) == {}
    ck = Checkpoint.open(clean, include_mtp=False)
    assert load_weights(_engine(ck), ck) == ck.total_bytes


def test_census_names_exactly_the_damaged_tensors(damaged):
    model_dir, expected = damaged
    found = engine_census(model_dir)
    assert found == expected
    reference = {f.name: (f.count, f.first) for f in scan_checkpoint(Checkpoint.open(model_dir, include_mtp=False))}
    assert found == reference


def test_load_weights_refuses_by_name(damaged):
    model_dir, expected = damaged
    ck = Checkpoint.open(model_dir, include_mtp=False)
    with pytest.raises(CheckpointError) as e:
        load_weights(_engine(ck), ck)
    msg = str(e.value)
    assert msg.startswith("checkpoint: model.safetensors: tensor ") and "\n" not in msg
    assert f"so do {len(expected) - 1} more tensors" in msg
