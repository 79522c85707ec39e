"""The CUDA engine loading a checkpoint in the layout of Qwen's FP8 releases (models/fp8.py,
models/checkpoint_parts.py): it must hold exactly what it holds when it loads the checkpoint's bf16
twin (the same weights as `Checkpoint.raw` reads them, written in the bf16 release's layout), in
bf16 and quantized to LQ on load, so its logits are equal bit for bit; and the chat backend's greedy
replies on both are the same, plain and with MTP rounds."""

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
from lampo.models.fp8_release import publish_fp8
from lampo.models.presets import get_preset
from lampo.models.quant.engine_formats import recipe_tensor_bits
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.models.synthetic import write_checkpoint

from .test_engine import prompt_ids
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
