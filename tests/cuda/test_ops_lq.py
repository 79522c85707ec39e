"""LQ-format kernels (lampo._native_ops, native/src/kernels/matmul/gemv_lq.cu) against numpy on the
dequantized matrix (models/quant/layout.py).

The kernel forms the products code * x exactly (bf16 in, fp32 sums on the tensor cores) and scales
each tile's sums, so fp32 outputs agree with x @ dequantize(W).T to summation order (tol 1e-4 of
|ref| + rms(ref)); bf16 outputs to the bf16 rounding (1e-2). test_zz_lq_timings prints the
bandwidth of the decode shapes of both models beside the bf16 GEMV's (never asserted).
"""

from __future__ import annotations

import numpy as np
import pytest

from lampo.models.bf16 import from_bf16
from lampo.models.quant import layout, quantizer

from .test_ops_core import bf16_randn, check_bf16, check_close, rng_for


def random_lq(rng, out: int, inn: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed bytes, the fp32 matrix they stand for) with random codes and scales."""
    codes = rng.integers(0, 1 << bits, (out, inn)).astype(np.uint8)
    scales = (rng.standard_normal((out, inn // 64)) * 0.01).astype(np.float16)
    return layout.pack(codes, scales, bits), layout.values(codes, scales, bits)


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("out, inn, T", [
    (16, 64, 1),         # one tile
    (48, 192, 3),        # three tiles per strip: uneven K slices
    (2048, 2048, 1),     # 35B-A3B o-projection-like
    (8192, 2048, 1),     # 35B-A3B GDN in-projection
    (512, 2048, 8),      # a verify window
    (2048, 4096, 5),
    (1024, 5120, 2),     # 27B width
    (64, 17_408, 8),     # 27B down-projection width: x staged for groups of tokens
])
def test_gemv_lq_matches_the_dequantized_product(ops, bits, out, inn, T):
    rng = rng_for("gemv_lq", bits, out, inn, T)
    packed, w = random_lq(rng, out, inn, bits)
    x = bf16_randn(rng, (T, inn))
    ref = from_bf16(x).astype(np.float64) @ w.astype(np.float64).T
    check_close(ops.gemv_lq(packed, bits, out, inn, x, True), ref, 1e-4, f"gemv_lq f32 bits={bits}")
    check_bf16(ops.gemv_lq(packed, bits, out, inn, x, False), ref, what=f"gemv_lq bf16 bits={bits}")


def test_gemv_lq_on_quantized_weights(ops):
    rng = rng_for("gemv_lq_quantized")
    w = (rng.standard_normal((256, 1024)) * 0.02).astype(np.float32)
    codes, scales = quantizer.quantize(w, 5)
    x = bf16_randn(rng, (1, 1024))
    ref = from_bf16(x).astype(np.float64) @ layout.values(codes, scales, 5).astype(np.float64).T
    check_close(ops.gemv_lq(layout.pack(codes, scales, 5), 5, 256, 1024, x, True), ref, 1e-4, "gemv_lq")


@pytest.mark.parametrize("bad, message", [
    (dict(bits=7), "bits 4..6"),
    (dict(out=24), "16n, 64k"),
    (dict(packed_bytes=100), "packed: size"),
])
def test_gemv_lq_refuses_bad_arguments(ops, bad, message):
    args = dict(bits=4, out=16, inn=64, packed_bytes=layout.packed_bytes(16, 64, 4)) | bad
    x = np.zeros((1, args["inn"]), dtype=np.uint16)
    with pytest.raises(ValueError, match=message):
        ops.gemv_lq(np.zeros(args["packed_bytes"], np.uint8), args["bits"], args["out"], args["inn"], x)


def test_zz_lq_timings(ops):
    lines = []
    for out, inn in ((8192, 2048), (2048, 4096), (248_320, 2048), (34_816, 5120), (5120, 17_408)):
        bf16 = ops.bench_linear(out, inn, 1, 50, False)
        cells = [f"bf16 {bf16['us']:7.1f} us {bf16['GBps']:5.0f} GB/s"]
        for bits in layout.WIDTHS:
            r = ops.bench_gemv_lq(out, inn, bits, 1, 50)
            cells.append(f"q{bits} {r['us']:7.1f} us {r['GBps']:5.0f} GB/s")
        lines.append(f"GEMV [{out},{inn}] T=1: " + " | ".join(cells))
    r = ops.bench_gemv_lq(8192, 2048, 5, 5, 50)
    lines.append(f"GEMV [8192,2048] q5 T=5: {r['us']:.1f} us {r['GBps']:.0f} GB/s")
    print("\n" + "\n".join(lines))
