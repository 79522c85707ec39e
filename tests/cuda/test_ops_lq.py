"""LQ-format kernels (lampo._native_ops: native/src/kernels/matmul/gemv_lq.cu,
native/src/kernels/moe/moe_experts_lq.cu) against numpy on the dequantized matrices
(models/quant/layout.py).

The kernel forms the products code * x exactly (bf16 in, fp32 sums on the tensor cores) and scales
each tile's sums, so fp32 outputs agree with x @ dequantize(W).T to summation order (tol 1e-4 of
|ref| + rms(ref)); bf16 outputs to the bf16 rounding (1e-2). test_zz_lq_timings prints the
bandwidth of the decode shapes of both models beside the bf16 kernels' (never asserted).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from lampo.models.bf16 import from_bf16
from lampo.models.quant import layout, quantizer
from lampo.models.reference.activations import silu

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
    (2048, 17_408, 1),   # enough groups for one 16-warp block per SM (LQ_WIDE_WARPS)
    (2048, 17_408, 5),   # the same for a verify window
])
def test_gemv_lq_matches_the_dequantized_product(ops, bits, out, inn, T):
    rng = rng_for("gemv_lq", bits, out, inn, T)
    packed, w = random_lq(rng, out, inn, bits)
    x = bf16_randn(rng, (T, inn))
    ref = from_bf16(x).astype(np.float64) @ w.astype(np.float64).T
    check_close(ops.gemv_lq(packed, bits, out, inn, x, True), ref, 1e-4, f"gemv_lq f32 bits={bits}")
    check_bf16(ops.gemv_lq(packed, bits, out, inn, x, False), ref, what=f"gemv_lq bf16 bits={bits}")


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("out, inn, T", [
    (16, 17_408, 2),     # five blocks: the pairs' sixth stages its half of x and has no groups
    (5120, 17_408, 4),   # the 27B down projection of a 4-token verify window
    (1024, 8192, 6),
])
def test_gemv_lq_pairs_keep_each_tokens_one_token_bits(ops, bits, out, inn, T):
    """A launch that stages at least 64 KiB of x goes in pairs of blocks (clusters of two) that
    stage it once between them: the product as the reference, and each token's row the bits of
    its one-token launch (single blocks, the same split)."""
    rng = rng_for("gemv_lq_pairs", bits, out, inn, T)
    packed, w = random_lq(rng, out, inn, bits)
    x = bf16_randn(rng, (T, inn))
    ref = from_bf16(x).astype(np.float64) @ w.astype(np.float64).T
    native = pytest.importorskip("lampo._native")
    sm90 = float(native.device_info()["compute_capability"]) >= 9.0 and os.environ.get("LAMPO_SM90") != "0"
    for f32 in (True, False):
        before = ops.gemv_lq_pair_launches()
        y = ops.gemv_lq(packed, bits, out, inn, x, f32)
        assert (ops.gemv_lq_pair_launches() > before) == sm90, "pairs run on sm_90+ only, and there always"
        if f32:
            check_close(y, ref, 1e-4, f"gemv_lq pairs f32 bits={bits}")
        else:
            check_bf16(y, ref, what=f"gemv_lq pairs bf16 bits={bits}")
        for t in range(T):
            np.testing.assert_array_equal(ops.gemv_lq(packed, bits, out, inn, x[t:t + 1], f32)[0], y[t])


@pytest.mark.parametrize("bits", [0, 4, 5, 6])  # 0: bf16 weights (gemv.cu)
@pytest.mark.parametrize("T, widths, out, inn", [
    (2, (64, 32, 16, 16), 160, 128),             # GDN qkv|z|b|a-like, one strip of padding
    (5, (256, 64, 64), 384, 256),                # attention q|k|v-like
    (8, (96, 48), 144, 17_408),                  # x staged for groups of tokens
])
def test_row_parts_are_the_product_split_by_rows(ops, bits, T, widths, out, inn):
    """linear_forward_parts stores each part of the rows as its own [T, width] matrix, one after
    another, and nothing of the padding rows past the parts."""
    rng = rng_for("linear_parts", bits, T, out, inn)
    if bits:
        w_arg, w = random_lq(rng, out, inn, bits)
    else:
        w_arg = bf16_randn(rng, (out, inn))
        w = from_bf16(w_arg)
    x = bf16_randn(rng, (T, inn))
    ref = from_bf16(x).astype(np.float64) @ w.astype(np.float64).T
    edges = np.cumsum((0, *widths))
    want = np.concatenate([ref[:, a:b].ravel() for a, b in zip(edges[:-1], edges[1:])])
    got = ops.linear_parts(w_arg, bits, out, inn, x, list(widths))
    assert got.shape == (T * edges[-1],)
    check_bf16(got, want, what=f"linear_parts bits={bits}")


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


def random_bank(rng, experts: int, rows: int, cols: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """An LQ expert bank [E, bytes] and the fp32 matrices [E, rows, cols] it stands for."""
    banks = [random_lq(rng, rows, cols, bits) for _ in range(experts)]
    return np.stack([b for b, _ in banks]), np.stack([w for _, w in banks])


@pytest.mark.parametrize("bits_gu, bits_dn", [(4, 6), (5, 5), (6, 4)])
@pytest.mark.parametrize("T, H, I, E, k", [(1, 128, 64, 8, 2), (3, 256, 128, 8, 2), (8, 2048, 512, 16, 8)])
def test_moe_lq_experts_match_the_dequantized_experts(ops, bits_gu, bits_dn, T, H, I, E, k):
    rng = rng_for("moe_lq", bits_gu, bits_dn, T, H, I, E, k)
    gate_up, wgu = random_bank(rng, E, 2 * I, H, bits_gu)
    down, wdn = random_bank(rng, E, H, I, bits_dn)
    h = bf16_randn(rng, (T, H))
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    weights = rng.random((T, k)).astype(np.float32)
    act = ops.moe_lq_gate_up(h, gate_up, bits_gu, ids, I)
    hf = from_bf16(h).astype(np.float64)
    want_act = np.stack([np.stack([silu(wgu[ids[t, s], :I] @ hf[t]) * (wgu[ids[t, s], I:] @ hf[t])
                                   for s in range(k)]) for t in range(T)])
    check_bf16(act, want_act, what=f"moe_lq_gate_up bits={bits_gu}")
    out = ops.moe_lq_down(act, down, bits_dn, ids, weights, H)
    actf = from_bf16(act).astype(np.float64)
    want_out = np.stack([sum(weights[t, s] * (wdn[ids[t, s]] @ actf[t, s]) for s in range(k)) for t in range(T)])
    check_bf16(out, want_out, what=f"moe_lq_down bits={bits_dn}")


def test_moe_lq_refuses_bad_arguments(ops):
    bank = np.zeros((2, layout.packed_bytes(128, 64, 4)), np.uint8)
    h = np.zeros((1, 64), np.uint16)
    with pytest.raises(ValueError, match="expert id 2 out of range"):
        ops.moe_lq_gate_up(h, bank, 4, np.array([[2]], np.int32), 64)
    with pytest.raises(ValueError, match="bytes per expert"):
        ops.moe_lq_gate_up(h, bank, 5, np.array([[1]], np.int32), 64)


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
    lines += moe_timings(ops)
    print("\n" + "\n".join(lines))


def moe_timings(ops) -> list[str]:
    """The 35B-A3B routed experts of one decode token (E = 256, k = 8, H = 2048, I = 512): bf16 and
    LQ gate_up / down, mean of 20 cold-L2 launches (random bytes: the values do not matter here)."""
    rng = np.random.default_rng(0)
    T, k, H, I, E = 1, 8, 2048, 512, 256
    ids = rng.choice(E, (T, k), replace=False).astype(np.int32)
    weights = np.full((T, k), 0.125, np.float32)
    h = bf16_randn(rng, (T, H))
    act = bf16_randn(rng, (T, k, I))
    gu16 = rng.integers(0x3c00, 0x3c80, (E, 2 * I, H), dtype=np.uint16)
    dn16 = rng.integers(0x3c00, 0x3c80, (E, H, I), dtype=np.uint16)
    _, ms_gu = ops.moe_experts_gate_up(h, gu16, ids, 20)
    _, ms_dn = ops.moe_experts_down(act, dn16, ids, weights, 20)
    lines = [f"MoE 35B-A3B token: bf16 gate_up {ms_gu * 1e3:.1f} us, down {ms_dn * 1e3:.1f} us "
             f"({k * 3 * I * H * 2 / (ms_gu + ms_dn) / 1e6:.0f} GB/s)"]
    for bits_gu, bits_dn in ((4, 6), (4, 4)):
        gu = rng.integers(0, 256, (E, layout.packed_bytes(2 * I, H, bits_gu)), dtype=np.uint8)
        dn = rng.integers(0, 256, (E, layout.packed_bytes(H, I, bits_dn)), dtype=np.uint8)
        _, ms_gu = ops.moe_lq_gate_up(h, gu, bits_gu, ids, I, 20)
        _, ms_dn = ops.moe_lq_down(act, dn, bits_dn, ids, weights, H, 20)
        read = k * (gu.shape[1] + dn.shape[1])
        lines.append(f"MoE 35B-A3B token: LQ gate_up q{bits_gu} {ms_gu * 1e3:.1f} us, down q{bits_dn} "
                     f"{ms_dn * 1e3:.1f} us ({read / (ms_gu + ms_dn) / 1e6:.0f} GB/s)")
    return lines
