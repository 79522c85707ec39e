"""The CUDA backend in a process of its own (engine/process_backend.py, as `lampo chat` runs it
under the terminal interface): the child builds the engine on the GPU and streams the same greedy
replies, plain and with speculative rounds, as the backend does in this process."""

from __future__ import annotations

import threading
from functools import partial

import pytest
from helpers import TagTokenizer

from lampo.engine.cuda import CudaBackend
from lampo.engine.process_backend import ProcessBackend
from lampo.engine.protocol import Done, GenerationRequest, TokenEvent
from lampo.engine.speculation import parse_speculation
from lampo.models.presets import get_preset
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.models.synthetic import write_checkpoint

_native = pytest.importorskip("lampo._native")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device"),
]


def cuda_backend(model_dir, setting, say=None):
    return CudaBackend(model_dir, context_max=1024, tokenizer=TagTokenizer(), speculation=parse_speculation(setting),
                       say=say)


def reply(backend, prompt):
    request = GenerationRequest(tuple(prompt), SamplingParams(**{**GREEDY.to_dict(), "max_tokens": 24}))
    events = list(backend.generate(request, threading.Event()))
    assert isinstance(events[-1], Done) and events[-1].reason in ("length", "stop")
    return [i for e in events if isinstance(e, TokenEvent) for i in e.ids]


@pytest.mark.parametrize("setting", ["off", "mtp:3"])
def test_the_backend_in_its_own_process_gives_the_same_replies(tmp_path, setting):
    d = write_checkpoint(tmp_path / "tiny-moe", get_preset("tiny-moe"), seed=3, with_mtp=True)
    prompts = [list(range(100, 140)), list(range(100, 140)) + [7, 8, 9]]  # the second resumes the first
    here = cuda_backend(d, setting)
    want = [reply(here, p) for p in prompts]
    here.close()
    there = ProcessBackend(partial(cuda_backend, d, setting))
    try:
        assert there.info.backend == "cuda" and there.info.speculative == (setting != "off")
        assert [reply(there, p) for p in prompts] == want
    finally:
        there.close()
