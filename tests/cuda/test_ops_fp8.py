"""fp8_dequantize (lampo._native_ops: native/src/weights/fp8_dequantize.cu), the GPU side of loading
Qwen's FP8 releases, against numpy's models/fp8.py dequantize_bf16: equal bit for bit for every
e4m3 code (NaN codes included), for scales whose products fall below the normal range (kept as
subnormals), overflow, or are zero, in whole and cut blocks, with the four-code and the one-code
form of the kernel."""

from __future__ import annotations

import numpy as np
import pytest

from lampo.models.fp8 import dequantize_bf16, scale_shape

from .test_ops_core import rng_for


@pytest.mark.parametrize("rows, cols, block", [
    (256, 256, (128, 128)),  # whole blocks, four codes a thread
    (100, 70, (32, 48)),  # blocks cut at both edges, one code a thread (cols % 4 != 0)
    (64, 260, (16, 3)),  # four codes a thread spanning two column blocks
    (1, 4, (128, 128)),
])
def test_fp8_dequantize_matches_numpy(ops, rows, cols, block):
    rng = rng_for("fp8_dequantize", rows, cols, block)
    codes = rng.permutation(np.resize(np.arange(256, dtype=np.uint8), rows * cols)).reshape(rows, cols)
    scales = np.exp(rng.uniform(-12, 2, scale_shape((rows, cols), block))).astype(np.float32)
    special = np.array([2.0**-140, 1e36, 0.0, 1.0], dtype=np.float32)  # subnormal products, inf, +-0, exact
    flat = scales.reshape(-1)
    flat[: min(flat.size, special.size)] = special[: flat.size]
    got = ops.fp8_dequantize(codes, scales, *block)
    want = dequantize_bf16(codes, scales, block)
    np.testing.assert_array_equal(got, want)


def test_fp8_dequantize_refuses_misshapen_scales(ops):
    with pytest.raises(ValueError, match=r"fp8_dequantize: scales must have shape \(2, 1\)"):
        ops.fp8_dequantize(np.zeros((256, 64), np.uint8), np.ones((1, 1), np.float32), 128, 128)
