"""LQ-format prefill kernels (lampo._native_ops: native/src/kernels/matmul/gemm_lq.cu,
native/src/kernels/moe/moe_prefill_lq.cu) against numpy on the dequantized matrices
(models/quant/layout.py).

gemm_lq's mma.sync kernel forms the products code * x exactly on the tensor cores (fp32 sums, one
scale per 64-column tile), so fp32 outputs agree with x @ dequantize(W).T to summation order (tol
1e-4 of |ref| + rms(ref), as the GEMV's); bf16 outputs to the bf16 rounding (1e-2). On an H100 /
H200 with the sm_90a code built in, T >= 128 tokens run on the wgmma kernel (gemm_lq_sm90.cu),
whose contract is y = x @ bf16(W).T: each weight rounded once (relative 2^-8) to bf16, fp32
sums. Those cases are checked against that product (the weights rounded in numpy) at 5e-4 for fp32
outputs (wgmma's fp32 accumulation over up to 17,408 columns; any index error is O(1)) and at 1e-2
for bf16 (a bf16-level 3e-3 against x @ dequantize(W).T would fail: the rounding alone reaches
~2e-2 of |ref| + rms(ref) on short rows); test_gemm_lq_sm90_agrees_with_mma_sync forces both
kernels (LAMPO_GEMM_LQ_SM90=1 / 0) on the same inputs, including small and ragged shapes. The MoE
prefill rounds act and each expert's down output to bf16 before the weighted sum (as
moe_experts_prefill); the reference does the same. test_zz_lq_gemm_timings prints the TFLOP/s of
the prefill shapes of both models beside the bf16 GEMM's (never asserted; gemm_lq's default path,
at T = 2048 the wgmma kernel on an H100 / H200).
"""

from __future__ import annotations

import numpy as np
import pytest

from lampo.models.bf16 import from_bf16, round_bf16
from lampo.models.quant import layout
from lampo.models.reference.activations import silu

from .test_ops_core import bf16_randn, check_bf16, check_close, rng_for
from .test_ops_gdn_moe import random_routes
from .test_ops_lq import random_bank, random_lq


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("out, inn, T", [
    (16, 64, 9),             # one tile, one ragged row tile
    (48, 192, 100),          # a partial block of rows, ragged tokens
    (272, 64, 64),           # 17 strips: a second block of rows with one strip
    (2048, 2048, 128),       # 35B-A3B o-projection-like, whole row tiles
    (8192, 2048, 300),       # 35B-A3B GDN in-projection-like
    (4096, 2048, 2048),
    (2048, 5120, 130),       # 27B width
    (512, 17_408, 300),      # 27B down-projection width
    (248_320, 64, 9),        # LM-head rows: 970 blocks of rows
])
def test_gemm_lq_matches_the_dequantized_product(ops, bits, out, inn, T):
    rng = rng_for("gemm_lq", bits, out, inn, T)
    packed, w = random_lq(rng, out, inn, bits)
    x = bf16_randn(rng, (T, inn))
    # The sm_90a kernel (T >= 128 on an H100 / H200) multiplies by bf16(W): its contract, so its
    # reference rounds the weights the same way, at a tolerance for wgmma's long fp32 sums.
    sm90 = ops.gemm_lq_takes_sm90(T)
    ref = from_bf16(x).astype(np.float64) @ (round_bf16(w) if sm90 else w).astype(np.float64).T
    check_close(ops.gemm_lq(packed, bits, out, inn, x, True), ref, 5e-4 if sm90 else 1e-4,
                f"gemm_lq f32 bits={bits} sm90={sm90}")
    check_bf16(ops.gemm_lq(packed, bits, out, inn, x, False), ref, what=f"gemm_lq bf16 bits={bits} sm90={sm90}")


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("out, inn, T", [
    (16, 64, 9),             # one strip of a 128-row block, one K slice (odd: a padded empty slice)
    (48, 192, 100),          # 3 K slices, ragged tokens
    (272, 64, 300),          # 17 strips: a block with one live strip; 128-token tiles, ragged
    (1024, 128, 2300),       # 18 token tiles of 128: raster groups of 8 and a partial one
    (4096, 128, 2300),       # 256-token tiles (>= one wave): groups of 8 and 1, ragged
    (8192, 2048, 600),       # 35B-A3B GDN in-like, 256-token tiles, ragged
    (512, 17_408, 300),      # 27B down-projection width
])
def test_gemm_lq_sm90_agrees_with_mma_sync(ops, monkeypatch, bits, out, inn, T):
    """Both kernels of gemm_lq on the same input: LAMPO_GEMM_LQ_SM90=1 forces the wgmma kernel for
    any T (x @ bf16(W).T), =0 the mma.sync one (x @ W.T, exact products); each against its own
    contract, and the two against each other at the level of the weights' bf16 rounding."""
    monkeypatch.setenv("LAMPO_GEMM_LQ_SM90", "1")
    if not ops.gemm_lq_takes_sm90(T):
        pytest.skip("the sm_90a LQ GEMM is not built in or the GPU is not compute capability 9.0")
    rng = rng_for("gemm_lq_sm90", bits, out, inn, T)
    packed, w = random_lq(rng, out, inn, bits)
    x = bf16_randn(rng, (T, inn))
    xf = from_bf16(x).astype(np.float64)
    sm90 = ops.gemm_lq(packed, bits, out, inn, x, True)
    check_close(sm90, xf @ round_bf16(w).astype(np.float64).T, 5e-4, f"sm90 f32 bits={bits}")
    check_bf16(ops.gemm_lq(packed, bits, out, inn, x, False), xf @ round_bf16(w).astype(np.float64).T,
               what=f"sm90 bf16 bits={bits}")
    monkeypatch.setenv("LAMPO_GEMM_LQ_SM90", "0")
    assert not ops.gemm_lq_takes_sm90(T)
    mma = ops.gemm_lq(packed, bits, out, inn, x, True)
    check_close(mma, xf @ w.astype(np.float64).T, 1e-4, f"mma.sync f32 bits={bits}")
    # x @ (bf16(W) - W).T: relative 2^-8 per weight, up to ~2e-2 of |y| + rms(y) on these shapes
    # (numpy, short K the worst)
    check_close(sm90, mma, 3e-2, f"sm90 vs mma.sync bits={bits}")


def test_gemm_lq_agrees_with_the_gemv(ops):
    """The same tiles through the prefill GEMM and the decode GEMV: the same sums up to order."""
    rng = rng_for("gemm_lq_vs_gemv")
    packed, _ = random_lq(rng, 1024, 2048, 5)
    x = bf16_randn(rng, (8, 2048))
    gemv = ops.gemv_lq(packed, 5, 1024, 2048, x, True)
    check_close(ops.gemm_lq(packed, 5, 1024, 2048, x, True), gemv, 2e-5, "gemm_lq vs gemv_lq")


@pytest.mark.parametrize("bad, message", [
    (dict(bits=7), "bits 4..6"),
    (dict(out=24), "16n, 64k"),
    (dict(packed_bytes=100), "packed: size"),
    (dict(T=0), "at least one row"),
    (dict(width=128), "x: width must be 64"),
])
def test_gemm_lq_refuses_bad_arguments(ops, bad, message):
    args = dict(bits=4, out=16, inn=64, packed_bytes=layout.packed_bytes(16, 64, 4), T=9, width=64) | bad
    x = np.zeros((args["T"], args["width"]), dtype=np.uint16)
    with pytest.raises(ValueError, match=message):
        ops.gemm_lq(np.zeros(args["packed_bytes"], np.uint8), args["bits"], args["out"], args["inn"], x)


def moe_prefill_reference(h, wgu, wdn, ids, weights, I):
    """out[t] = sum_s w[t, s] * bf16(bf16(silu(g) * u) @ Wd[e].T), e = ids[t, s], in float64."""
    hf = from_bf16(h).astype(np.float64)
    T, k = ids.shape
    y = np.zeros((T, k, wdn.shape[1]))
    for e in np.unique(ids):
        t, s = np.nonzero(ids == e)
        gate, up = hf[t] @ wgu[e, :I].T.astype(np.float64), hf[t] @ wgu[e, I:].T.astype(np.float64)
        act = round_bf16((silu(gate) * up).astype(np.float32)).astype(np.float64)
        y[t, s] = round_bf16((act @ wdn[e].T.astype(np.float64)).astype(np.float32))
    return np.einsum("tk,tkh->th", weights.astype(np.float64), y)


@pytest.mark.parametrize("bits_gu, bits_dn", [(4, 6), (5, 5), (6, 4)])
@pytest.mark.parametrize("T, H, I, E, k, skew", [
    (9, 128, 64, 32, 2, False),       # most experts empty; I = 64: a half-empty block of gate rows
    (300, 128, 64, 8, 2, False),
    (333, 256, 192, 32, 4, True),     # a few experts with several row tiles
    (300, 2048, 512, 16, 8, False),   # 35B-A3B widths
])
def test_moe_lq_prefill_matches_the_dequantized_experts(ops, bits_gu, bits_dn, T, H, I, E, k, skew):
    rng = rng_for("moe_lq_prefill", bits_gu, bits_dn, T, H, I, E, k, skew)
    gate_up, wgu = random_bank(rng, E, 2 * I, H, bits_gu)
    down, wdn = random_bank(rng, E, H, I, bits_dn)
    h = bf16_randn(rng, (T, H))
    ids, weights = random_routes(rng, T, E, k, skew)
    out = ops.moe_lq_prefill(h, gate_up, bits_gu, down, bits_dn, ids, weights, I)
    check_bf16(out, moe_prefill_reference(h, wgu, wdn, ids, weights, I), what=f"moe_lq_prefill q{bits_gu}/q{bits_dn}")


def test_moe_lq_prefill_agrees_with_the_decode_path(ops):
    """The prefill chunk against the LQ decode launches over windows of 8 tokens."""
    rng = rng_for("moe_lq_prefill_vs_decode")
    T, H, I, E, k = 40, 256, 128, 16, 4
    gate_up, _ = random_bank(rng, E, 2 * I, H, 5)
    down, _ = random_bank(rng, E, H, I, 4)
    h = bf16_randn(rng, (T, H))
    ids, weights = random_routes(rng, T, E, k)
    out = ops.moe_lq_prefill(h, gate_up, 5, down, 4, ids, weights, I)
    dec = np.concatenate([
        ops.moe_lq_down(ops.moe_lq_gate_up(h[t : t + 8], gate_up, 5, ids[t : t + 8], I), down, 4, ids[t : t + 8],
                        weights[t : t + 8], H)
        for t in range(0, T, 8)
    ])
    check_bf16(out, from_bf16(dec), what="moe_lq_prefill vs the decode launches")


def test_moe_lq_prefill_refuses_bad_arguments(ops):
    H, I = 64, 64
    gu = np.zeros((2, layout.packed_bytes(2 * I, H, 4)), np.uint8)
    dn = np.zeros((2, layout.packed_bytes(H, I, 4)), np.uint8)
    h = np.zeros((9, H), np.uint16)
    w = np.ones((9, 1), np.float32)
    with pytest.raises(ValueError, match="expert id 2 out of range"):
        ops.moe_lq_prefill(h, gu, 4, dn, 4, np.full((9, 1), 2, np.int32), w, I)
    with pytest.raises(ValueError, match="gate_up: bytes per expert"):
        ops.moe_lq_prefill(h, gu, 5, dn, 4, np.zeros((9, 1), np.int32), w, I)
    with pytest.raises(ValueError, match="down: bits must be 4, 5 or 6"):
        ops.moe_lq_prefill(h, gu, 4, dn, 3, np.zeros((9, 1), np.int32), w, I)
    with pytest.raises(ValueError, match="down: experts must be 2"):
        ops.moe_lq_prefill(h, gu, 4, dn[:1], 4, np.zeros((9, 1), np.int32), w, I)


# Prefill projections [out, in] (models/configs): 35B-A3B hidden 2048 (GDN in qkv|z|b|a 12352,
# attention q|gate|k|v 9216, o / GDN out from 4096, the shared expert), 27B hidden 5120 (GDN in
# 16480, attention 14336, o / GDN out from 6144, MLP gate|up 34816, down from 17408).
PREFILL_SHAPES = [
    ("35B-A3B gdn in", 12_352, 2048), ("35B-A3B attn qkv", 9216, 2048), ("35B-A3B o_proj", 2048, 4096),
    ("35B-A3B shared gate_up", 1024, 2048), ("35B-A3B shared down", 2048, 512),
    ("27B gdn in", 16_480, 5120), ("27B attn qkv", 14_336, 5120), ("27B o_proj", 5120, 6144),
    ("27B mlp gate_up", 34_816, 5120), ("27B mlp down", 5120, 17_408),
]


def test_zz_lq_gemm_timings(ops):
    T = 2048
    lines = []
    for name, out, inn in PREFILL_SHAPES:
        bf16 = ops.bench_linear(out, inn, T, 10, False)
        cells = [f"bf16 {bf16['us']:8.1f} us {bf16['TFLOPs']:5.0f} TFLOP/s"]
        for bits in layout.WIDTHS:
            r = ops.bench_gemm_lq(out, inn, bits, T, 10)
            cells.append(f"q{bits} {r['us']:8.1f} us {r['TFLOPs']:5.0f}")
        lines.append(f"GEMM {name:24s} [{out},{inn}] T={T}: " + " | ".join(cells))
    lines += moe_prefill_timings(ops, T)
    print("\n" + "\n".join(lines))


def moe_prefill_timings(ops, T: int) -> list[str]:
    """The 35B-A3B routed experts of a prefill chunk (E = 256, k = 8, H = 2048, I = 512): bf16 and LQ
    banks, sort + 2 grouped GEMMs + combine, mean of 3 cold-L2 launches (constant weights: the
    values do not matter here)."""
    rng = np.random.default_rng(0)
    E, k, H, I = 256, 8, 2048, 512
    h = bf16_randn(rng, (T, H))
    ids, weights = random_routes(rng, T, E, k)
    flops = 2.0 * T * k * 3 * I * H
    gu16 = np.full((E, 2 * I, H), 0x3C00, np.uint16)
    dn16 = np.full((E, H, I), 0x3C00, np.uint16)
    _, ms = ops.moe_experts_prefill(h, gu16, dn16, ids, weights, repeat=3)
    lines = [f"MoE 35B-A3B prefill T={T}: bf16 {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s)"]
    del gu16, dn16
    for bits_gu, bits_dn in ((4, 6), (5, 5), (4, 4)):
        gu = np.full((E, layout.packed_bytes(2 * I, H, bits_gu)), 0x3C, np.uint8)
        dn = np.full((E, layout.packed_bytes(H, I, bits_dn)), 0x3C, np.uint8)
        _, ms = ops.moe_lq_prefill(h, gu, bits_gu, dn, bits_dn, ids, weights, I, 3)
        lines.append(f"MoE 35B-A3B prefill T={T}: LQ q{bits_gu}/q{bits_dn} {ms:.3f} ms "
                     f"({flops / ms / 1e9:.0f} TFLOP/s)")
    return lines
