"""A converted (LQ) directory loads directly: Checkpoint.open validates its format file and every
tensor's stored dtype and size before any data is read (one line per problem), the NaN/Inf scan
reads the scales, and the reference model and backend run on the dequantized weights - exactly
the logits of the reference fed those weights."""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import real_tokenizer

from lampo.engine.protocol import Done, GenerationRequest, TokenEvent
from lampo.engine.reference import ReferenceBackend
from lampo.models.checkpoint import Checkpoint, CheckpointError
from lampo.models.finite_scan import check_finite
from lampo.models.presets import get_preset
from lampo.models.quant.checkpoint_format import FORMAT_FILE
from lampo.models.quant.convert import convert
from lampo.models.quant.layout import packed_bytes, tile_bytes, values
from lampo.models.quant.quantizer import quantize
from lampo.models.reference.model import ReferenceModel
from lampo.models.safetensors_io import build_header, read_header
from lampo.models.sampling_params import GREEDY
from lampo.models.synthetic import write_checkpoint

MICRO_MOE = replace(get_preset("tiny-moe"), vocab_size=512, name="micro-moe")
GATE_UP = "model.language_model.layers.1.mlp.experts.gate_up_proj"  # 4 bits at q5: [8, 128, 128]
Q_PROJ = "model.language_model.layers.3.self_attn.q_proj.weight"  # 6 bits at q5: [1024, 128]
SHARD = "model-00001-of-00001.safetensors"
FP16_NAN, FP16_INF, FP16_ZERO = 0x7E00, 0x7C00, 0x0000
CORRELATION = 0.9  # of the q5 model's logits with the bf16 model's (0.96 here: random weights at 4-6 bits)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(the bf16 micro-moe checkpoint, its q5 conversion); read-only, copy to change."""
    root = tmp_path_factory.mktemp("lq")
    src = write_checkpoint(root / "src", MICRO_MOE, seed=2)
    convert(src, root / "q5", "q5")
    return src, root / "q5"


@pytest.fixture
def copy(dirs, tmp_path) -> Path:
    return Path(shutil.copytree(dirs[1], tmp_path / "q5"))


def _error(model_dir: Path) -> str:
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(model_dir)
    msg = str(e.value)
    assert msg.startswith("checkpoint: ") and "\n" not in msg
    return msg


def _edit_format(model_dir: Path, edit) -> None:
    doc = json.loads((model_dir / FORMAT_FILE).read_text())
    edit(doc)
    (model_dir / FORMAT_FILE).write_text(json.dumps(doc))


def _replace_tensor(path: Path, name: str, dtype: str, data: bytes) -> None:
    """Rewrite a safetensors file with tensor `name` replaced by `data` (1-D of `dtype`)."""
    with open(path, "rb") as f:
        tensors = []
        for t in read_header(path):
            f.seek(t.start)
            tensors.append((t.name, t.dtype, t.shape, f.read(t.nbytes)))
    tensors = [(n, dtype, (len(data) // (2 if dtype == "BF16" else 1),), data) if n == name else (n, d, s, b)
               for n, d, s, b in tensors]
    header, _ = build_header((n, d, s) for n, d, s, _ in tensors)
    path.write_bytes(header + b"".join(b for *_, b in tensors))


def _set_scale(model_dir: Path, name: str, bits: int, tile: int, row: int, pattern: int) -> None:
    """Overwrite the fp16 scale of row `row` of packed tile `tile` of tensor `name`."""
    t = Checkpoint.open(model_dir).stored(name)
    with open(t.path, "r+b") as f:
        f.seek(t.start + (tile + 1) * tile_bytes(bits) - 32 + 2 * row)
        f.write(np.array([pattern], "<u2").tobytes())


def _dequantized_source(src: Path) -> tuple[Checkpoint, dict[str, np.ndarray]]:
    """The converted checkpoint's logical weights computed from the source: values(quantize(w))."""
    ck = Checkpoint.open(src)
    out = Checkpoint.open(src.parent / "q5")
    weights = {}
    for name in ck.names():
        w, lq = ck.tensor_f32(name), out.quantized(name)
        if lq is not None:
            n, k = lq.shape[-2:]
            w = np.stack([values(*quantize(m, lq.bits), lq.bits) for m in w.reshape(-1, n, k)]).reshape(w.shape)
        weights[name] = w
    return out, weights


# ---- it opens -----------------------------------------------------------------------------------
def test_opens_with_its_format(dirs):
    ck = Checkpoint.open(dirs[1])
    assert ck.lq.recipe == "q5" and ck.has_mtp and ck.ignored == ()
    assert (ck.quantized(GATE_UP).bits, ck.quantized(GATE_UP).shape) == (4, (8, 128, 128))
    assert ck.raw(GATE_UP).dtype == np.uint8 and ck.raw(GATE_UP).shape == (8, packed_bytes(128, 128, 4))
    assert ck.tensor_f32(GATE_UP).shape == (8, 128, 128) and ck.quantized("model.language_model.norm.weight") is None
    assert ck.total_bytes < Checkpoint.open(dirs[0]).total_bytes / 2
    no_mtp = Checkpoint.open(dirs[1], include_mtp=False)
    assert not no_mtp.has_mtp and len(no_mtp.names()) < len(ck.names())
    check_finite(ck)


# ---- one line per problem -----------------------------------------------------------------------
@pytest.mark.parametrize("edit,expected", [
    (lambda d: d.update(version=2), f"{FORMAT_FILE} has format version 2; this Lampo reads version 1"),
    (lambda d: d.update(format="gguf"), f"{FORMAT_FILE} is not a lampo-lq format file (format 'gguf')"),
    (lambda d: d.update(recipe="q3"), f"{FORMAT_FILE} names unknown recipe 'q3': the recipes are q5, q4"),
    (lambda d: d["tensors"].pop(Q_PROJ), f"{FORMAT_FILE} does not list tensor '{Q_PROJ}'"),
    (lambda d: d["tensors"][Q_PROJ].update(bits=3), f"tensor '{Q_PROJ}' has bits 3, not one of 4, 5, 6 or 'bf16'"),
    (lambda d: d["tensors"][Q_PROJ].update(shape=[512, 128]), f"tensor '{Q_PROJ}' has shape [512, 128], but config"),
    (lambda d: d["tensors"][Q_PROJ].update(bits=5), f"tensor '{Q_PROJ}' holds 102,400 bytes of packed weights, "
                                                    "expected 86,016"),
])
def test_format_file_problems(copy, edit, expected):
    _edit_format(copy, edit)
    assert expected in _error(copy)


def test_format_file_that_is_not_json(copy):
    (copy / FORMAT_FILE).write_text("{")
    assert f"{FORMAT_FILE} cannot be read" in _error(copy)


def test_short_packed_tensor_names_both_sizes(copy):
    data = Checkpoint.open(copy).raw(Q_PROJ).tobytes()
    _replace_tensor(copy / SHARD, Q_PROJ, "U8", data[:-800])
    assert f"{SHARD}: tensor '{Q_PROJ}' holds 101,600 bytes of packed weights, expected 102,400" in _error(copy)


def test_truncated_file_names_the_tensor(copy):
    last = read_header(copy / SHARD)[-1]
    with open(copy / SHARD, "r+b") as f:
        f.truncate(last.end - 100)
    msg = _error(copy)
    assert f"tensor '{last.name}' is truncated" in msg and f"{last.end - 100} bytes" in msg


def test_bf16_where_packed_bytes_are_expected(copy):
    _replace_tensor(copy / SHARD, Q_PROJ, "BF16", bytes(1024 * 128 * 2))
    assert f"tensor '{Q_PROJ}' has dtype BF16, expected U8" in _error(copy)


def test_unfinished_conversion_is_never_a_model(copy):
    partial = copy.rename(copy.with_name("q5.partial-4242"))
    assert "unfinished `lampo convert` output" in _error(partial)


@pytest.mark.parametrize("pattern", [FP16_NAN, FP16_INF])
def test_nonfinite_scale_is_refused_at_load(copy, pattern):
    _set_scale(copy, GATE_UP, 4, tile=5, row=3, pattern=pattern)
    with pytest.raises(CheckpointError) as e:
        check_finite(Checkpoint.open(copy))
    msg = str(e.value)
    # tile 5 of an expert [128, 128] (2 tiles per row strip) is rows 32..47, group 1 of expert 0
    assert f"tensor '{GATE_UP}' holds 1 NaN/Inf scale (the first at [0, 35, 1] of [8, 128, 2])" in msg
    assert "\n" not in msg
    with pytest.raises(CheckpointError, match="NaN/Inf scale"):
        ReferenceBackend(copy, tokenizer=real_tokenizer())


def test_zero_scale_is_a_group_of_zeros(copy):
    _set_scale(copy, Q_PROJ, 6, tile=0, row=0, pattern=FP16_ZERO)
    ck = Checkpoint.open(copy)
    check_finite(ck)
    w = ck.tensor_f32(Q_PROJ)
    assert not w[0, :64].any() and w[0, 64:].any() and w[1, :64].any()


def test_a_tensor_whose_every_scale_is_zero_is_refused(copy):
    t = Checkpoint.open(copy).stored(Q_PROJ)
    tiles = (1024 // 16) * (128 // 64)
    for tile in range(tiles):  # zero the scales of every tile, keep the codes
        with open(t.path, "r+b") as f:
            f.seek(t.start + (tile + 1) * tile_bytes(6) - 32)
            f.write(bytes(32))
    with pytest.raises(CheckpointError) as e:
        check_finite(Checkpoint.open(copy))
    assert f"tensor '{Q_PROJ}': every one of its 2,048 scales is zero, so it holds no weights" in str(e.value)


# ---- the reference engine on the dequantized weights -------------------------------------------
def test_reference_logits_equal_those_of_the_dequantized_weights(dirs):
    ck, weights = _dequantized_source(dirs[0])
    ids = list(range(3, 40))
    on_disk, in_memory = ReferenceModel.from_checkpoint(ck), ReferenceModel(MICRO_MOE, weights)
    np.testing.assert_array_equal(on_disk.prefill(ids, chunk_size=16), in_memory.prefill(ids, chunk_size=16))
    np.testing.assert_array_equal(on_disk.decode(7), in_memory.decode(7))
    on_disk.reset()
    bf16 = ReferenceModel.from_checkpoint(Checkpoint.open(dirs[0])).prefill(ids)
    assert np.corrcoef(on_disk.prefill(ids).ravel(), bf16.ravel())[0, 1] > CORRELATION


def test_reference_backend_generates_greedily_on_the_converted_directory(dirs):
    _, weights = _dequantized_source(dirs[0])
    model, ids = ReferenceModel(MICRO_MOE, weights), list(range(100, 130))
    logits, expected = model.prefill(ids, last_only=True), []
    for _ in range(5):
        expected.append(int(np.argmax(logits)))
        logits = model.decode(expected[-1])
    backend = ReferenceBackend(dirs[1], context_max=256, tokenizer=real_tokenizer())
    request = GenerationRequest(tuple(ids), replace(GREEDY, max_tokens=5), stop_ids=())
    events = list(backend.generate(request, threading.Event()))
    backend.close()
    assert isinstance(events[-1], Done)
    assert [i for e in events if isinstance(e, TokenEvent) for i in e.ids] == expected
