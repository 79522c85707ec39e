"""Lampo's quantizer (models/quant/quantizer.py) against plain round-to-nearest, and its codes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lampo.models.quant import layout, quantizer


def relative_error(w: np.ndarray, codes: np.ndarray, scales: np.ndarray, bits: int) -> float:
    return float(np.linalg.norm(layout.values(codes, scales, bits) - w) / np.linalg.norm(w))


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("distribution", ["normal", "laplace", "outliers"])
def test_the_scale_search_beats_round_to_nearest(bits, distribution):
    rng = np.random.default_rng(bits)
    w = {"normal": rng.standard_normal, "laplace": lambda s: rng.laplace(size=s),
         "outliers": lambda s: rng.standard_normal(s) * np.where(rng.random(s) < 0.01, 10, 1)}[distribution]((256, 512))
    w = (0.02 * w).astype(np.float32)
    ours = relative_error(w, *quantizer.quantize(w, bits), bits)
    baseline = relative_error(w, *quantizer.round_to_nearest(w, bits), bits)
    assert ours < 0.97 * baseline, (ours, baseline)


@pytest.mark.parametrize("bits", layout.WIDTHS)
def test_each_group_is_at_least_as_good_as_round_to_nearest(bits):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    ours = layout.values(*quantizer.quantize(w, bits), bits) - w
    baseline = layout.values(*quantizer.round_to_nearest(w, bits), bits) - w
    per_group = lambda e: (e.reshape(-1, 64) ** 2).sum(axis=1)  # noqa: E731
    assert np.all(per_group(ours) <= per_group(baseline) * (1 + 1e-6))


@given(bits=st.sampled_from(layout.WIDTHS),
       w=hnp.arrays(np.float32, (16, 64), elements=st.floats(-1e4, 1e4, width=32)))
def test_codes_are_in_range_and_scales_finite(bits, w):
    codes, scales = quantizer.quantize(w, bits)
    assert codes.dtype == np.uint8 and int(codes.max()) < 1 << bits
    assert np.isfinite(scales).all()
    if not w.any():
        assert not layout.values(codes, scales, bits).any()


def test_huge_values_clamp_the_scale_to_fp16():
    w = np.full((16, 64), 3e38, dtype=np.float32)
    codes, scales = quantizer.quantize(w, 4)
    assert np.all(np.abs(scales) == 65504) and np.all(layout.values(codes, scales, 4) > 0)


def test_a_matrix_is_quantized_in_row_chunks_with_the_same_result(monkeypatch):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    whole = quantizer.quantize(w, 5)
    monkeypatch.setattr(quantizer, "ROWS_PER_CHUNK", 16)
    chunked = quantizer.quantize(w, 5)
    assert all(np.array_equal(a, b) for a, b in zip(whole, chunked))


def test_shape_errors_are_named():
    with pytest.raises(ValueError, match="multiple of 64"):
        quantizer.quantize(np.zeros((16, 100), np.float32), 4)
    with pytest.raises(ValueError, match="matrix"):
        quantizer.quantize(np.zeros((16,), np.float32), 4)
