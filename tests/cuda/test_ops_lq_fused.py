"""The decode step's folded forms for LQ weights (lampo._native_ops, ops_lq_fused_bindings.cpp:
gemv_lq_normed / gemv_lq_add_residual and the two halves of a norm carried between blocks,
gemv_lq_add_residual_prenorm / gemv_lq_prenormed, the latter with the SwiGLU activation of an
interleaved gate|up block (gemv_lq_prenormed_swiglu), in native/src/kernels/matmul/gemv_lq.cu, the LQ
MoE launches' shared slot, selection and residual add in native/src/kernels/moe/moe_experts_lq.cu).

Each fused form is checked bit for bit against the unfused GPU launches it replaces where their
roundings are the same (rmsnorm + gemv_lq; gemv_lq + the residual add; moe_router_topk's ids and
weights; the LQ gate_up's routed act; the down launch storing its output), and against numpy on the
dequantized matrices (models/quant/layout.py; tolerances as tests/cuda/test_ops_lq.py: fp32 1e-4,
bf16 1e-2 of |ref| + rms(ref)). The shared slot's act is rounded once (silu(gate) * up in fp32) where
the unfused shared expert rounds gate_up first, so the whole MoE block is compared with the unfused
LQ launches (gate_up, down, gemv_lq, silu_mul, gemv_lq, moe_shared_combine) at 2e-2. A verify
window's MoE rows (tokens sharing experts) are checked against the same launches token by token.
test_zz_lq_fused_timings prints the 35B-A3B decode MoE launches' time (never asserted).
"""

from __future__ import annotations

import numpy as np
import pytest

from lampo.models.bf16 import from_bf16, to_bf16
from lampo.models.quant import layout
from lampo.models.reference import ffn, norms
from lampo.models.reference.activations import sigmoid, silu

from .test_ops_core import bf16_randn, check_bf16, check_close, rng_for
from .test_ops_lq import random_lq

# (bits_gu, bits_dn, shared gate_up bits, shared down bits): the q5 and q4 recipes, and mixed widths
WIDTH_SETS = [(4, 6, 6, 6), (4, 4, 5, 5), (6, 5, 4, 4)]


# ---- the GEMV's folded forms ----------------------------------------------------------------------


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("out, inn, f32", [
    (16, 64, False),      # one tile
    (48, 192, True),      # uneven K slices
    (8192, 2048, False),  # 35B-A3B GDN in-projection
    (256, 2048, True),    # fp32 output
    (1024, 5120, False),  # 27B width
    (4096, 5120, True),   # enough groups for 16-warp blocks: the norm on the first 256 threads
    (12352, 2048, False),  # 35B-A3B GDN in-projection: 16-warp blocks in rings
])
def test_gemv_lq_normed_is_rmsnorm_then_gemv_lq(ops, bits, out, inn, f32):
    """The input projection builds the normed row itself: the bits of the rmsnorm launch followed
    by gemv_lq, and the normed row it writes out equals rmsnorm's."""
    rng = rng_for("gemv_lq_normed", bits, out, inn)
    packed, w = random_lq(rng, out, inn, bits)
    norm_w = bf16_randn(rng, inn, 0.2)
    residual = (rng.standard_normal((1, inn)) * 3).astype(np.float32)
    y, normed = ops.gemv_lq_normed(packed, bits, out, inn, residual, norm_w, 1e-6, f32)
    want_normed = ops.rmsnorm(residual, norm_w, 1e-6)
    np.testing.assert_array_equal(normed, want_normed)
    np.testing.assert_array_equal(y, ops.gemv_lq(packed, bits, out, inn, want_normed, f32))
    x = to_bf16(norms.rmsnorm1p(residual, from_bf16(norm_w)))
    ref = from_bf16(x).astype(np.float64) @ w.astype(np.float64).T
    if f32:
        check_close(y, ref, 1e-4, f"gemv_lq_normed f32 bits={bits}")
    else:
        check_bf16(y, ref, what=f"gemv_lq_normed bits={bits}")


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("out, inn", [(16, 64), (2048, 4096), (2048, 512), (5120, 6144)])
def test_gemv_lq_add_residual_is_gemv_lq_then_add(ops, bits, out, inn):
    rng = rng_for("gemv_lq_add", bits, out, inn)
    packed, w = random_lq(rng, out, inn, bits)
    x = bf16_randn(rng, (1, inn))
    residual = (rng.standard_normal((1, out)) * 3).astype(np.float32)
    got = ops.gemv_lq_add_residual(packed, bits, out, inn, x, residual)
    y = ops.gemv_lq(packed, bits, out, inn, x, False)
    np.testing.assert_array_equal(got, residual + from_bf16(y))
    check_bf16(y, from_bf16(x).astype(np.float64) @ w.astype(np.float64).T, what=f"gemv_lq bits={bits}")
    # set: whatever the residual held (NaN here), the bits of the add on a zeroed residual
    got_set = ops.gemv_lq_add_residual(packed, bits, out, inn, x, np.full_like(residual, np.nan), set=True)
    np.testing.assert_array_equal(got_set, ops.gemv_lq_add_residual(packed, bits, out, inn, x, np.zeros_like(residual)))


PRENORM_EPS = 1e-6


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("out, inn, T", [
    (16, 64, 1),
    (2048, 4096, 5),     # 35B-A3B width: a 16-warp wave of one group per warp
    (5120, 6144, 4),     # 27B o / GDN out projection
    (5120, 17_408, 8),   # 27B down: eight tokens of x take two launches
])
def test_prenorm_output_is_the_residual_add_and_the_next_norms_first_half(ops, bits, out, inn, T):
    """The output projection carrying a norm's first half: the residual add of gemv_lq's rounded
    rows, the prenormed rows bf16(r * (1 + w)) bit for bit, each strip's sum of squares; each
    token's values as if it ran alone."""
    rng = rng_for("gemv_lq_prenorm", bits, out, inn, T)
    packed, _ = random_lq(rng, out, inn, bits)
    x = bf16_randn(rng, (T, inn))
    residual = (rng.standard_normal((T, out)) * 3).astype(np.float32)
    norm_w = bf16_randn(rng, out, 0.2)
    got_r, rows, squares = ops.gemv_lq_add_residual_prenorm(packed, bits, out, inn, x, residual, norm_w)
    want_r = residual + from_bf16(ops.gemv_lq(packed, bits, out, inn, x, False))
    np.testing.assert_array_equal(got_r, want_r)
    np.testing.assert_array_equal(rows, to_bf16(want_r * (np.float32(1) + from_bf16(norm_w))))
    want_sq = (want_r.astype(np.float64) ** 2).reshape(T, out // 16, 16).sum(axis=2)
    np.testing.assert_allclose(squares, want_sq, rtol=1e-5)
    for t in sorted({0, T - 1}):
        alone = ops.gemv_lq_add_residual_prenorm(packed, bits, out, inn, x[t:t + 1], residual[t:t + 1], norm_w)
        for a, b in zip(alone, (got_r, rows, squares)):
            np.testing.assert_array_equal(a[0], b[t])


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("out, inn, T, widths", [
    (16, 64, 1, ()),
    (1024, 2048, 4, ()),
    (4096, 5120, 2, ()),                        # 27B width: 16-warp blocks in rings
    (16_480, 5120, 5, (8192, 6144, 48, 48)),    # 27B GDN in-projection's parts (a verify window)
])
def test_prenormed_input_is_the_norm_then_the_product(ops, bits, out, inn, T, widths):
    """The input projection on prenormed rows: each token's product scaled by its rsqrt(mean of
    squares + eps) before rounding, from the strip sums; the row parts are the plain rows split;
    each token as if it ran alone."""
    rng = rng_for("gemv_lq_prenormed", bits, out, inn, T)
    packed, w = random_lq(rng, out, inn, bits)
    r = (rng.standard_normal((T, inn)) * 3).astype(np.float32)
    norm_w = bf16_randn(rng, inn, 0.2)
    rows = to_bf16(r * (np.float32(1) + from_bf16(norm_w)))
    squares = (r.astype(np.float64) ** 2).reshape(T, inn // 16, 16).sum(axis=2).astype(np.float32)
    y = ops.gemv_lq_prenormed(packed, bits, out, inn, rows, squares, PRENORM_EPS)
    inv = 1.0 / np.sqrt(squares.astype(np.float64).sum(axis=1, keepdims=True) / inn + PRENORM_EPS)
    check_bf16(y, inv * (from_bf16(rows).astype(np.float64) @ w.astype(np.float64).T),
               what=f"gemv_lq_prenormed bits={bits}")
    # against the norm applied before the product: only x's rounding differs
    normed = to_bf16(norms.rmsnorm1p(r, from_bf16(norm_w)))
    check_bf16(y, from_bf16(normed).astype(np.float64) @ w.astype(np.float64).T, 2e-2, "prenormed vs rmsnorm1p")
    for t in sorted({0, T - 1}):
        np.testing.assert_array_equal(
            ops.gemv_lq_prenormed(packed, bits, out, inn, rows[t:t + 1], squares[t:t + 1], PRENORM_EPS)[0], y[t])
    if widths:
        edges = np.cumsum((0, *widths))
        want = np.concatenate([y[:, a:b].ravel() for a, b in zip(edges[:-1], edges[1:])])
        got = ops.gemv_lq_prenormed(packed, bits, out, inn, rows, squares, PRENORM_EPS, list(widths))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bits, out, inn, T", [
    *((bits, 32, 64, 1) for bits in layout.WIDTHS),
    *((bits, 1024, 2048, 3) for bits in layout.WIDTHS),
    (4, 4352, 5120, 1),  # 27B width (its gate|up is 4-bit in both recipes), 16-warp blocks in rings
    (4, 4352, 5120, 5),  # (a verify window)
])
def test_prenormed_swiglu_is_the_product_then_silu_mul(ops, bits, out, inn, T):
    """An interleaved gate|up block on prenormed rows with the activation in the GEMV: act = bit for
    bit silu_mul (interleaved) of gemv_lq_prenormed's rows, each token as if alone; the interleaved
    silu_mul is the plain one on the rows in gate|up order; both near numpy's silu(gate) * up."""
    rng = rng_for("gemv_lq_prenormed_swiglu", bits, out, inn, T)
    packed, w = random_lq(rng, out, inn, bits)  # gate rows, then up rows
    order = layout.interleaved_rows(out)
    interleaved = layout.interleave_halves(packed, out, inn, bits)
    r = (rng.standard_normal((T, inn)) * 3).astype(np.float32)
    rows = to_bf16(r * (np.float32(1) + from_bf16(bf16_randn(rng, inn, 0.2))))
    squares = (r.astype(np.float64) ** 2).reshape(T, inn // 16, 16).sum(axis=2).astype(np.float32)
    act = ops.gemv_lq_prenormed_swiglu(interleaved, bits, out, inn, rows, squares, PRENORM_EPS)
    gu = ops.gemv_lq_prenormed(interleaved, bits, out, inn, rows, squares, PRENORM_EPS)
    np.testing.assert_array_equal(act, ops.silu_mul(gu, True))
    plain = ops.gemv_lq_prenormed(packed, bits, out, inn, rows, squares, PRENORM_EPS)
    np.testing.assert_array_equal(ops.silu_mul(plain[:, order], True), ops.silu_mul(plain))
    for t in sorted({0, T - 1}):
        np.testing.assert_array_equal(
            ops.gemv_lq_prenormed_swiglu(interleaved, bits, out, inn, rows[t:t + 1], squares[t:t + 1],
                                         PRENORM_EPS)[0], act[t])
    inv = 1.0 / np.sqrt(squares.astype(np.float64).sum(axis=1, keepdims=True) / inn + PRENORM_EPS)
    y = inv * (from_bf16(rows).astype(np.float64) @ w.astype(np.float64).T)
    check_bf16(act, silu(y[:, :out // 2]) * y[:, out // 2:], 2e-2, f"prenormed swiglu bits={bits}")


def test_gemv_lq_folded_refuse_bad_arguments(ops):
    packed = np.zeros(layout.packed_bytes(16, 64, 4), np.uint8)
    with pytest.raises(ValueError, match="bits 4..6"):
        ops.gemv_lq_normed(np.zeros(layout.packed_bytes(16, 64, 4), np.uint8), 7, 16, 64,
                           np.zeros((1, 64), np.float32), np.zeros(64, np.uint16))
    with pytest.raises(ValueError, match="residual: length"):
        ops.gemv_lq_add_residual(packed, 4, 16, 64, np.zeros((1, 64), np.uint16), np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="strip_squares: size"):
        ops.gemv_lq_prenormed(packed, 4, 16, 64, np.zeros((2, 64), np.uint16), np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match="norm_w: length"):
        ops.gemv_lq_add_residual_prenorm(packed, 4, 16, 64, np.zeros((1, 64), np.uint16),
                                         np.zeros((1, 16), np.float32), np.zeros(8, np.uint16))
    with pytest.raises(ValueError, match="out a multiple of 32, got 16"):
        ops.gemv_lq_prenormed_swiglu(packed, 4, 16, 64, np.zeros((1, 64), np.uint16), np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match="half 0 or 1"):
        ops.lq_place_half(packed, packed, 0, 64, 4, 2)


# ---- the MoE launches -----------------------------------------------------------------------------


def lq_bank(rng, experts: int, rows: int, cols: int, bits: int, used) -> tuple[np.ndarray, dict]:
    """An LQ expert bank [E, bytes] with random experts `used` (the others all zero bytes: never
    read) and the fp32 matrices [rows, cols] of the used ones."""
    bank = np.zeros((experts, layout.packed_bytes(rows, cols, bits)), np.uint8)
    mats = {}
    for e in sorted({int(e) for e in np.ravel(used)}):
        bank[e], mats[e] = random_lq(rng, rows, cols, bits)
    return bank, mats


class Moe:
    """An LQ MoE layer's experts for the given ids: banks, the shared expert (packed and fp32), w_gate."""

    def __init__(self, rng, H: int, I: int, E: int, Is: int, widths, used):
        self.H, self.I, self.Is = H, I, Is
        self.bits_gu, self.bits_dn, self.s_gu_bits, self.s_dn_bits = widths
        self.gate_up, self.wgu = lq_bank(rng, E, 2 * I, H, self.bits_gu, used)
        self.down, self.wdn = lq_bank(rng, E, H, I, self.bits_dn, used)
        self.s_gate_up, self.sgu = random_lq(rng, 2 * Is, H, self.s_gu_bits)
        self.s_down, self.sdn = random_lq(rng, H, Is, self.s_dn_bits)
        self.w_gate = bf16_randn(rng, (H,), H**-0.5)

    def shared(self) -> dict:
        return {"shared_gate_up": self.s_gate_up, "shared_gate_up_bits": self.s_gu_bits, "shared_down": self.s_down,
                "shared_down_bits": self.s_dn_bits, "w_gate": self.w_gate, "Is": self.Is}

    def act_ref(self, h, ids):
        """silu(gate) * up of every routed slot [T, k, I], fp64."""
        hf, I = from_bf16(h).astype(np.float64), self.I
        return np.stack([np.stack([silu(self.wgu[e][:I] @ hf[t]) * (self.wgu[e][I:] @ hf[t]) for e in ids[t]])
                         for t in range(len(h))])

    def shared_act_ref(self, h):
        hf, Is = from_bf16(h).astype(np.float64), self.Is
        return silu(hf @ self.sgu[:Is].T.astype(np.float64)) * (hf @ self.sgu[Is:].T.astype(np.float64))

    def gate_ref(self, h):
        return sigmoid(from_bf16(h).astype(np.float64) @ from_bf16(self.w_gate).astype(np.float64))

    def out_ref(self, act, act_s, ids, weights, gate):
        """The down launch's sum from the GPU's acts (act_s None: routed experts only), fp64."""
        actf = from_bf16(act).astype(np.float64)
        out = np.stack([sum(weights[t, s] * (self.wdn[e] @ actf[t, s]) for s, e in enumerate(ids[t]))
                        for t in range(len(ids))])
        if act_s is not None:
            out += gate[:, None] * (from_bf16(act_s).astype(np.float64) @ self.sdn.T.astype(np.float64))
        return out

    def block_ref(self, h, ids, weights):
        """The whole MoE block from h in fp32 through the reference swiglu (ffn.moe_block's sum)."""
        hf, I = from_bf16(h), self.I
        out = np.stack([sum(weights[t, s] * ffn.swiglu(hf[t:t + 1], self.wgu[e][:I], self.wgu[e][I:], self.wdn[e])[0]
                            for s, e in enumerate(ids[t])) for t in range(len(h))])
        Is = self.Is
        return out + self.gate_ref(h)[:, None] * ffn.swiglu(hf, self.sgu[:Is], self.sgu[Is:], self.sdn)

    def unfused_block(self, ops, h, act, ids, weights):
        """The engine's unfolded LQ MoE: routed down, then the shared expert through its own
        projections and moe_shared_combine (bf16 bits)."""
        routed = ops.moe_lq_down(act, self.down, self.bits_dn, ids, weights, self.H)
        gu = ops.gemv_lq(self.s_gate_up, self.s_gu_bits, 2 * self.Is, self.H, h, False)
        shared = ops.gemv_lq(self.s_down, self.s_dn_bits, self.H, self.Is, ops.silu_mul(gu), False)
        return ops.moe_shared_combine(routed, shared, h, self.w_gate)


def router_with_a_tie(rng, T: int, H: int, E: int):
    """h [T, H] and a router [E, H] whose rows 3 and min(9, E - 1) are equal (an exact tie: the lower
    id first)."""
    h = bf16_randn(rng, (T, H))
    w = bf16_randn(rng, (E, H), H**-0.5)
    w[3] = w[min(9, E - 1)] = to_bf16(from_bf16(h).mean(axis=0) * np.float32(3.0 / H))
    return h, w


@pytest.mark.parametrize("widths", WIDTH_SETS)
@pytest.mark.parametrize("T, H, I, E, k, Is", [
    (1, 2048, 512, 32, 8, 512),  # the 35B-A3B's shapes (fewer experts)
    (3, 256, 128, 8, 2, 64),     # Is < I
    (8, 128, 64, 8, 2, 192),     # Is > I: the gate_up grid spans Is
])
def test_moe_lq_shared_slot_is_the_moe_block(ops, widths, T, H, I, E, k, Is):
    rng = rng_for("moe_lq_shared", widths, T, H, I, E, k, Is)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    weights = rng.random((T, k)).astype(np.float32)
    weights /= weights.sum(axis=1, keepdims=True)
    m = Moe(rng, H, I, E, Is, widths, ids)
    h = bf16_randn(rng, (T, H))
    act, act_s, out, gate = ops.moe_lq_decode_shared(h, m.gate_up, m.bits_gu, m.down, m.bits_dn, ids, weights, I,
                                                     **m.shared())
    what = f"widths={widths}"
    np.testing.assert_array_equal(act, ops.moe_lq_gate_up(h, m.gate_up, m.bits_gu, ids, I))
    check_bf16(act, m.act_ref(h, ids), what=f"routed act {what}")
    check_bf16(act_s, m.shared_act_ref(h), what=f"shared act {what}")
    np.testing.assert_allclose(gate, m.gate_ref(h), rtol=1e-5, atol=1e-6)
    check_bf16(out, m.out_ref(act, act_s, ids, weights, gate), what=f"down with the shared slot {what}")
    check_bf16(out, m.block_ref(h, ids, weights), 2e-2, what=f"MoE block vs reference {what}")
    check_bf16(out, from_bf16(m.unfused_block(ops, h, act, ids, weights)), 2e-2,
               what=f"MoE block vs the unfused launches {what}")


@pytest.mark.parametrize("widths", WIDTH_SETS[:2])
@pytest.mark.parametrize("T, H, I, E, k, Is, shared", [
    (1, 2048, 512, 256, 8, 512, True),  # the 35B-A3B
    (3, 256, 128, 8, 2, 64, True),
    (8, 256, 64, 16, 8, 128, True),     # 9 warps per down block, 8 tokens
    (2, 128, 64, 512, 8, 0, False),     # E = 512, no shared slot
])
def test_moe_lq_select_is_router_topk_then_experts(ops, widths, T, H, I, E, k, Is, shared):
    """The decode step's LQ MoE launches: gate_up selects the experts from the router logits with
    moe_router_topk's bits (ids and weights, the planted tie included), down adds the block into
    the residual, bit for bit the separate top-k, experts and residual add."""
    rng = rng_for("moe_lq_select", widths, T, H, I, E, k, Is)
    h, w_router = router_with_a_tie(rng, T, H, E)
    want_ids, want_weights, logits = ops.moe_router_topk(h, w_router, k)
    m = Moe(rng, H, I, E, max(Is, 64), widths, want_ids)
    residual = rng.standard_normal((T, H)).astype(np.float32)
    kw = m.shared() if shared else {}
    ids, weights, act, act_s, new_residual = ops.moe_lq_decode_select(h, logits, m.gate_up, m.bits_gu, m.down,
                                                                      m.bits_dn, I, residual, k, **kw)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(weights, want_weights)
    tied = min(9, E - 1)
    for row in ids:
        if 3 in row and tied in row:
            assert list(row).index(3) < list(row).index(tied), row
    np.testing.assert_array_equal(act, ops.moe_lq_gate_up(h, m.gate_up, m.bits_gu, ids, I))
    if shared:
        _, act_s2, out, _ = ops.moe_lq_decode_shared(h, m.gate_up, m.bits_gu, m.down, m.bits_dn, ids, weights, I,
                                                        **m.shared())
        np.testing.assert_array_equal(act_s, act_s2)
        check_bf16(out, m.block_ref(h, ids, weights), 2e-2, what=f"MoE block widths={widths}")
    else:
        assert act_s is None
        out = ops.moe_lq_down(act, m.down, m.bits_dn, ids, weights, H)
        check_bf16(out, m.out_ref(act, None, ids, weights, None), what=f"routed experts widths={widths}")
    np.testing.assert_array_equal(new_residual, residual + from_bf16(out))


@pytest.mark.parametrize("widths", WIDTH_SETS[:2])
@pytest.mark.parametrize("select", [False, True], ids=["ids", "select"])
def test_moe_lq_window_rows_are_the_one_token_bits(ops, widths, select):
    """A verify window whose tokens share experts (drawn from a pool of six, and the shared
    expert): every token's ids, weights, act rows, shared act and output are its one-token
    launch's bits, so a verify row equals the plain step that would have run it."""
    rng = rng_for("moe_lq_window", widths, select)
    T, H, I, E, k, Is = 5, 256, 128, 16, 4, 64
    logits = rng.standard_normal((T, E)).astype(np.float32)
    logits[:, :6] += 8.0  # every token's top-k from experts 0..5
    pool = np.stack([rng.choice(6, k, replace=False) for _ in range(T)]).astype(np.int32)
    m = Moe(rng, H, I, E, Is, widths, np.arange(6))
    h = bf16_randn(rng, (T, H))
    if select:
        residual = rng.standard_normal((T, H)).astype(np.float32)

        def run(rows):
            return ops.moe_lq_decode_select(h[rows], logits[rows], m.gate_up, m.bits_gu, m.down, m.bits_dn, I,
                                            residual[rows], k, **m.shared())
    else:
        weights = rng.random((T, k)).astype(np.float32)
        weights /= weights.sum(axis=1, keepdims=True)

        def run(rows):
            return ops.moe_lq_decode_shared(h[rows], m.gate_up, m.bits_gu, m.down, m.bits_dn, pool[rows], weights[rows],
                                            I, **m.shared())
    window = run(slice(0, T))
    if select:
        assert len({int(e) for e in np.ravel(window[0])}) < T * k  # the window repeats experts
    for t in range(T):
        alone = run(slice(t, t + 1))
        for got, want in zip(window, alone):
            np.testing.assert_array_equal(got[t], want[0])


def test_moe_lq_shared_slot_refuses_bad_arguments(ops):
    rng = rng_for("moe_lq_bad")
    m = Moe(rng, 128, 64, 2, 64, (4, 4, 4, 4), [0, 1])
    h, ids, weights = bf16_randn(rng, (1, 128)), np.array([[1]], np.int32), np.ones((1, 1), np.float32)
    with pytest.raises(ValueError, match="shared_gate_up: size"):
        ops.moe_lq_decode_shared(h, m.gate_up, 4, m.down, 4, ids, weights, 64, **(m.shared() | {"Is": 128}))
    with pytest.raises(ValueError, match="come together"):
        ops.moe_lq_decode_select(h, np.zeros((1, 2), np.float32), m.gate_up, 4, m.down, 4, 64,
                                 np.zeros((1, 128), np.float32), 1, shared_gate_up=m.s_gate_up)


def test_zz_lq_fused_timings(ops):
    """The 35B-A3B decode MoE (E 256, k 8, H 2048, I = Is = 512) as the two folded LQ launches,
    mean of 20 cold-L2 runs, beside the routed-only LQ launches (random bytes: values unused)."""
    rng = np.random.default_rng(0)
    T, k, H, I, E, Is = 1, 8, 2048, 512, 256, 512
    h = bf16_randn(rng, (T, H))
    logits = rng.standard_normal((T, E)).astype(np.float32)
    residual = np.zeros((T, H), np.float32)
    lines = []
    for bits_gu, bits_dn, s_bits in ((4, 6, 6), (4, 4, 5)):
        gu = rng.integers(0, 256, (E, layout.packed_bytes(2 * I, H, bits_gu)), dtype=np.uint8)
        dn = rng.integers(0, 256, (E, layout.packed_bytes(H, I, bits_dn)), dtype=np.uint8)
        shared = {"shared_gate_up": rng.integers(0, 256, layout.packed_bytes(2 * Is, H, s_bits), dtype=np.uint8),
                  "shared_gate_up_bits": s_bits,
                  "shared_down": rng.integers(0, 256, layout.packed_bytes(H, Is, s_bits), dtype=np.uint8),
                  "shared_down_bits": s_bits, "w_gate": bf16_randn(rng, (H,), H**-0.5), "Is": Is}
        ms = ops.moe_lq_decode_select(h, logits, gu, bits_gu, dn, bits_dn, I, residual, k, **shared, repeat=20)[-1]
        ms_routed = ops.moe_lq_decode_select(h, logits, gu, bits_gu, dn, bits_dn, I, residual, k, repeat=20)[-1]
        lines.append(f"MoE 35B-A3B token, LQ select + down_add (q{bits_gu}/q{bits_dn}, shared q{s_bits}): "
                     f"{ms * 1e3:.1f} us with the shared slot, {ms_routed * 1e3:.1f} us routed only")
    print("\n" + "\n".join(lines))
