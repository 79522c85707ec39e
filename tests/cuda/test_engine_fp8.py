"""The CUDA engine loading a checkpoint in the layout of Qwen's FP8 releases (models/fp8.py,
models/checkpoint_parts.py; the FP8 tensors decoded on the GPU, `load_tensor_fp8`): it must hold
exactly what it holds when it loads the checkpoint's bf16 twin (the same weights as `Checkpoint.raw`
reads them, written in the bf16 release's layout), in bf16 and quantized to LQ on load, so its
logits are equal bit for bit; and the chat backend's greedy replies on both are the same, plain and
with MTP rounds. The tiny models' FP8 matrices each fit one staging piece, so an LM head of 248,320
rows stored as FP8 (two pieces, the second cut short) is loaded beside its decoded bf16 values too,
and broken FP8 parts are refused naming the tensor."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers import TagTokenizer
from helpers.fp8_checkpoints import bf16_twin

from lampo.engine.cuda import CudaBackend
from lampo.engine.protocol import GenerationRequest, TokenEvent
from lampo.engine.speculation import parse_speculation
from lampo.models.checkpoint import Checkpoint
from lampo.models.fp8 import dequantize_bf16, quantize_blocks
from lampo.models.fp8_release import publish_fp8
from lampo.models.presets import get_preset
from lampo.models.quant.engine_formats import recipe_tensor_bits
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.models.synthetic import write_checkpoint
from lampo.models.tensor_specs import LM_HEAD, engine_tensor_names

from .test_engine import fresh, prompt_ids
from .test_engine_lq import lq_engine

_native = pytest.importorskip("lampo._native")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device"),
]


@pytest.fixture(scope="module", params=["tiny-dense", "tiny-moe"])
def pair(request, tmp_path_factory):
    """(FP8 checkpoint, its bf16 twin) of a tiny model with its MTP module."""
    root = tmp_path_factory.mktemp(request.param)
    src = write_checkpoint(root / "bf16", get_preset(request.param), seed=5)
    fp8 = publish_fp8(src, root / "fp8", block=(32, 32))
    return fp8, bf16_twin(fp8, root / "twin")


@pytest.mark.parametrize("recipe", [None, "q5"])
def test_fp8_loads_exactly_as_its_bf16_twin(pair, recipe):
    logits = []
    for model_dir in pair:
        ck = Checkpoint.open(model_dir, include_mtp=False)
        engine = lq_engine(ck, recipe_tensor_bits(ck.config, recipe) if recipe else {})
        engine.prefill(prompt_ids(90, seed=2, vocab=ck.config.real_vocab_size), True)
        logits.append(engine.logits())
    assert np.isfinite(logits[0]).all()
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.mark.parametrize("setting", ["off", "mtp:3"])
def test_the_chat_backend_replies_alike(pair, setting):
    replies = []
    for model_dir in pair:
        backend = CudaBackend(model_dir, context_max=1024, tokenizer=TagTokenizer(), weights="q5",
                              speculation=parse_speculation(setting))
        request = GenerationRequest(tuple(range(100, 150)), SamplingParams(**{**GREEDY.to_dict(), "max_tokens": 32}))
        events = list(backend.generate(request, threading.Event()))
        replies.append([i for e in events if isinstance(e, TokenEvent) for i in e.ids])
        backend.close()
    assert replies[0] and replies[0] == replies[1]


def _engine_with_head(ck: Checkpoint, bits: dict[str, int], load_head):
    """An engine holding every tensor of the bf16 checkpoint `ck` but the LM head, which
    `load_head(engine)` loads."""
    engine = _native.Engine(ck.config, engine_tensor_names(ck.config), bits, context_max=1024, prefill_chunk=256,
                            snapshot_slots=2)
    wanted = {name for name, _shape, _format in engine.weight_specs()}
    for _path, names in ck.shards():
        for name in filter(wanted.__contains__, names):
            if name == LM_HEAD:
                load_head(engine)
            else:
                engine.load_tensor(name, ck.raw(name))
    engine.finish_loading()
    return fresh(engine)


@pytest.mark.parametrize("recipe", [None, "q5"])
def test_an_fp8_tensor_of_several_staging_pieces(pair, recipe):
    """The LM head [248,320, 128] as FP8 in blocks of 32 (31.8 MB of codes: two staging pieces)
    against its decoded bf16 values loaded as a bf16 tensor: equal logits."""
    ck = Checkpoint.open(pair[1], include_mtp=False)
    codes, scales = quantize_blocks(ck.tensor_f32(LM_HEAD), (32, 32))
    bits = recipe_tensor_bits(ck.config, recipe) if recipe else {}
    logits = []
    for load_head in (lambda e: e.load_tensor_fp8(LM_HEAD, [(codes, scales)], 32, 32),
                      lambda e: e.load_tensor(LM_HEAD, dequantize_bf16(codes, scales, (32, 32)))):
        engine = _engine_with_head(ck, bits, load_head)
        engine.prefill(prompt_ids(40, seed=3, vocab=ck.config.real_vocab_size), True)
        logits.append(engine.logits())
    assert np.isfinite(logits[0]).all()
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.mark.parametrize("parts, message", [
    (lambda c, s: [(c[:1000], s[:32])], "parts hold 1000 rows, expected 248320"),
    (lambda c, s: [(c, s[:10])], "scales of shape"),
    (lambda c, s: [(np.ascontiguousarray(c[:, :64]), np.ascontiguousarray(s[:, :2]))], "has 64 columns, expected 128"),
    (lambda c, s: [(c.astype(np.int16), s)], "C-contiguous uint8 codes"),
    (lambda c, s: [], "no parts"),
])
def test_broken_fp8_parts_are_refused_naming_the_tensor(pair, parts, message):
    ck = Checkpoint.open(pair[1], include_mtp=False)
    engine = _native.Engine(ck.config, engine_tensor_names(ck.config), {}, context_max=256, prefill_chunk=64,
                            snapshot_slots=1)
    codes = np.zeros((248_320, 128), np.uint8)
    scales = np.ones((248_320 // 32, 4), np.float32)
    with pytest.raises(ValueError, match=f"load_(tensor_)?fp8: 'lm_head.weight'.*{message}"):
        engine.load_tensor_fp8(LM_HEAD, parts(codes, scales), 32, 32)
