"""The CUDA engine with LQ weights (docs/weight-format.md) against the numpy reference on the same
weights: a converted checkpoint as stored (the reference dequantizes it), a bf16 checkpoint
quantized on the GPU while loading (the reference gets the numpy quantizer's weights), a converted
one dequantized into bf16 blocks, and full-width 4-layer checkpoints written in the packed format.
Checkpoints are converted on the GPU (`lampo convert`'s quantizer there: the numpy conversion's
bytes, test_convert_gpu.py), which takes a fraction of numpy's time.

MoE oracle, exact: the engine records the experts it chose per layer and token (set_record_routing),
the reference replays them (ffn.Routing), so a router near-tie cannot move a row, and every row of
both model kinds must meet the dense tolerance of test_engine.py (rel L2 <= 4e-2, 4 of the top 5).
Decode rows are one-token prefills (the decode step's kernels, un-graphed, so their routing can be
recorded); the graphed step is then checked against them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from lampo.engine.cuda import load_weights
from lampo.models.checkpoint import Checkpoint, CheckpointError
from lampo.models.finite_scan import scan_checkpoint
from lampo.models.presets import get_preset
from lampo.models.quant import layout
from lampo.models.quant.convert import convert as convert_with
from lampo.models.quant.engine_formats import engine_tensor_bits, recipe_tensor_bits
from lampo.models.quant.round_trip import quantized_weights
from lampo.models.reference.ffn import Routing
from lampo.models.reference.model import ReferenceModel
from lampo.models.synthetic import write_checkpoint
from lampo.models.tensor_specs import engine_tensor_names

from .test_engine import _full_width_module, assert_rows_match_reference, fresh, prompt_ids, rel_l2

_native = pytest.importorskip("lampo._native")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device"),
]


def convert(src: Path, out: Path, recipe: str) -> None:
    """`lampo convert SRC OUT --recipe RECIPE --quantizer cuda`."""
    convert_with(src, out, recipe, quantizer=_native.LqBlockQuantizer())


def lq_engine(ck: Checkpoint, bits: dict[str, int], context_max=1024, chunk=256, **options):
    engine = _native.Engine(ck.config, engine_tensor_names(ck.config), bits, context_max=context_max,
                            prefill_chunk=chunk, snapshot_slots=2, **options)
    load_weights(engine, ck)
    if ck.config.is_moe:
        engine.set_record_routing(True)
    return fresh(engine)


def stored_bits(ck: Checkpoint) -> dict[str, int]:
    return engine_tensor_bits(ck.config, {n: t.bits for n, t in ck.lq.tensors.items()})


def routing(engine, cfg) -> Routing | None:
    return Routing(engine.routing()) if cfg.is_moe else None


def rows_against_reference(engine, ref: ReferenceModel, cfg, n_prompt=150, steps=6, seed=0):
    """Prefill (one call) and `steps` teacher-forced one-token steps, each row of the reference
    run with the engine's experts."""
    vocab = cfg.real_vocab_size
    ids = prompt_ids(n_prompt, seed=seed, vocab=vocab)
    fresh(engine)
    ref.reset()
    engine.prefill(ids, True)
    rows = [(engine.logits(), ref.prefill(ids, last_only=True, routing=routing(engine, cfg)))]
    for token in prompt_ids(steps, seed=seed + 5, vocab=vocab):
        engine.prefill(np.asarray([token], np.int32), True)
        rows.append((engine.logits(), ref.decode(int(token), routing=routing(engine, cfg))))
    return rows


def quantized_reference(ck: Checkpoint, bits: dict[str, int]) -> ReferenceModel:
    """The reference on the weights the numpy quantizer makes of each tensor in `bits`, the
    checkpoint's own elsewhere."""
    return ReferenceModel(ck.config, quantized_weights(ck, bits))


@pytest.fixture(scope="module", params=["tiny-dense", "tiny-moe"])
def bf16_dir(request, tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp(request.param), get_preset(request.param), seed=1,
                            with_mtp=False)


@pytest.mark.parametrize("recipe", ["q5", "q4"])
def test_a_converted_checkpoint_matches_the_reference_on_its_weights(bf16_dir, recipe, tmp_path):
    convert(bf16_dir, tmp_path / recipe, recipe)
    ck = Checkpoint.open(tmp_path / recipe, include_mtp=False)
    bits = stored_bits(ck)
    engine = lq_engine(ck, bits)
    assert bits and {f for _n, _s, f in engine.weight_specs()} >= {f"LQ{b}" for b in set(bits.values())}
    rows = rows_against_reference(engine, ReferenceModel.from_checkpoint(ck), ck.config)
    assert_rows_match_reference(rows, f"{ck.config.name} {recipe} (as stored)", moe=False)


def test_quantize_on_load_matches_the_numpy_quantizer(bf16_dir):
    ck = Checkpoint.open(bf16_dir, include_mtp=False)
    bits = recipe_tensor_bits(ck.config, "q5")
    engine = lq_engine(ck, bits)
    rows = rows_against_reference(engine, quantized_reference(ck, bits), ck.config)
    assert_rows_match_reference(rows, f"{ck.config.name} quantized on load", moe=False)


def test_a_converted_checkpoint_dequantized_into_bf16(bf16_dir, tmp_path):
    convert(bf16_dir, tmp_path / "q4", "q4")
    ck = Checkpoint.open(tmp_path / "q4", include_mtp=False)
    engine = lq_engine(ck, {})  # every packed tensor arrives at a BF16 slot
    assert {f for _n, _s, f in engine.weight_specs()} <= {"BF16", "F32"}
    rows = rows_against_reference(engine, ReferenceModel.from_checkpoint(ck), ck.config)
    assert_rows_match_reference(rows, f"{ck.config.name} q4 dequantized on load", moe=False)


def test_the_graphed_decode_step_equals_the_one_token_prefill(bf16_dir):
    ck = Checkpoint.open(bf16_dir, include_mtp=False)
    engine = lq_engine(ck, recipe_tensor_bits(ck.config, "q4"))
    ids = prompt_ids(70, seed=3, vocab=ck.config.real_vocab_size)
    engine.prefill(ids, True)
    engine.snapshot(0)
    for token in (11, 12, 13):
        engine.decode(token)
    graphed = engine.logits()
    engine.restore(0)
    for token in (11, 12, 13):
        engine.prefill(np.asarray([token], np.int32), True)
    assert rel_l2(engine.logits(), graphed) <= 1e-3


def test_greedy_generation_follows_the_reference(bf16_dir, tmp_path):
    convert(bf16_dir, tmp_path / "q5", "q5")
    ck = Checkpoint.open(tmp_path / "q5", include_mtp=False)
    engine = lq_engine(ck, stored_bits(ck))
    ref = ReferenceModel.from_checkpoint(ck)
    vocab = ck.config.real_vocab_size
    ids = prompt_ids(40, seed=4, vocab=vocab)
    ref.reset()
    token = engine.prefill(ids, True)
    want = ref.prefill(ids, last_only=True, routing=routing(engine, ck.config))[:vocab]
    for step in range(48):
        top = np.sort(want)[-2:]
        near_tie = top[1] - top[0] < 0.1 * want.std()  # bf16 activations may flip those
        assert token == int(np.argmax(want)) or near_tie, f"step {step}"
        token_in = token
        token = engine.prefill(np.asarray([token_in], np.int32), True)
        want = ref.decode(token_in, routing=routing(engine, ck.config))[:vocab]


def test_verify_window_rows_match_the_reference(tmp_path):
    """A verify window with LQ weights (on a dense model the norms between blocks carried in halves,
    as in its decode step: linear.h Prenorm) against the reference on the same tokens, row by row."""
    d = write_checkpoint(tmp_path / "tiny-dense", get_preset("tiny-dense"), seed=1, with_mtp=False)
    ck = Checkpoint.open(d, include_mtp=False)
    bits = recipe_tensor_bits(ck.config, "q5")
    engine = lq_engine(ck, bits, verify_rows=5)
    ref = quantized_reference(ck, bits)
    vocab = ck.config.real_vocab_size
    ids = prompt_ids(60, seed=6, vocab=vocab)
    ref.reset()
    first = engine.prefill(ids, True)
    ref.prefill(ids, last_only=True)
    for seed in (7, 8):  # two windows, the first keeping two rows
        window = [first, *map(int, prompt_ids(4, seed=seed, vocab=vocab))]
        engine.verify(np.asarray(window, np.int32))
        want = ref.prefill(np.asarray(window, np.int32))
        assert_rows_match_reference(list(zip(engine.verify_logits(), want)), f"verify window {seed}", moe=False)
        engine.accept(2)
        ref.reset()
        ids = np.concatenate([ids, window[:2]]).astype(np.int32)
        ref.prefill(ids, last_only=True)
        first = window[2]


@pytest.mark.parametrize("preset", ["qwen3.6-35b-a3b", "qwen3.6-27b"])
def test_full_width_four_layer_packed_checkpoints(preset, tmp_path_factory):
    full_width = _full_width_module()
    root = os.environ.get("LAMPO_FULL_WIDTH_DIR")  # written by tests/gpu/run.sh during the build
    d = Path(root) / f"{preset}-q5" if root else full_width.write(tmp_path_factory.mktemp("fw-q5"), preset, "q5")
    ck = Checkpoint.open(d, include_mtp=False)
    assert ck.lq.recipe == "q5" and ck.config.hidden_size == get_preset(preset).hidden_size
    engine = lq_engine(ck, stored_bits(ck))
    rows = rows_against_reference(engine, ReferenceModel.from_checkpoint(ck), ck.config, n_prompt=100, steps=4)
    assert_rows_match_reference(rows, f"{preset} 4 layers q5", moe=False)


def test_a_nan_scale_is_refused_by_name(tmp_path):
    d = write_checkpoint(tmp_path / "nan", get_preset("tiny-dense"), seed=2, with_mtp=False, recipe="q5")
    ck = Checkpoint.open(d, include_mtp=False)
    name = next(n for n in ck.names() if ck.quantized(n) and "mlp.down_proj" in n)
    stored = ck.stored(name)
    ck.close()
    with open(stored.path, "r+b") as f:  # the second tile's first scale := fp16 NaN
        f.seek(stored.start + 2 * layout.tile_bytes(ck.quantized(name).bits) - 2 * layout.TILE_ROWS)
        f.write(np.array([0x7E00], "<u2").tobytes())
    ck = Checkpoint.open(d, include_mtp=False)
    engine = _native.Engine(ck.config, engine_tensor_names(ck.config), stored_bits(ck), context_max=256,
                            prefill_chunk=64, snapshot_slots=1)
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        load_weights(engine, ck)


def test_nan_scales_in_the_interleaved_gate_up_halves_keep_their_names_and_places(tmp_path):
    """The dense gate|up block is kept with its halves' rows interleaved by 8, each half placed as it
    arrives: the census still names each half and gives the scale's index in the half's own scales
    [N, K/64], as the numpy scan of the file does."""
    d = write_checkpoint(tmp_path / "nan", get_preset("tiny-dense"), seed=2, with_mtp=False, recipe="q5")
    ck = Checkpoint.open(d, include_mtp=False)
    planted = {}  # name: (stored, byte offset in it, (count, first index))
    for part, (tile, row) in (("gate_proj", (1, 3)), ("up_proj", (-1, 12))):
        name = next(n for n in ck.names() if ck.quantized(n) and f"layers.2.mlp.{part}" in n)
        stored, tb = ck.stored(name), layout.tile_bytes(ck.quantized(name).bits)
        tile %= stored.nbytes // tb
        tiles = ck.quantized(name).shape[-1] // layout.TILE_COLS  # a row strip's
        first = (16 * (tile // tiles) + row) * tiles + tile % tiles  # scales [N, K/64], row-major
        planted[name] = (stored, tile * tb + tb - 2 * layout.TILE_ROWS + 2 * row, (1, first))
    ck.close()
    for stored, at, _expected in planted.values():
        with open(stored.path, "r+b") as f:
            f.seek(stored.start + at)
            f.write(np.array([0x7E00], "<u2").tobytes())
    ck = Checkpoint.open(d, include_mtp=False)
    engine = _native.Engine(ck.config, engine_tensor_names(ck.config), stored_bits(ck), context_max=256,
                            prefill_chunk=64, snapshot_slots=1)
    with pytest.raises(CheckpointError, match="so do 1 more tensor"):
        load_weights(engine, ck)
    found = {name: (count, first) for name, count, first in engine.nonfinite_census()}
    assert found == {name: expected for name, (_s, _a, expected) in planted.items()}
    assert found == {f.name: (f.count, f.first) for f in scan_checkpoint(ck)}


def test_the_vram_limit_refuses_an_allocation_past_it(bf16_dir):
    ck = Checkpoint.open(bf16_dir, include_mtp=False)
    with pytest.raises(_native.CudaError, match="VRAM limit of 1.00 MiB would be passed"):
        _native.Engine(ck.config, engine_tensor_names(ck.config), {}, context_max=256, prefill_chunk=64,
                       snapshot_slots=1, vram_limit=1 << 20)
    engine = lq_engine(ck, recipe_tensor_bits(ck.config, "q4"), vram_limit=4 << 30)
    assert 0 < _native.engine_allocated() <= 4 << 30 and engine.position == 0


@pytest.mark.skipif(not os.environ.get("LAMPO_TRAINED_DIR"), reason="no trained measurement model (run.sh trained)")
@pytest.mark.parametrize("weights", ["bf16", "q5"])
def test_the_trained_model_matches_the_reference(weights):
    """The trained measurement model (tests/gpu/train_measure_model.py): its checkpoint loads as
    written, MTP included, and the engine follows the reference on trained weights (bf16; q5 as the
    LQ format's rows of the reference on the same quantized weights, from a q5 conversion)."""
    d = Path(os.environ["LAMPO_TRAINED_DIR"])
    assert Checkpoint.open(d, include_mtp=True).config.mtp_num_hidden_layers == 1
    if weights == "q5":
        d_q5 = d.with_name(d.name + "-q5")
        if not d_q5.exists():
            convert(d, d_q5, "q5")
        d = d_q5
    ck = Checkpoint.open(d, include_mtp=False)
    engine = lq_engine(ck, stored_bits(ck) if ck.lq else {})
    rows = rows_against_reference(engine, ReferenceModel.from_checkpoint(ck), ck.config, n_prompt=120, steps=4)
    assert_rows_match_reference(rows, f"trained model {weights}", moe=False)
