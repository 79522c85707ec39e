"""GPU tests of the Gated DeltaNet and MoE kernels (lampo._native_ops) against the numpy reference.

Oracles: `lampo.models.reference.gated_deltanet` (conv, gates, l2norm, token-serial delta rule),
`.norms.gated_rmsnorm`, `.ffn` (router, swiglu, moe_block), evaluated in fp32 on the same
bf16-rounded inputs the kernels see (`ops` is the conftest fixture `lampo._native_ops`). The
bindings poison every output and workspace (NaN / -1) before each launch, so anything a kernel
fails to write fails the comparison.

Tolerances: bf16 outputs `max|got - want| <= 1e-2 * max|want|` and elementwise
`|got - want| <= 2e-2 |want| + 5e-3 max|want|` (bf16 keeps 8 bits: 0.4 % per rounding);
fp32 recurrent state `max|got - want| <= 1e-4 * max|want|`; router logits/weights 1e-5; expert
ids and conv states exact. Timings (35B-A3B dims) are printed, never asserted (run with -s).
"""

from __future__ import annotations

import numpy as np
import pytest
from lampo.models.bf16 import from_bf16, to_bf16
from lampo.models.reference import ffn, norms
from lampo.models.reference import gated_deltanet as gdn
from lampo.models.reference.activations import silu

D = 128  # GDN head dim (dk = dv)
TIMINGS: list[str] = []


# ---- helpers ------------------------------------------------------------------------------------
def bf16_normal(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    return to_bf16(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def bf16_bits_fast(rng: np.random.Generator, shape) -> np.ndarray:
    """Random finite bf16 bits of magnitude in [2^-7, 2^-6) (timing inputs of a few GB)."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    return (bits & np.uint16(0x807F)) | np.uint16(0x3C00)


def assert_bf16_close(got_bits: np.ndarray, want: np.ndarray, what: str) -> None:
    got = from_bf16(got_bits)
    assert np.isfinite(got).all(), f"{what}: non-finite values (unwritten output?)"
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))
    assert err <= 1e-2 * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g}"
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=5e-3 * scale, err_msg=what)


def assert_state_close(got: np.ndarray, want: np.ndarray, what: str, rel: float = 1e-4) -> None:
    assert np.isfinite(got).all(), f"{what}: non-finite values"
    err = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    assert err <= rel * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g} (rel {err / scale:.2g})"


# ---- causal conv1d ------------------------------------------------------------------------------
@pytest.mark.parametrize("T,C,K", [(1, 512, 4), (5, 512, 4), (64, 512, 4), (65, 512, 3), (300, 768, 4), (2, 8192, 4)])
def test_conv1d_matches_reference(ops, T, C, K):
    rng = np.random.default_rng(T * 7 + C + K)
    x, w, state = bf16_normal(rng, (T, C)), bf16_normal(rng, (C, K), 0.5), bf16_normal(rng, (C, K - 1))
    y, new_state = ops.causal_conv1d_silu(x, w, state)
    want_y, want_state = gdn.causal_conv1d_silu(from_bf16(x), from_bf16(w), from_bf16(state))
    assert_bf16_close(y, want_y, f"conv1d y T={T}")
    np.testing.assert_array_equal(new_state, to_bf16(want_state))


def test_conv1d_sequence_equals_steps_with_state_carried(ops):
    rng = np.random.default_rng(1)
    T, C, K = 150, 1024, 4  # 150 > one 64-token tile: the split-time path and its state launch
    x, w, state0 = bf16_normal(rng, (T, C)), bf16_normal(rng, (C, K), 0.5), bf16_normal(rng, (C, K - 1))
    y_seq, state_seq = ops.causal_conv1d_silu(x, w, state0)
    state, ys = state0, []
    for t in range(T):
        y_t, state = ops.causal_conv1d_silu(x[t : t + 1], w, state)
        ys.append(y_t)
    np.testing.assert_array_equal(np.concatenate(ys), y_seq)
    np.testing.assert_array_equal(state, state_seq)
    # two uneven pieces (2 tokens < K-1 window, then the rest) give the same again
    y_a, st = ops.causal_conv1d_silu(x[:2], w, state0)
    y_b, st = ops.causal_conv1d_silu(x[2:], w, st)
    np.testing.assert_array_equal(np.concatenate([y_a, y_b]), y_seq)
    np.testing.assert_array_equal(st, state_seq)


@pytest.mark.parametrize("T,K", [(1, 4), (5, 4), (8, 3), (3, 2)])
def test_conv1d_row_states_are_the_states_after_each_token(ops, T, K):
    rng = np.random.default_rng(T + 10 * K)
    C = 1024
    x, w, state0 = bf16_normal(rng, (T, C)), bf16_normal(rng, (C, K), 0.5), bf16_normal(rng, (C, K - 1))
    y, state, rows = ops.causal_conv1d_silu(x, w, state0, rows=True)
    y_plain, state_plain = ops.causal_conv1d_silu(x, w, state0)
    np.testing.assert_array_equal(y, y_plain)
    np.testing.assert_array_equal(state, state_plain)
    for t in range(T):  # the state a run over the first t + 1 tokens ends with
        np.testing.assert_array_equal(rows[t], ops.causal_conv1d_silu(x[: t + 1], w, state0)[1])


# ---- gated delta rule ---------------------------------------------------------------------------
def gdn_inputs(rng: np.random.Generator, T: int, Hk: int, Hv: int):
    qkv = bf16_normal(rng, (T, 2 * Hk * D + Hv * D))
    a, b = bf16_normal(rng, (T, Hv)), bf16_normal(rng, (T, Hv))
    # decays exp(g) from ~0.15 up to ~0.9995: short and long memories
    A_log = np.log(rng.uniform(0.05, 2.0, Hv)).astype(np.float32)
    dt_bias = rng.uniform(-4.0, 0.0, Hv).astype(np.float32)
    state = (rng.standard_normal((Hv, D, D), dtype=np.float32) * np.float32(0.3)).astype(np.float32)
    return qkv, a, b, A_log, dt_bias, state


def gdn_reference(qkv, a, b, A_log, dt_bias, state, Hk: int):
    x = from_bf16(qkv)
    T, Hv = a.shape
    q = gdn.l2norm(x[:, : Hk * D].reshape(T, Hk, D)) / np.float32(np.sqrt(D))
    k = gdn.l2norm(x[:, Hk * D : 2 * Hk * D].reshape(T, Hk, D))
    v = x[:, 2 * Hk * D :].reshape(T, Hv, D)
    g, beta = gdn.gdn_gates(from_bf16(a), from_bf16(b), A_log, dt_bias)
    return gdn.gated_delta_rule_recurrent(q, k, v, g, beta, state)


@pytest.mark.parametrize("T,Hk,Hv", [(1, 2, 4), (3, 1, 3), (8, 2, 4), (2, 16, 32)])
def test_gdn_recurrent_matches_reference_with_rows(ops, T, Hk, Hv):
    rng = np.random.default_rng(100 + T + Hv)
    qkv, a, b, A_log, dt_bias, state = gdn_inputs(rng, T, Hk, Hv)
    o, new_state, snaps = ops.gated_delta_rule_recurrent(qkv, a, b, A_log, dt_bias, state, Hk, rows=True)
    want_o, want_state = gdn_reference(qkv, a, b, A_log, dt_bias, state, Hk)
    assert_bf16_close(o, want_o, f"recurrent o T={T}")
    assert_state_close(new_state, want_state, f"recurrent state T={T}")
    assert snaps.shape == (T, Hv, D, D)
    np.testing.assert_array_equal(snaps[-1], new_state)
    s = state
    for t in range(T):  # row t == state after tokens 0..t
        _, s = gdn_reference(qkv[t : t + 1], a[t : t + 1], b[t : t + 1], A_log, dt_bias, s, Hk)
        assert_state_close(snaps[t], s, f"row {t}")
    # a window's records instead of its rows: gdn_replay rebuilds every row, bit for bit
    for got, want in zip(ops.gated_delta_rule_recurrent(qkv, a, b, A_log, dt_bias, state, Hk, rows=True,
                                                        records=True), (o, new_state, snaps), strict=True):
        np.testing.assert_array_equal(got, want)


def test_gdn_recurrent_without_rows_returns_none(ops):
    rng = np.random.default_rng(5)
    qkv, a, b, A_log, dt_bias, state = gdn_inputs(rng, 2, 1, 2)
    _, _, snaps = ops.gated_delta_rule_recurrent(qkv, a, b, A_log, dt_bias, state, 1)
    assert snaps is None


@pytest.mark.parametrize("Hk,Hv,K,T", [(16, 32, 4, 1), (2, 4, 3, 1), (1, 3, 2, 1), (16, 32, 4, 5), (2, 4, 3, 3)])
def test_gdn_decode_fused_matches_three_launches_and_reference(ops, Hk, Hv, K, T):
    """conv + delta rule + gated norm in one launch, for a decode step and a verify window (T tokens,
    with the states after each token): bit-identical to the three launches, close to numpy."""
    rng = np.random.default_rng(10 * Hv + K + 100 * T)
    x, a, b, A_log, dt_bias, state = gdn_inputs(rng, T, Hk, Hv)  # x: the pre-conv q|k|v rows
    C = x.shape[1]
    cw, cs = bf16_normal(rng, (C, K), 0.5), bf16_normal(rng, (C, K - 1))
    z, nw = bf16_normal(rng, (T, Hv * D)), to_bf16(rng.uniform(0.5, 1.5, D).astype(np.float32))
    y, cs_new, st_new, conv_rows, st_rows = ops.gdn_decode_fused(x, cw, cs, a, b, A_log, dt_bias, state, z, nw, Hk,
                                                                 rows=True)
    qkv, cs3, conv_rows3 = ops.causal_conv1d_silu(x, cw, cs, rows=True)
    o3, st3, st_rows3 = ops.gated_delta_rule_recurrent(qkv, a, b, A_log, dt_bias, state, Hk, rows=True)
    y3 = ops.gated_rmsnorm(o3, z, nw)
    np.testing.assert_array_equal(cs_new, cs3)
    np.testing.assert_array_equal(st_new, st3)
    np.testing.assert_array_equal(y, y3)
    np.testing.assert_array_equal(conv_rows, conv_rows3)
    np.testing.assert_array_equal(st_rows, st_rows3)
    with_records = ops.gdn_decode_fused(x, cw, cs, a, b, A_log, dt_bias, state, z, nw, Hk, rows=True, records=True)
    for got, want in zip(with_records, (y, cs_new, st_new, conv_rows, st_rows), strict=True):
        np.testing.assert_array_equal(got, want)  # the state rows rebuilt from the records by gdn_replay
    if T > 1:  # the engine's form: one recurrent state, which the window leaves as it was; each kept
        for keep in range(1, T + 1):  # prefix's state rebuilt in place from the records
            y_k, cs_k, st_k, conv_rows_k, none = ops.gdn_decode_fused(
                x, cw, cs, a, b, A_log, dt_bias, state, z, nw, Hk, rows=True, records=True, slots=T + 1,
                recurrent_slots=1, keep=keep, pos=keep)
            np.testing.assert_array_equal(st_k, st_rows[keep - 1])
            np.testing.assert_array_equal(y_k, y)
            np.testing.assert_array_equal(cs_k, cs_new)
            np.testing.assert_array_equal(conv_rows_k, conv_rows)
            assert none is None
    y_plain, cs_plain, st_plain = ops.gdn_decode_fused(x, cw, cs, a, b, A_log, dt_bias, state, z, nw, Hk)
    np.testing.assert_array_equal(y_plain, y)  # the rows change nothing else
    np.testing.assert_array_equal(cs_plain, cs_new)
    np.testing.assert_array_equal(st_plain, st_new)
    conv_ref, cs_ref = gdn.causal_conv1d_silu(from_bf16(x), from_bf16(cw), from_bf16(cs))
    np.testing.assert_array_equal(cs_new, to_bf16(cs_ref))
    o_ref, st_ref = gdn_reference(to_bf16(conv_ref), a, b, A_log, dt_bias, state, Hk)
    want = norms.gated_rmsnorm(o_ref, from_bf16(z).reshape(T, Hv, D), from_bf16(nw)).reshape(T, Hv * D)
    assert_bf16_close(y, want, "fused step y vs reference")
    # numpy's silu may round a conv output to the neighbouring bf16: 1e-3 here (exactness is checked above)
    assert_state_close(st_new, st_ref, "fused step state vs reference", rel=1e-3)


# ---- the states' ring of slots (ops.h, GdnStates) ----------------------------------------------
# A call at position pos reads slot pos % slots and writes the state after its last token (with rows,
# after each token t) to slot (pos + 1 + t) % slots: the same numbers as one slot updated in place,
# and (checked inside the bindings) no other slot touched. The positions below make the rows wrap
# around the ring's end, and land the last token on the slot read (T a multiple of slots).
RING_CASES = [(3, 5, 4, True), (5, 6, 11, True), (1, 2, 1, False), (4, 4, 2, False), (2, 3, 7, False)]


@pytest.mark.parametrize("T,slots,pos,rows", RING_CASES)
def test_gdn_ring_slots_give_the_single_slot_numbers(ops, T, slots, pos, rows):
    rng = np.random.default_rng(300 + 10 * T + slots)
    Hk, Hv, K = 2, 4, 4
    x, a, b, A_log, dt_bias, state = gdn_inputs(rng, T, Hk, Hv)
    C = x.shape[1]
    cw, cs = bf16_normal(rng, (C, K), 0.5), bf16_normal(rng, (C, K - 1))
    z, nw = bf16_normal(rng, (T, Hv * D)), to_bf16(rng.uniform(0.5, 1.5, D).astype(np.float32))
    ring = dict(slots=slots, pos=pos)

    def same(op, *args, **kw):  # the op on the ring == the op on one slot
        for got, want in zip(op(*args, **kw, **ring), op(*args, **kw), strict=True):
            assert (got is None) == (want is None)
            if want is not None:
                np.testing.assert_array_equal(got, want)

    same(ops.gdn_decode_fused, x, cw, cs, a, b, A_log, dt_bias, state, z, nw, Hk, rows=rows)
    if rows:  # records on the ring: the window writes no recurrent state, gdn_replay every row
        same(ops.gdn_decode_fused, x, cw, cs, a, b, A_log, dt_bias, state, z, nw, Hk, rows=True, records=True)
    same(ops.causal_conv1d_silu, x, cw, cs, rows=rows)
    qkv = ops.causal_conv1d_silu(x, cw, cs)[0]
    same(ops.gated_delta_rule_recurrent, qkv, a, b, A_log, dt_bias, state, Hk, rows=rows)
    if not rows:
        same(ops.gated_delta_rule_chunked, qkv, a, b, A_log, dt_bias, state, Hk)


def test_gdn_ring_prefill_tiles_write_the_slot_after_the_chunk(ops):
    """150 tokens: the conv's split-time path (its state written by a second launch) and the chunked
    rule, from slot 2 of 3 to slot (2 + 150) % 3 = 2 (in place) and from pos 4 to slot 1."""
    rng = np.random.default_rng(9)
    T, Hk, Hv, K = 150, 1, 2, 4
    x, a, b, A_log, dt_bias, state = gdn_inputs(rng, T, Hk, Hv)
    cw, cs = bf16_normal(rng, (x.shape[1], K), 0.5), bf16_normal(rng, (x.shape[1], K - 1))
    y1, cs1 = ops.causal_conv1d_silu(x, cw, cs)
    o1, st1 = ops.gated_delta_rule_chunked(y1, a, b, A_log, dt_bias, state, Hk)
    for pos in (2, 4):
        y, cs_new = ops.causal_conv1d_silu(x, cw, cs, slots=3, pos=pos)
        np.testing.assert_array_equal(y, y1)
        np.testing.assert_array_equal(cs_new, cs1)
        o, st = ops.gated_delta_rule_chunked(y1, a, b, A_log, dt_bias, state, Hk, slots=3, pos=pos)
        np.testing.assert_array_equal(o, o1)
        np.testing.assert_array_equal(st, st1)


def small_fused_step(seed: int, T: int):
    """Inputs of gdn_decode_fused for T tokens of one K head and two V heads (K = 4):
    (x, a, b, A_log, dt_bias, state, conv_w, conv_state, z, norm_w)."""
    rng = np.random.default_rng(seed)
    x, a, b, A_log, dt_bias, state = gdn_inputs(rng, T, 1, 2)
    C = x.shape[1]
    return (x, a, b, A_log, dt_bias, state, bf16_normal(rng, (C, 4)), bf16_normal(rng, (C, 3)),
            bf16_normal(rng, (T, 2 * D)), bf16_normal(rng, (D,)))


def test_gdn_rows_need_more_slots_than_tokens(ops):
    x, a, b, A_log, dt_bias, state, cw, cs, z, nw = small_fused_step(6, 3)
    with pytest.raises(ValueError, match="need more than 3 slots, got 3"):
        ops.gdn_decode_fused(x, cw, cs, a, b, A_log, dt_bias, state, z, nw, 1, rows=True, slots=3)
    with pytest.raises(ValueError, match="need more than 3 slots"):
        ops.causal_conv1d_silu(x, cw, cs, rows=True, slots=2)
    with pytest.raises(ValueError, match="need more than 3 slots"):
        ops.gated_delta_rule_recurrent(x, a, b, A_log, dt_bias, state, 1, rows=True, slots=3)


def test_gdn_decode_fused_rejects_bad_shapes(ops):
    x, a, b, A_log, dt_bias, state, cw, cs, z, nw = small_fused_step(5, 2)
    C = x.shape[1]
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError, match="z"):
        ops.gdn_decode_fused(x, cw, cs, a, b, A_log, dt_bias, state, z[:1], nw, 1)
    with pytest.raises(ValueError, match="K must be 2, 3 or 4"):
        ops.gdn_decode_fused(x[:1], bf16_normal(rng, (C, 5)), bf16_normal(rng, (C, 4)), a[:1], b[:1], A_log, dt_bias,
                             state, z[:1], nw, 1)
    x, a, b, A_log, dt_bias, state, cw, cs, z, nw = small_fused_step(7, 9)
    with pytest.raises(ValueError, match="at most 8 tokens, got 9"):
        ops.gdn_decode_fused(x, cw, cs, a, b, A_log, dt_bias, state, z, nw, 1)


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200, 1000])
def test_gdn_chunked_matches_reference_and_recurrent(ops, T):
    Hk, Hv = 2, 4
    rng = np.random.default_rng(200 + T)
    qkv, a, b, A_log, dt_bias, state = gdn_inputs(rng, T, Hk, Hv)
    o, new_state = ops.gated_delta_rule_chunked(qkv, a, b, A_log, dt_bias, state, Hk)
    want_o, want_state = gdn_reference(qkv, a, b, A_log, dt_bias, state, Hk)
    assert_bf16_close(o, want_o, f"chunked o T={T}")
    assert_state_close(new_state, want_state, f"chunked state T={T}")
    o_rec, state_rec, _ = ops.gated_delta_rule_recurrent(qkv, a, b, A_log, dt_bias, state, Hk)
    assert_bf16_close(o, from_bf16(o_rec), f"chunked vs recurrent o T={T}")
    assert_state_close(new_state, state_rec, f"chunked vs recurrent state T={T}")


def test_gdn_chunked_real_head_counts_and_continuation(ops):
    """35B-A3B heads (Hk 16, Hv 32); 70 tokens then 3 tokens continue the same sequence."""
    Hk, Hv, T = 16, 32, 73
    rng = np.random.default_rng(7)
    qkv, a, b, A_log, dt_bias, state = gdn_inputs(rng, T, Hk, Hv)
    o1, s1 = ops.gated_delta_rule_chunked(qkv[:70], a[:70], b[:70], A_log, dt_bias, state, Hk)
    o2, s2 = ops.gated_delta_rule_chunked(qkv[70:], a[70:], b[70:], A_log, dt_bias, s1, Hk)
    want_o, want_state = gdn_reference(qkv, a, b, A_log, dt_bias, state, Hk)
    assert_bf16_close(np.concatenate([o1, o2]), want_o, "chunked 70+3 o")
    assert_state_close(s2, want_state, "chunked 70+3 state")


# ---- gated RMSNorm ------------------------------------------------------------------------------
@pytest.mark.parametrize("T,Hv", [(1, 32), (7, 4)])
def test_gated_rmsnorm_matches_reference(ops, T, Hv):
    rng = np.random.default_rng(T + Hv)
    o, z = bf16_normal(rng, (T, Hv, D), 3.0), bf16_normal(rng, (T, Hv * D))
    w = to_bf16(rng.uniform(0.5, 1.5, D).astype(np.float32))
    y = ops.gated_rmsnorm(o, z, w)
    want = norms.gated_rmsnorm(from_bf16(o), from_bf16(z).reshape(T, Hv, D), from_bf16(w))
    assert_bf16_close(y, want.reshape(T, Hv * D), "gated_rmsnorm")


# ---- MoE router ---------------------------------------------------------------------------------
def separated_router_inputs(rng: np.random.Generator, T: int, H: int, E: int, k: int):
    """h, w_router whose top-(k+1) logits per token are >= 1e-3 apart (exact ids are well defined)."""
    w = bf16_normal(rng, (E, H), 1.0 / np.sqrt(H))
    wf = from_bf16(w).astype(np.float64)
    h = bf16_normal(rng, (T, H))
    for t in range(T):
        while True:
            top = np.sort(from_bf16(h[t]).astype(np.float64) @ wf.T)[::-1][: k + 1]
            if np.min(-np.diff(top)) >= 1e-3:
                break
            h[t] = bf16_normal(rng, (H,))
    return h, w


@pytest.mark.parametrize("T,H,E,k", [(1, 2048, 256, 8), (3, 128, 8, 2), (8, 256, 60, 4), (9, 128, 8, 2), (300, 2048, 256, 8),
                                     (5, 2048, 512, 16), (2, 64, 2, 1)])
def test_router_topk_matches_reference(ops, T, H, E, k):
    rng = np.random.default_rng(T * 31 + E)
    h, w = separated_router_inputs(rng, T, H, E, k)
    ids, weights, logits = ops.moe_router_topk(h, w, k)
    want_logits = from_bf16(h).astype(np.float64) @ from_bf16(w).astype(np.float64).T
    np.testing.assert_allclose(logits, want_logits, rtol=0, atol=1e-5 * np.abs(want_logits).max())
    want_ids, want_w = ffn.moe_router(from_bf16(h), from_bf16(w), k)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(weights, want_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("T", [1, 20])  # GEMV, tensor-core path
def test_router_exact_ties_pick_lower_id(ops, T):
    rng = np.random.default_rng(3)
    H, E, k = 256, 16, 4
    h = bf16_normal(rng, (T, H))
    w = bf16_normal(rng, (E, H), 0.01)
    lead = to_bf16(from_bf16(h).mean(axis=0) * np.float32(0.5))  # a row every token scores high on
    w[3] = w[9] = lead
    ids, weights, _ = ops.moe_router_topk(h, w, k)
    assert (ids[:, 0] == 3).all() and (ids[:, 1] == 9).all(), ids[:, :2]
    np.testing.assert_array_equal(weights[:, 0], weights[:, 1])


def test_router_rejects_bad_k(ops):
    with pytest.raises(ValueError, match="k must be"):
        ops.moe_router_topk(np.zeros((1, 128), np.uint16), np.zeros((8, 128), np.uint16), 17)


# ---- MoE experts --------------------------------------------------------------------------------
def expert_weights(rng: np.random.Generator, E: int, H: int, I: int):
    return bf16_normal(rng, (E, 2 * I, H), 1.0 / np.sqrt(H)), bf16_normal(rng, (E, H, I), 1.0 / np.sqrt(I))


def random_routes(rng: np.random.Generator, T: int, E: int, k: int, skew: bool = False):
    """Distinct experts per token (optionally concentrated on a few experts) and weights summing to 1."""
    p = None
    if skew:
        p = np.zeros(E)
        p[: max(k + 2, E // 3)] = 1.0  # experts past E/3 get no rows; the first few get many
        p[0] = 8.0
        p /= p.sum()
    ids = np.stack([rng.choice(E, size=k, replace=False, p=p) for _ in range(T)]).astype(np.int32)
    w = rng.uniform(0.1, 1.0, (T, k)).astype(np.float32)
    return ids, w / w.sum(axis=1, keepdims=True)


def routed_reference(h, gate_up, down, ids, weights):
    """sum_s w[t,s] * SwiGLU_{ids[t,s]}(h_t) through the reference swiglu, fp32."""
    hf, gu, dn = from_bf16(h), from_bf16(gate_up), from_bf16(down)
    I = gu.shape[1] // 2
    out = np.zeros_like(hf)
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)
        out[tok] += weights[tok, slot, None] * ffn.swiglu(hf[tok], gu[e, :I], gu[e, I:], dn[e])
    return out


@pytest.mark.parametrize("T,H,I,E,k", [(1, 128, 64, 8, 2), (3, 256, 128, 8, 2), (8, 2048, 512, 16, 8)])
def test_experts_decode_match_reference(ops, T, H, I, E, k):
    rng = np.random.default_rng(T + H + E)
    gate_up, down = expert_weights(rng, E, H, I)
    h = bf16_normal(rng, (T, H))
    ids, w = random_routes(rng, T, E, k)
    act = ops.moe_experts_gate_up(h, gate_up, ids)
    assert act.shape == (T, k, I)
    hf, gu = from_bf16(h), from_bf16(gate_up)
    want_act = np.stack([
        np.stack([silu(gu[ids[t, s], :I] @ hf[t]) * (gu[ids[t, s], I:] @ hf[t]) for s in range(k)]) for t in range(T)
    ])
    assert_bf16_close(act, want_act, "gate_up act")
    out = ops.moe_experts_down(act, down, ids, w)
    dn, actf = from_bf16(down), from_bf16(act)
    want_out = np.stack([sum(w[t, s] * (dn[ids[t, s]] @ actf[t, s]) for s in range(k)) for t in range(T)])
    assert_bf16_close(out, want_out, "down out")
    assert_bf16_close(out, routed_reference(h, gate_up, down, ids, w), "decode routed vs reference")


def test_router_and_experts_match_moe_block(ops):
    """router -> gate_up -> down -> shared combine against the reference moe_block."""
    rng = np.random.default_rng(11)
    T, H, I, E, k, Is = 4, 256, 128, 8, 2, 64
    gate_up, down = expert_weights(rng, E, H, I)
    h, w_router = separated_router_inputs(rng, T, H, E, k)
    sg, su, sd = bf16_normal(rng, (Is, H), H**-0.5), bf16_normal(rng, (Is, H), H**-0.5), bf16_normal(rng, (H, Is), Is**-0.5)
    w_gate = bf16_normal(rng, (1, H), H**-0.5)
    ids, weights, _ = ops.moe_router_topk(h, w_router, k)
    routed = ops.moe_experts_down(ops.moe_experts_gate_up(h, gate_up, ids), down, ids, weights)
    shared = to_bf16(ffn.swiglu(from_bf16(h), from_bf16(sg), from_bf16(su), from_bf16(sd)))
    out = ops.moe_shared_combine(routed, shared, h, w_gate)
    want = ffn.moe_block(from_bf16(h), from_bf16(w_router), from_bf16(gate_up), from_bf16(down), from_bf16(w_gate),
                         from_bf16(sg), from_bf16(su), from_bf16(sd), k)
    assert_bf16_close(out, want, "moe block")


@pytest.mark.parametrize("T,H,I,E,k,Is", [(1, 2048, 512, 32, 8, 512), (3, 256, 128, 8, 2, 64), (8, 256, 64, 8, 2, 192)])
def test_experts_decode_with_shared_slot_match_moe_block(ops, T, H, I, E, k, Is):
    """The shared expert as the (k+1)-th slot of the decode launches gives the whole moe_block."""
    rng = np.random.default_rng(T + Is)
    gate_up, down = expert_weights(rng, E, H, I)
    h, w_router = separated_router_inputs(rng, T, H, E, k)
    sg, su, sd = bf16_normal(rng, (Is, H), H**-0.5), bf16_normal(rng, (Is, H), H**-0.5), bf16_normal(rng, (H, Is), Is**-0.5)
    w_gate = bf16_normal(rng, (1, H), H**-0.5)
    ids, weights, _ = ops.moe_router_topk(h, w_router, k)
    out, gate = ops.moe_experts_decode_shared(h, gate_up, down, ids, weights, np.concatenate([sg, su]), sd, w_gate)
    np.testing.assert_allclose(gate, 1.0 / (1.0 + np.exp(-(from_bf16(h) @ from_bf16(w_gate)[0]))), rtol=1e-5, atol=1e-6)
    want = ffn.moe_block(from_bf16(h), from_bf16(w_router), from_bf16(gate_up), from_bf16(down), from_bf16(w_gate),
                         from_bf16(sg), from_bf16(su), from_bf16(sd), k)
    assert_bf16_close(out, want, "decode moe block with shared slot")


@pytest.mark.parametrize("T,H,I,E,k,Is", [(1, 2048, 512, 256, 8, 512), (3, 256, 128, 8, 2, 64), (1, 128, 64, 512, 16, 64)])
def test_experts_decode_select_is_router_topk_then_experts(ops, T, H, I, E, k, Is):
    """The decode step's MoE launches: gate_up selects the experts from the logits exactly as the
    router's top-k does (planted exact ties -> lower id), down adds the block into the residual,
    bit for bit the separate top-k + experts + residual add."""
    rng = np.random.default_rng(H + E + k)
    gate_up, down = expert_weights(rng, E, H, I)
    h = bf16_normal(rng, (T, H))
    sgu, sdn = bf16_normal(rng, (2 * Is, H), H**-0.5), bf16_normal(rng, (H, Is), Is**-0.5)
    w_gate = bf16_normal(rng, (H,), H**-0.5)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    logits[:, 1], logits[:, 2] = -0.0, 0.0  # -0 ties +0
    logits[:, E - 1] = logits[:, 5] = logits.max(axis=1) + 1.0  # an exact tie at the top
    residual = (rng.standard_normal((T, H)) * 3).astype(np.float32)
    ids, weights, new_residual = ops.moe_experts_decode_select(h, logits, gate_up, down, sgu, sdn, w_gate, residual, k)
    order = np.argsort(-logits.astype(np.float64), axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids, order)
    assert (ids[:, 0] == 5).all() and (ids[:, 1] == E - 1).all()
    sel = np.take_along_axis(logits.astype(np.float64), order, axis=1)
    want_w = np.exp(sel - sel[:, :1]) / np.exp(sel - sel[:, :1]).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(weights, want_w, rtol=1e-5, atol=1e-7)
    block, _ = ops.moe_experts_decode_shared(h, gate_up, down, ids, weights, sgu, sdn, w_gate)
    np.testing.assert_array_equal(new_residual, residual + from_bf16(block))


@pytest.mark.parametrize("T,H,I,E,k,skew", [(300, 128, 64, 8, 2, False), (333, 256, 128, 32, 4, True), (300, 2048, 512, 16, 8, False)])
def test_experts_prefill_matches_reference_and_decode(ops, T, H, I, E, k, skew):
    rng = np.random.default_rng(T + E + k)
    gate_up, down = expert_weights(rng, E, H, I)
    h = bf16_normal(rng, (T, H))
    ids, w = random_routes(rng, T, E, k, skew)
    out = ops.moe_experts_prefill(h, gate_up, down, ids, w)
    assert_bf16_close(out, routed_reference(h, gate_up, down, ids, w), "prefill vs reference")
    dec = np.concatenate([
        ops.moe_experts_down(ops.moe_experts_gate_up(h[t : t + 8], gate_up, ids[t : t + 8]), down, ids[t : t + 8], w[t : t + 8])
        for t in range(0, T, 8)
    ])
    assert_bf16_close(out, from_bf16(dec), "prefill vs decode path")


def test_experts_decode_rejects_long_windows(ops):
    with pytest.raises(ValueError, match="T must be <= 8"):
        ops.moe_experts_gate_up(np.zeros((9, 128), np.uint16), np.zeros((2, 128, 128), np.uint16), np.zeros((9, 1), np.int32))


def test_shared_combine_matches_formula(ops):
    rng = np.random.default_rng(13)
    T, H = 5, 384
    routed, shared, h = bf16_normal(rng, (T, H)), bf16_normal(rng, (T, H)), bf16_normal(rng, (T, H))
    w_gate = bf16_normal(rng, (H,), H**-0.5)
    out = ops.moe_shared_combine(routed, shared, h, w_gate)
    gate = 1.0 / (1.0 + np.exp(-(from_bf16(h) @ from_bf16(w_gate))))
    assert_bf16_close(out, from_bf16(routed) + gate[:, None] * from_bf16(shared), "shared combine")


# ---- timings at 35B-A3B dims (printed, not asserted) ---------------------------------------------
def test_timings_35b_dims(ops):
    rng = np.random.default_rng(0)
    rep = 20
    # GDN decode step: one layer, Hk 16, Hv 32 (state 2 MiB read + written)
    qkv, a, b, A_log, dt_bias, state = gdn_inputs(rng, 1, 16, 32)
    ms = ops.gated_delta_rule_recurrent(qkv, a, b, A_log, dt_bias, state, 16, repeat=rep)[-1]
    TIMINGS.append(f"gdn recurrent T=1 (Hv 32): {ms * 1e3:.1f} us, state r+w {2 * 32 * D * D * 4 / ms / 1e6:.0f} GB/s")
    # conv decode step and prefill
    cw, cs = bf16_normal(rng, (8192, 4)), bf16_normal(rng, (8192, 3))
    ms = ops.causal_conv1d_silu(bf16_normal(rng, (1, 8192)), cw, cs, repeat=rep)[-1]
    TIMINGS.append(f"conv1d T=1 C=8192: {ms * 1e3:.1f} us")
    x1, a1, b1, A1, dt1, st1 = gdn_inputs(rng, 1, 16, 32)
    ms = ops.gdn_decode_fused(x1, cw, cs, a1, b1, A1, dt1, st1, bf16_normal(rng, (1, 32 * D)), bf16_normal(rng, (D,)), 16,
                              repeat=rep)[-1]
    TIMINGS.append(f"gdn_decode_fused T=1 (conv + rule + gated norm, Hv 32): {ms * 1e3:.1f} us")
    x8k = bf16_bits_fast(rng, (8192, 8192))
    ms = ops.causal_conv1d_silu(x8k, cw, cs, repeat=5)[-1]
    TIMINGS.append(f"conv1d T=8192 C=8192: {ms:.3f} ms ({2 * x8k.nbytes / ms / 1e6:.0f} GB/s)")
    # chunked prefill, T = 8192: 35B (Hv 32) and 27B (Hv 48), and a full-size chunked == recurrent check
    for Hv in (32, 48):
        qkv, a, b, A_log, dt_bias, state = gdn_inputs(rng, 8192, 16, Hv)
        o, s_chunk, ms = ops.gated_delta_rule_chunked(qkv, a, b, A_log, dt_bias, state, 16, repeat=5)
        TIMINGS.append(f"gdn chunked T=8192 Hv={Hv}: {ms:.3f} ms/layer = {8192 / ms * 1e3:,.0f} tok/s per layer")
        if Hv == 32:
            o_rec, s_rec, _, ms_rec = ops.gated_delta_rule_recurrent(qkv, a, b, A_log, dt_bias, state, 16, repeat=1)
            TIMINGS.append(f"gdn recurrent T=8192 Hv=32 (token loop): {ms_rec:.1f} ms")
            assert_state_close(s_chunk, s_rec, "chunked vs recurrent state at T=8192", rel=1e-3)
            assert_bf16_close(o, from_bf16(o_rec), "chunked vs recurrent o at T=8192")
    # gated norm, T = 8192
    ms = ops.gated_rmsnorm(bf16_bits_fast(rng, (8192, 32, D)), bf16_bits_fast(rng, (8192, 32 * D)),
                           bf16_normal(rng, (D,)), repeat=5)[-1]
    TIMINGS.append(f"gated_rmsnorm T=8192 Hv=32: {ms:.3f} ms")
    # MoE: 256 experts, top-8, H 2048, I 512
    E, k, H, I = 256, 8, 2048, 512
    gate_up, down = bf16_bits_fast(rng, (E, 2 * I, H)), bf16_bits_fast(rng, (E, H, I))
    w_router = bf16_normal(rng, (E, H), H**-0.5)
    for T in (1, 8192):
        ms = ops.moe_router_topk(bf16_normal(rng, (T, H)), w_router, k, repeat=rep if T == 1 else 5)[-1]
        TIMINGS.append(f"router T={T}: {ms * 1e3:.1f} us")
    for T in (1, 4):
        h = bf16_normal(rng, (T, H))
        ids, w = random_routes(rng, T, E, k)
        act, ms_gu = ops.moe_experts_gate_up(h, gate_up, ids, repeat=rep)
        _, ms_dn = ops.moe_experts_down(act, down, ids, w, repeat=rep)
        n_exp = len(np.unique(ids))
        TIMINGS.append(
            f"experts T={T} ({n_exp} experts): gate_up {ms_gu * 1e3:.1f} us ({n_exp * 2 * I * H * 2 / ms_gu / 1e6:.0f} GB/s),"
            f" down {ms_dn * 1e3:.1f} us ({n_exp * H * I * 2 / ms_dn / 1e6:.0f} GB/s)")
    h = bf16_normal(rng, (1, H))
    ids, w = random_routes(rng, 1, E, k)
    s_gu, s_dn, s_g = bf16_normal(rng, (2 * I, H), H**-0.5), bf16_normal(rng, (H, I), I**-0.5), bf16_normal(rng, (H,))
    ms = ops.moe_experts_decode_shared(h, gate_up, down, ids, w, s_gu, s_dn, s_g, repeat=rep)[-1]
    TIMINGS.append(f"experts + shared slot T=1 (2 launches): {ms * 1e3:.1f} us ({(k + 1) * 3 * I * H * 2 / ms / 1e6:.0f} GB/s)")
    for T in (2048, 8192):
        h = bf16_normal(rng, (T, H))
        ids, w = random_routes(rng, T, E, k)
        _, ms = ops.moe_experts_prefill(h, gate_up, down, ids, w, repeat=3)
        flops = 2.0 * T * k * (2 * I * H + H * I)
        TIMINGS.append(f"experts prefill T={T}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s (sort+2 GEMMs+combine)")
    print("\n" + "\n".join(["== GDN / MoE kernel timings (H200) =="] + TIMINGS))
