"""NaN/Inf weights are refused at load, naming the file and tensor (issue case 6: a NaN in the LM
head loaded fine and the first reply failed with "sample: every logit is -inf")."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import TagTokenizer
from helpers.nonfinite import BF16_INF, BF16_NAN, BF16_NEG_INF, F32_NAN, plant
from lampo.engine.cuda import CudaBackend
from lampo.models import finite_scan
from lampo.models.bf16 import from_bf16
from lampo.models.checkpoint import Checkpoint, CheckpointError
from lampo.models.finite_scan import count_nonfinite, scan_checkpoint
from lampo.models.presets import get_preset
from lampo.models.synthetic import write_checkpoint
from lampo.engine.reference import ReferenceBackend

MICRO = replace(get_preset("tiny-dense"), vocab_size=512, name="micro-dense")
LM_HEAD = "lm_head.weight"
A_LOG = "model.language_model.layers.0.linear_attn.A_log"
K_PROJ = "model.language_model.layers.3.self_attn.k_proj.weight"  # fused with q_proj, v_proj in the engine


@pytest.fixture(scope="module")
def clean_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("clean"), MICRO, seed=3, vector_dtype="F32")


@pytest.fixture
def damaged(clean_dir: Path, tmp_path: Path) -> Path:
    """A copy of the clean checkpoint: NaN at lm_head [1, 5], +Inf in k_proj, NaN in A_log (F32)."""
    d = Path(shutil.copytree(clean_dir, tmp_path / "ck"))
    plant(d, LM_HEAD, [1 * 128 + 5, 300 * 128], BF16_NAN)
    plant(d, LM_HEAD, [7 * 128 + 1], BF16_NEG_INF)
    plant(d, K_PROJ, [0], BF16_INF)
    plant(d, A_LOG, [1], F32_NAN)
    return d


def _expect_named(msg: str) -> None:
    assert "\n" not in msg and msg.startswith("checkpoint: model.safetensors: ")
    assert re.search(r"tensor '\S+A_log' holds 1 NaN/Inf value \(the first at \[1\] of \[2\]\)", msg), msg
    assert f"'{K_PROJ}' (1)" in msg and f"'{LM_HEAD}' (3)" in msg and "so do 2 more tensors" in msg and msg.endswith("; the checkpoint is damaged")


# ---- the numpy census ------------------------------------------------------------------------
@given(hnp.arrays(np.uint16, hnp.array_shapes(max_dims=3, max_side=40), elements=st.integers(0, 0xFFFF)))
def test_bf16_census_matches_isfinite(bits: np.ndarray):
    bad = ~np.isfinite(from_bf16(bits)).reshape(-1)
    count, first = count_nonfinite(bits)
    assert count == int(bad.sum()) and first == (int(np.argmax(bad)) if bad.any() else -1)


@given(hnp.arrays(np.uint32, st.integers(0, 300), elements=st.integers(0, 2**32 - 1)))
def test_f32_census_matches_isfinite(bits: np.ndarray):
    values = bits.view(np.float32)
    bad = ~np.isfinite(values)
    count, first = count_nonfinite(values)
    assert count == int(bad.sum()) and first == (int(np.argmax(bad)) if bad.any() else -1)


def test_census_across_chunk_boundaries(monkeypatch):
    monkeypatch.setattr(finite_scan, "CHUNK_ELEMENTS", 7)
    bits = np.zeros(50, np.uint16)
    bits[[20, 21, 49]] = [BF16_NAN, BF16_INF, BF16_NEG_INF]
    assert count_nonfinite(bits.reshape(5, 10)) == (3, 20)


def test_scan_names_exactly_the_damaged_tensors(damaged: Path, clean_dir: Path):
    assert scan_checkpoint(Checkpoint.open(clean_dir)) == []
    found = {f.name: (f.count, f.first) for f in scan_checkpoint(Checkpoint.open(damaged))}
    assert found == {LM_HEAD: (3, 1 * 128 + 5), K_PROJ: (1, 0), A_LOG: (1, 1)}


# ---- both backends refuse before the chat starts ----------------------------------------------
def test_reference_backend_refuses_nonfinite_weights(damaged: Path):
    with pytest.raises(CheckpointError) as e:
        ReferenceBackend(damaged, tokenizer=TagTokenizer())
    _expect_named(str(e.value))


def test_reference_backend_loads_a_clean_checkpoint(clean_dir: Path):
    backend = ReferenceBackend(clean_dir, tokenizer=TagTokenizer())
    assert backend.info.context_max == MICRO.max_position_embeddings


class CensusNative:
    """A stand-in for `lampo._native` whose engine keeps the arrays it is given and reports, from
    `nonfinite_census`, the numpy census of them as the real engine reports its own."""

    def __init__(self, cfg):
        self.cfg = cfg

    def mem_info(self):
        return 100 << 30, 141 << 30

    def Engine(self, config, tensor_names, tensor_bits, **options):  # noqa: N802 (mirrors the class)
        return CensusEngine(config)


class CensusEngine:
    def __init__(self, cfg):
        from lampo.models.tensor_specs import expected_tensors

        self.specs = expected_tensors(cfg, include_mtp=False)
        self.arrays: dict[str, np.ndarray] = {}
        self.prefill_chunk = 64

    def weight_specs(self):
        return [(n, s.shape, s.dtype) for n, s in self.specs.items()]

    def load_tensor(self, name, array, bits=0):
        self.arrays[name] = array

    def finish_loading(self):
        pass

    def nonfinite_census(self):
        return [(n, c, f) for n, a in self.arrays.items() for c, f in [count_nonfinite(a)] if c]


def test_cuda_backend_refuses_what_the_engine_census_reports(damaged: Path):
    with pytest.raises(CheckpointError) as e:
        CudaBackend(damaged, context_max=256, native=CensusNative(MICRO), tokenizer=TagTokenizer())
    _expect_named(str(e.value))


def test_cuda_backend_loads_a_clean_checkpoint(clean_dir: Path):
    b = CudaBackend(clean_dir, context_max=256, native=CensusNative(MICRO), tokenizer=TagTokenizer())
    assert b.info.context_max == 256
