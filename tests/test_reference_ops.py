"""Op-level tests of the numpy reference: each op against an independent, naive formulation."""

from __future__ import annotations

import numpy as np
import pytest

from lampo.models.reference import attention, ffn, gated_deltanet, kv_int8, norms, rope


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


# ---- norms ------------------------------------------------------------------------------------
def test_rmsnorm1p_formula(rng):
    x = rng.standard_normal((3, 5, 32)).astype(np.float32)
    w = rng.standard_normal(32).astype(np.float32) * 0.3
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-6) * (1 + w)
    np.testing.assert_allclose(norms.rmsnorm1p(x, w), want, rtol=1e-5, atol=1e-6)
    # zero weight is the identity scale (zero-centred norm), not a zero output
    y = norms.rmsnorm1p(x, np.zeros(32, np.float32))
    np.testing.assert_allclose(np.mean(y.astype(np.float64) ** 2, -1), 1.0, rtol=1e-4)


def test_gated_rmsnorm_formula(rng):
    o = rng.standard_normal((4, 3, 16)).astype(np.float32)
    z = rng.standard_normal((4, 3, 16)).astype(np.float32) * 3
    w = 1 + rng.standard_normal(16).astype(np.float32) * 0.3
    o64 = o.astype(np.float64)
    want = w * o64 / np.sqrt(np.mean(o64**2, -1, keepdims=True) + 1e-6) * z * _sigmoid(z)
    np.testing.assert_allclose(norms.gated_rmsnorm(o, z, w), want, rtol=1e-5, atol=1e-6)


def test_norm_shape_errors():
    with pytest.raises(ValueError, match="weight shape"):
        norms.rmsnorm1p(np.ones((2, 8)), np.ones(4))
    with pytest.raises(ValueError, match="do not match"):
        norms.gated_rmsnorm(np.ones((2, 8)), np.ones((2, 4)), np.ones(8))


# ---- rope -------------------------------------------------------------------------------------
def test_rope_matches_complex_rotation(rng):
    T, heads, D, rot, theta = 7, 3, 32, 16, 10_000.0
    x = rng.standard_normal((T, heads, D)).astype(np.float32)
    pos = np.array([0, 1, 2, 5, 17, 300, 4095])
    y = rope.rope_partial(x, pos, rot, theta)
    half = rot // 2
    freqs = theta ** (-np.arange(half) * 2.0 / rot)
    angles = pos.astype(np.float32)[:, None, None] * freqs.astype(np.float32)  # fp32 angles, as HF
    c = (x[..., :half] + 1j * x[..., half:rot]) * np.exp(1j * angles.astype(np.float64))
    np.testing.assert_allclose(y[..., :half], c.real, atol=2e-5)
    np.testing.assert_allclose(y[..., half:rot], c.imag, atol=2e-5)
    exact = (x[..., :half] + 1j * x[..., half:rot]) * np.exp(1j * pos[:, None, None] * freqs)
    np.testing.assert_allclose(y[..., :half], exact.real, atol=1e-3)  # fp32 angle error stays small
    np.testing.assert_array_equal(y[..., rot:], x[..., rot:])  # untouched tail
    np.testing.assert_array_equal(y[0], x[0])  # position 0 is the identity


def test_rope_scores_depend_on_relative_position(rng):
    q = rng.standard_normal((1, 1, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, 64)).astype(np.float32)

    def score(pq, pk):
        rq = rope.rope_partial(q, np.array([pq]), 64, 1e7)
        return float(np.sum(rq * rope.rope_partial(k, np.array([pk]), 64, 1e7)))

    assert score(10, 3) == pytest.approx(score(107, 100), abs=1e-4)
    assert score(10, 3) != pytest.approx(score(10, 4), abs=1e-3)


def test_rope_rejects_bad_rotary_dim():
    with pytest.raises(ValueError, match="rotary_dim"):
        rope.rope_partial(np.ones((1, 1, 8), np.float32), np.array([0]), 16, 1e4)


# ---- attention --------------------------------------------------------------------------------
def test_split_q_gate_is_per_head_interleaved():
    nq, D = 3, 4
    qg = np.arange(2 * nq * 2 * D, dtype=np.float32).reshape(2, nq * 2 * D)
    q, gate = attention.split_q_gate(qg, nq, D)
    for h in range(nq):
        np.testing.assert_array_equal(q[:, h], qg[:, h * 2 * D : h * 2 * D + D])
        np.testing.assert_array_equal(gate[:, h * D : (h + 1) * D], qg[:, h * 2 * D + D : (h + 1) * 2 * D])


def _naive_attention(q, k, v, pos):
    T, nq, D = q.shape
    g = nq // k.shape[1]
    out = np.zeros((T, nq, D))
    for t in range(T):
        for h in range(nq):
            kk, vv = k[: pos[t] + 1, h // g].astype(np.float64), v[: pos[t] + 1, h // g]
            s = kk @ q[t, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vv
    return out.reshape(T, nq * D)


def test_attention_causal_gqa_matches_naive(rng, monkeypatch):
    monkeypatch.setattr(attention, "QUERY_BLOCK", 3)  # exercise the query-block loop
    T, L, nq, nkv, D = 5, 12, 4, 2, 16
    q = rng.standard_normal((T, nq, D)).astype(np.float32)
    k = rng.standard_normal((L, nkv, D)).astype(np.float32)
    v = rng.standard_normal((L, nkv, D)).astype(np.float32)
    pos = np.arange(L - T, L)
    np.testing.assert_allclose(attention.attention(q, k, v, pos), _naive_attention(q, k, v, pos), rtol=1e-5, atol=1e-5)
    # a query at position p never reads keys after p
    k2, v2 = k.copy(), v.copy()
    k2[L - 2 :], v2[L - 2 :] = 99.0, -99.0
    before = attention.attention(q[:2], k, v, pos[:2])
    np.testing.assert_array_equal(attention.attention(q[:2], k2, v2, pos[:2]), before)


def test_attention_rejects_positions_beyond_cache():
    q = np.ones((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match="cache lacks"):
        attention.attention(q, np.ones((3, 1, 8)), np.ones((3, 1, 8)), np.array([3]))


# ---- int8 KV ----------------------------------------------------------------------------------
def test_kv_int8_round_trip_bounds(rng):
    x = (rng.standard_normal((6, 2, 256)) * rng.uniform(0.01, 30, (6, 2, 1))).astype(np.float32)
    q, scale = kv_int8.quantize_int8_g64(x)
    assert q.dtype == np.int8 and scale.dtype == np.float16 and scale.shape == (6, 2, 4)
    assert np.abs(q.astype(int)).max() <= 127
    groups = x.reshape(6, 2, 4, 64)
    np.testing.assert_allclose(scale.astype(np.float32), np.abs(groups).max(-1) / 127, rtol=1e-3)
    err = np.abs(kv_int8.dequantize_int8_g64(q, scale) - x).reshape(6, 2, 4, 64)
    s32 = scale.astype(np.float32)[..., None]
    assert np.all(err <= 0.5 * s32 * (1 + 1e-6) + 1e-7)
    # the largest element of each group lands on +-127
    assert np.all(np.abs(q.reshape(6, 2, 4, 64).astype(int)).max(-1) == 127)


def test_kv_int8_zero_group_and_errors():
    x = np.zeros((1, 128), np.float32)
    x[0, 64:] = np.linspace(-1, 1, 64)
    q, scale = kv_int8.quantize_int8_g64(x)
    assert scale[0, 0] == 0 and not q[0, :64].any()
    np.testing.assert_array_equal(kv_int8.dequantize_int8_g64(q, scale)[0, :64], 0)
    with pytest.raises(ValueError, match="multiple of 64"):
        kv_int8.quantize_int8_g64(np.ones((2, 100), np.float32))


# ---- Gated DeltaNet ---------------------------------------------------------------------------
def test_causal_conv1d_silu_naive_and_state_carry(rng):
    T, C, K = 9, 6, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    s0 = rng.standard_normal((C, K - 1)).astype(np.float32)
    y, s = gated_deltanet.causal_conv1d_silu(x, w, s0)
    xin = np.concatenate([s0.T, x]).astype(np.float64)
    pre = np.stack([sum(w[:, j] * xin[t + j] for j in range(K)) for t in range(T)])
    np.testing.assert_allclose(y, pre * _sigmoid(pre), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(s, x[-(K - 1) :].T)
    y1, s1 = gated_deltanet.causal_conv1d_silu(x[:2], w, s0)  # split calls carry the window
    y2, s2 = gated_deltanet.causal_conv1d_silu(x[2:], w, s1)
    np.testing.assert_allclose(np.concatenate([y1, y2]), y, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(s2, s)


def test_gdn_gates_and_l2norm(rng):
    a = rng.standard_normal((5, 4)).astype(np.float32) * 3
    b = rng.standard_normal((5, 4)).astype(np.float32) * 3
    A_log = rng.standard_normal(4).astype(np.float32)
    dt_bias = rng.standard_normal(4).astype(np.float32)
    g, beta = gated_deltanet.gdn_gates(a, b, A_log, dt_bias)
    np.testing.assert_allclose(g, -np.exp(A_log) * np.log1p(np.exp(a + dt_bias)), rtol=1e-5)
    np.testing.assert_allclose(beta, _sigmoid(b), rtol=1e-6)
    assert np.all(g <= 0)
    x = rng.standard_normal((3, 2, 128)).astype(np.float32)
    np.testing.assert_allclose(np.linalg.norm(gated_deltanet.l2norm(x), axis=-1), 1.0, rtol=1e-5)


def _gdn_inputs(rng, T, Hk=2, Hv=4, dk=16, dv=8, state_scale=1.0):
    q = gated_deltanet.l2norm(rng.standard_normal((T, Hk, dk)).astype(np.float32)) / np.sqrt(dk)
    k = gated_deltanet.l2norm(rng.standard_normal((T, Hk, dk)).astype(np.float32))
    v = rng.standard_normal((T, Hv, dv)).astype(np.float32)
    g = -rng.uniform(0.001, 0.5, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (T, Hv)).astype(np.float32)
    s0 = (rng.standard_normal((Hv, dk, dv)) * state_scale).astype(np.float32)
    return q, k, v, g, beta, s0


def test_recurrent_rule_matches_naive_loop(rng):
    q, k, v, g, beta, s0 = _gdn_inputs(rng, 6)
    o, s = gated_deltanet.gated_delta_rule_recurrent(q, k, v, g, beta, s0)
    Hv, r = 4, 2
    S = s0.astype(np.float64).copy()
    for t in range(6):
        for j in range(Hv):
            kt, qt = k[t, j // r], q[t, j // r]  # V head j reads QK head j // r
            S[j] *= np.exp(g[t, j])
            S[j] += np.outer(kt, beta[t, j] * (v[t, j] - S[j].T @ kt))
            np.testing.assert_allclose(o[t, j], S[j].T @ qt, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s, S, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T, chunk", [(1, 64), (5, 64), (64, 64), (100, 64), (150, 64), (37, 16)])
def test_chunked_rule_equals_recurrent(rng, T, chunk):
    q, k, v, g, beta, s0 = _gdn_inputs(rng, T)
    o_ser, s_ser = gated_deltanet.gated_delta_rule_recurrent(q, k, v, g, beta, s0)
    o_chk, s_chk = gated_deltanet.gated_delta_rule_chunked(q, k, v, g, beta, s0, chunk=chunk)
    np.testing.assert_allclose(o_chk, o_ser, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(s_chk, s_ser, rtol=1e-4, atol=2e-5)


def test_chunked_rule_real_head_dims_from_zero_and_split(rng):
    """dk = dv = 128 as in the real models; two chunked calls == one call (state carried)."""
    q, k, v, g, beta, _ = _gdn_inputs(rng, 90, Hk=1, Hv=2, dk=128, dv=128)
    zero = np.zeros((2, 128, 128), np.float32)
    o, s = gated_deltanet.gated_delta_rule_chunked(q, k, v, g, beta, zero)
    o_ser, s_ser = gated_deltanet.gated_delta_rule_recurrent(q, k, v, g, beta, zero)
    np.testing.assert_allclose(o, o_ser, rtol=1e-4, atol=2e-5)
    o1, s1 = gated_deltanet.gated_delta_rule_chunked(q[:70], k[:70], v[:70], g[:70], beta[:70], zero)
    o2, s2 = gated_deltanet.gated_delta_rule_chunked(q[70:], k[70:], v[70:], g[70:], beta[70:], s1)
    np.testing.assert_allclose(np.concatenate([o1, o2]), o, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(s2, s, rtol=1e-4, atol=2e-5)


def test_delta_rule_shape_errors(rng):
    q, k, v, g, beta, s0 = _gdn_inputs(rng, 3)
    with pytest.raises(ValueError, match="bad shapes"):
        gated_deltanet.gated_delta_rule_chunked(q, k, v, g, beta, s0[:, :, :4])


# ---- FFN --------------------------------------------------------------------------------------
def test_swiglu(rng):
    h = rng.standard_normal((3, 8)).astype(np.float32)
    wg, wu, wd = (rng.standard_normal(s).astype(np.float32) for s in [(5, 8), (5, 8), (8, 5)])
    gate = h.astype(np.float64) @ wg.T
    want = (gate * _sigmoid(gate) * (h @ wu.T)) @ wd.T
    np.testing.assert_allclose(ffn.swiglu(h, wg, wu, wd), want, rtol=1e-5, atol=1e-5)


def test_moe_router_softmax_topk_ties_renormalise():
    h = np.eye(4, dtype=np.float32)[:2]  # token t reads column t of the router
    w = np.zeros((6, 4), np.float32)
    w[:, 0] = [1, 2, 2, 0, 1, 0]
    w[:, 1] = [0, 0, 1, 3, 3, 0]
    ids, weights = ffn.moe_router(h, w, 3)
    # token 0: experts 1 and 2 tie, then 0 and 4 tie -> lower ids first
    np.testing.assert_array_equal(ids[0], [1, 2, 0])
    e = np.exp([2.0, 2.0, 1.0])
    np.testing.assert_allclose(weights[0], e / e.sum(), rtol=1e-6)
    np.testing.assert_array_equal(ids[1], [3, 4, 2])
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)


def test_moe_block_matches_per_token_loop(rng):
    T, H, E, inter, k, shared = 5, 8, 6, 4, 2, 3
    h = rng.standard_normal((T, H)).astype(np.float32)
    router = rng.standard_normal((E, H)).astype(np.float32)
    gate_up = rng.standard_normal((E, 2 * inter, H)).astype(np.float32)
    down = rng.standard_normal((E, H, inter)).astype(np.float32)
    sg = rng.standard_normal((1, H)).astype(np.float32)
    sgp, sup = rng.standard_normal((shared, H)).astype(np.float32), rng.standard_normal((shared, H)).astype(np.float32)
    sdp = rng.standard_normal((H, shared)).astype(np.float32)
    out = ffn.moe_block(h, router, gate_up, down, sg, sgp, sup, sdp, k)

    def mlp(x, wg, wu, wd):
        a = x @ wg.T
        return (a * _sigmoid(a) * (x @ wu.T)) @ wd.T

    for t in range(T):
        logits = router.astype(np.float64) @ h[t]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        top = np.argsort(-p, kind="stable")[:k]
        want = sum(p[e] / p[top].sum() * mlp(h[t], gate_up[e, :inter], gate_up[e, inter:], down[e]) for e in top)
        want = want + _sigmoid(sg[0] @ h[t]) * mlp(h[t], sgp, sup, sdp)
        np.testing.assert_allclose(out[t], want, rtol=1e-4, atol=1e-4)
