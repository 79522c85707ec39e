"""Core CUDA kernels (lampo._native_ops) against the numpy reference (lampo.models.reference).

Tolerances: bf16 outputs |got - ref| <= 1e-2 * (|ref| + rms(ref)) (bf16 rounding is 2^-9);
fp32 outputs of the matrix kernels 1e-5 * (|ref| + rms(ref)); gathers, residual adds and the INT8
cache are exact (quantized values within 1). Every output buffer is poisoned (NaN / -1) before the
kernel runs, so rows a kernel forgets to write fail. test_zz_timings prints bandwidth / throughput
figures (never asserted).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from lampo.models import sampling as ref_sampling
from lampo.models.bf16 import from_bf16, to_bf16
from lampo.models.reference import activations, attention, kv_int8, norms, rope
from lampo.models.sampling_params import SamplingParams

D = 256
ROTARY = 64
THETA = 1.0e7
V_FULL = 248_320
V_REAL = 248_077


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def bf16_randn(rng, shape, scale=1.0) -> np.ndarray:
    return to_bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(scale))


def check_bf16(got_bits: np.ndarray, ref: np.ndarray, tol: float = 1e-2, what: str = "") -> None:
    got = from_bf16(got_bits)
    ref = np.asarray(ref, dtype=np.float32)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.isfinite(got).all(), f"{what}: non-finite output (unwritten rows?)"
    check_close(got, ref, tol, what)


def check_close(got: np.ndarray, ref: np.ndarray, tol: float, what: str = "") -> None:
    ref64 = ref.astype(np.float64)
    rms = np.sqrt(np.mean(ref64**2)) if ref.size else 0.0
    err = np.abs(got.astype(np.float64) - ref64)
    bound = tol * (np.abs(ref64) + rms)
    bad = err > bound
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} outside tol {tol}; worst err {err.max():.3g} "
        f"(rms ref {rms:.3g}) at {np.unravel_index(np.argmax(err - bound), err.shape)}"
    )


# ---- embedding, norms, activations ----------------------------------------------------------------


def test_embedding_gather(ops):
    rng = rng_for("emb")
    table = bf16_randn(rng, (1000, 256))
    ids = np.array([0, 999, 5, 5, 123, 456, 789, 1, 2], dtype=np.int32)
    out = ops.embedding_gather(table, ids)
    np.testing.assert_array_equal(out, from_bf16(table)[ids])


@pytest.mark.parametrize("rows,n", [(1, 2048), (3, 5120), (9, 128)])
def test_rmsnorm(ops, rows, n):
    rng = rng_for("rms", rows, n)
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    w = bf16_randn(rng, n, 0.2)
    check_bf16(ops.rmsnorm(x, w, 1e-6), norms.rmsnorm1p(x, from_bf16(w)), what="rmsnorm")


@pytest.mark.parametrize("rows,n", [(1, 2048), (8, 5120)])
def test_add_rmsnorm_and_residual_add(ops, rows, n):
    rng = rng_for("addrms", rows, n)
    residual = (rng.standard_normal((rows, n)) * 2).astype(np.float32)
    delta = bf16_randn(rng, (rows, n))
    w = bf16_randn(rng, n, 0.2)
    summed = residual + from_bf16(delta)
    new_residual, y = ops.add_rmsnorm(residual, delta, w, 1e-6)
    np.testing.assert_array_equal(new_residual, summed)
    check_bf16(y, norms.rmsnorm1p(summed, from_bf16(w)), what="add_rmsnorm")
    np.testing.assert_array_equal(ops.residual_add(residual, delta), summed)
    # set: whatever the residual held (NaN here), the bits of add_rmsnorm on a zeroed residual
    zeros, nans = np.zeros_like(residual), np.full_like(residual, np.nan)
    want = ops.add_rmsnorm(zeros, delta, w, 1e-6)
    for got, expected in zip(ops.add_rmsnorm(nans, delta, w, 1e-6, set=True), want, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("T,I", [(1, 512), (9, 1024), (3, 8)])
def test_silu_mul(ops, T, I):
    rng = rng_for("silu", T, I)
    gu = bf16_randn(rng, (T, 2 * I), 3.0)
    g, u = from_bf16(gu[:, :I]), from_bf16(gu[:, I:])
    check_bf16(ops.silu_mul(gu), activations.silu(g) * u, what="silu_mul")


def test_sigmoid_gate_mul(ops):
    rng = rng_for("sgm")
    x, gate = bf16_randn(rng, (5, 4096)), bf16_randn(rng, (5, 4096), 4.0)
    check_bf16(ops.sigmoid_gate_mul(x, gate), from_bf16(x) * activations.sigmoid(from_bf16(gate)), what="gate")


# ---- attention prep and INT8 cache ------------------------------------------------------------------


@pytest.mark.parametrize("T,nq,nkv,pos0", [(1, 16, 2, 0), (5, 24, 4, 123_456), (3, 16, 2, 262_000)])
def test_attn_prep(ops, T, nq, nkv, pos0):
    rng = rng_for("prep", T, nq, pos0)
    qg = bf16_randn(rng, (T, nq * 2 * D), 2.0)
    k_raw = bf16_randn(rng, (T, nkv * D), 2.0)
    qw, kw = bf16_randn(rng, D, 0.3), bf16_randn(rng, D, 0.3)
    q, gate, k = ops.attn_prep(qg, k_raw, qw, kw, pos0, nq, nkv, ROTARY, THETA, 1e-6)
    positions = pos0 + np.arange(T)
    q_ref, gate_ref = attention.split_q_gate(from_bf16(qg), nq, D)
    q_ref = rope.rope_partial(norms.rmsnorm1p(q_ref, from_bf16(qw)), positions, ROTARY, THETA)
    k_ref = rope.rope_partial(norms.rmsnorm1p(from_bf16(k_raw).reshape(T, nkv, D), from_bf16(kw)), positions,
                              ROTARY, THETA)
    check_bf16(q, q_ref, what="q")
    check_bf16(k, k_ref, what="k")
    np.testing.assert_array_equal(gate, to_bf16(gate_ref))


@pytest.mark.parametrize("T,nkv,pos0", [(1, 2, 5), (7, 4, 60), (64, 2, 0)])
def test_attn_prep_appends_int8(ops, T, nkv, pos0):
    """With a KV target, attn_prep quantizes its bf16 k rows and the v rows into the INT8 cache
    (kv_int8.quantize_int8_g64) at rows pos0.. and leaves every other row alone."""
    rng = rng_for("kv", T, nkv, pos0)
    context_max, nq = 128, 2 * nkv
    qg = bf16_randn(rng, (T, nq * 2 * D), 2.0)
    k_raw = (rng.standard_normal((T, nkv * D)) * 3).astype(np.float32)
    k_raw[0, 64:128] = 0.0  # head 0: a zero group past the rotary dims -> scale 0, q 0
    v = (rng.standard_normal((T, nkv, D)) * 3).astype(np.float32)
    v[-1, -1, :64] = 0.0
    v[-1, -1, 5] = 40.0  # one dominant value in a group
    vb = to_bf16(v)
    qw, kw = bf16_randn(rng, D, 0.3), bf16_randn(rng, D, 0.3)
    caches = [rng.integers(-127, 128, (nkv, context_max, D), dtype=np.int8) for _ in range(2)]
    scales = [rng.uniform(0.01, 0.02, (nkv, context_max, D // 64)).astype(np.float16) for _ in range(2)]
    q, gate, k, kc, vc, ks, vs = ops.attn_prep(qg, to_bf16(k_raw), qw, kw, pos0, nq, nkv, ROTARY, THETA, 1e-6,
                                               kv=(vb, caches[0], caches[1], scales[0], scales[1]))
    q_alone, gate_alone, k_alone = ops.attn_prep(qg, to_bf16(k_raw), qw, kw, pos0, nq, nkv, ROTARY, THETA, 1e-6)
    for got, alone in ((q, q_alone), (gate, gate_alone), (k, k_alone)):
        np.testing.assert_array_equal(got, alone)
    rows = slice(pos0, pos0 + T)
    for got_q, got_s, src, old_q, old_s in ((kc, ks, k, caches[0], scales[0]), (vc, vs, vb, caches[1], scales[1])):
        ref_q, ref_s = kv_int8.quantize_int8_g64(from_bf16(src).transpose(1, 0, 2))
        np.testing.assert_array_equal(got_s[:, rows], ref_s)
        assert np.abs(got_q[:, rows].astype(np.int32) - ref_q.astype(np.int32)).max() <= 1
        keep = np.ones(context_max, bool)
        keep[rows] = False
        np.testing.assert_array_equal(got_q[:, keep], old_q[:, keep])
        np.testing.assert_array_equal(got_s[:, keep], old_s[:, keep])
    assert (ks[0, pos0, 1] == 0) and (kc[0, pos0, 64:128] == 0).all()


# ---- attention over the INT8 cache ------------------------------------------------------------------


def make_cache(rng, nkv, context_max, live):
    """Random INT8 cache; rows >= live hold poison scales (inf / NaN) that must never be read."""
    kq = rng.integers(-127, 128, (nkv, context_max, D), dtype=np.int8)
    vq = rng.integers(-127, 128, (nkv, context_max, D), dtype=np.int8)
    ks = rng.uniform(0.004, 0.02, (nkv, context_max, D // 64)).astype(np.float16)
    vs = rng.uniform(0.004, 0.02, (nkv, context_max, D // 64)).astype(np.float16)
    ks[:, live:] = np.float16(np.inf)
    vs[:, live:] = np.float16(np.nan)
    return kq, vq, ks, vs


def attention_ref(q_bits, gate_bits, cache, live, positions):
    kq, vq, ks, vs = cache
    k = kv_int8.dequantize_int8_g64(kq[:, :live], ks[:, :live]).transpose(1, 0, 2)
    v = kv_int8.dequantize_int8_g64(vq[:, :live], vs[:, :live]).transpose(1, 0, 2)
    o = attention.attention(from_bf16(q_bits), k, v, positions)
    return o * activations.sigmoid(from_bf16(gate_bits))


def run_decode(ops, monkeypatch, nq, nkv, Tq, live, context_max, seed_key):
    """Every form the call has: a window whose rows fill two to four M-tiles runs the tiled forms
    (LAMPO_ATTN_WINDOW_TILED=64: 64-key tiles where the GPU's blocks hold them; =32: 32-key tiles)
    and the shared core's (=0) beside the engine's choice."""
    rng = rng_for("dec", *seed_key)
    cache = make_cache(rng, nkv, context_max, live)
    q = bf16_randn(rng, (Tq, nq, D), 2.0)
    gate = bf16_randn(rng, (Tq, nq * D), 2.0)
    pos0 = live - Tq
    want = attention_ref(q, gate, cache, live, pos0 + np.arange(Tq))
    forms = ["", "64", "32", "0"] if Tq * (nq // nkv) > 16 else [""]
    for window_tiled in forms:
        monkeypatch.setenv("LAMPO_ATTN_WINDOW_TILED", window_tiled)
        out = ops.attn_decode_int8(q, gate, *cache, pos0)
        check_bf16(out, want, what=f"decode L={live} Tq={Tq} window_tiled={window_tiled}")


@pytest.mark.parametrize(
    "nq,nkv,Tq,live,context_max",
    [
        (16, 2, 1, 1, 64),        # a single key
        (16, 2, 1, 100, 4096),
        (24, 4, 1, 777, 1024),
        (16, 2, 3, 500, 512),     # 24 rows: 2 M-tiles
        (24, 4, 8, 300, 320),     # 48 rows: 3 M-tiles
        (16, 2, 8, 1000, 1024),   # 64 rows: 4 M-tiles
        (16, 2, 5, 3000, 3072),   # 40 rows: 3 M-tiles, splits of a few tiles
        (24, 4, 4, 70_000, 70_016),  # the 27B's 4-token window: 24 rows, splits of many tiles
        (16, 2, 4, 8448, 8512),   # 2 KV heads, context_max >= 132 * 64: 132 splits (H200) of 64 keys exactly
        (16, 2, 1, 8449, 8512),   # one past: chunks of 128
        (24, 4, 1, 4224, 4288),   # 4 KV heads: 66 splits (H200) of 64 keys exactly
        (24, 4, 1, 4225, 4288),   # one past: chunks of 128
        (24, 4, 2, 20_000, 20_032),
    ],
)
def test_attn_decode_int8(ops, monkeypatch, nq, nkv, Tq, live, context_max):
    run_decode(ops, monkeypatch, nq, nkv, Tq, live, context_max, (nq, nkv, Tq, live))


@pytest.mark.slow
@pytest.mark.parametrize("live,Tq", [(65_536, 1), (262_144, 1), (262_144, 4)])
def test_attn_decode_int8_long(ops, monkeypatch, live, Tq):
    run_decode(ops, monkeypatch, 16, 2, Tq, live, live, ("long", live, Tq))


@pytest.mark.parametrize("tiled", ["1", "4", "0"])  # the widest tiled form that fits / 4 warps / the shared core
@pytest.mark.parametrize(
    "nq,nkv,T,pos0",
    [
        (16, 2, 1, 0),
        (16, 2, 9, 0),
        (24, 4, 100, 77),      # 21 tokens a tiled block (126 rows), its last block partial
        (16, 2, 300, 1000),
        (24, 4, 33, 4000),
        (16, 2, 1024, 0),
        (24, 4, 500, 1919),    # tiles past the first fully visible, the diagonal cut inside one
        (4, 4, 130, 60),       # group 1: 128 tokens a tiled block
        (64, 1, 40, 5),        # group 64: 2 tokens a tiled block, one a core block
    ],
)
def test_attn_prefill_int8(ops, monkeypatch, tiled, nq, nkv, T, pos0):
    monkeypatch.setenv("LAMPO_ATTN_PREFILL_TILED", tiled)
    rng = rng_for("pre", nq, nkv, T, pos0)
    live = pos0 + T
    context_max = live + 64
    cache = make_cache(rng, nkv, context_max, live)
    q = bf16_randn(rng, (T, nq, D), 2.0)
    gate = bf16_randn(rng, (T, nq * D), 2.0)
    out = ops.attn_prefill_int8(q, gate, *cache, pos0)
    check_bf16(out, attention_ref(q, gate, cache, live, pos0 + np.arange(T)), what=f"prefill T={T} pos0={pos0}")


# ---- matrix products -----------------------------------------------------------------------------


def matmul_ref(w_bits, x_bits):
    return (from_bf16(x_bits).astype(np.float64) @ from_bf16(w_bits).astype(np.float64).T).astype(np.float32)


def check_matmul(ops_fn, T, out, inn, seed):
    rng = rng_for("mm", seed, T, out, inn)
    w, x = bf16_randn(rng, (out, inn)), bf16_randn(rng, (T, inn))
    ref = matmul_ref(w, x)
    check_bf16(ops_fn(w, x, False), ref, what=f"bf16 out T={T} [{out},{inn}]")
    got32 = ops_fn(w, x, True)
    assert np.isfinite(got32).all()
    check_close(got32, ref, 1e-5, f"fp32 out T={T} [{out},{inn}]")


@pytest.mark.parametrize("T", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("out,inn", [(1001, 2048), (64, 128), (2048, 5120), (8192, 2048), (12352, 2048)])
def test_gemv(ops, T, out, inn):
    check_matmul(ops.gemv, T, out, inn, "gemv")


@pytest.mark.parametrize("out,inn,f32", [(12352, 2048, False), (1001, 2048, False), (256, 2048, True), (64, 5120, False)])
def test_gemv_normed_is_rmsnorm_then_gemv(ops, out, inn, f32):
    """The decode step's input projection builds the normed row itself: the same bits as the
    rmsnorm launch followed by the plain GEMV, and the normed row it writes out equals rmsnorm's."""
    rng = rng_for("gemv-normed", out, inn)
    w, norm_w = bf16_randn(rng, (out, inn)), bf16_randn(rng, inn, 0.2)
    residual = (rng.standard_normal((1, inn)) * 3).astype(np.float32)
    y, normed = ops.gemv_normed(w, residual, norm_w, 1e-6, f32)
    want_normed = ops.rmsnorm(residual, norm_w, 1e-6)
    np.testing.assert_array_equal(normed, want_normed)
    np.testing.assert_array_equal(y, ops.gemv(w, want_normed, f32))
    ref = matmul_ref(w, to_bf16(norms.rmsnorm1p(residual, from_bf16(norm_w))))
    if f32:
        check_close(y, ref, 1e-5, "gemv_normed f32")
    else:
        check_bf16(y, ref, what="gemv_normed")


@pytest.mark.parametrize("out,inn", [(2048, 4096), (5120, 6144), (1001, 512)])
def test_gemv_add_residual_is_gemv_then_add(ops, out, inn):
    rng = rng_for("gemv-add", out, inn)
    w, x = bf16_randn(rng, (out, inn)), bf16_randn(rng, (1, inn))
    residual = (rng.standard_normal((1, out)) * 3).astype(np.float32)
    got = ops.gemv_add_residual(w, x, residual)
    np.testing.assert_array_equal(got, residual + from_bf16(ops.gemv(w, x, False)))
    got_set = ops.gemv_add_residual(w, x, np.full_like(residual, np.nan), set=True)
    np.testing.assert_array_equal(got_set, ops.gemv_add_residual(w, x, np.zeros_like(residual)))


@pytest.mark.parametrize(
    "T,out,inn",
    [
        (1, 64, 64), (9, 136, 200), (100, 520, 2048), (300, 1024, 512), (129, 256, 40), (1000, 2048, 2048),
        (8192, 256, 512),  # many token tiles
        (2050, 4104, 264),  # >= one wave of 128 x 256 tiles (the wide kernel), tails in every dim
    ],
)
@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
def test_gemm(ops, monkeypatch, T, out, inn, portable):
    # default: the sm_90a wgmma kernel where it is compiled in and the GPU is 9.0, else mma.sync;
    # LAMPO_GEMM_PORTABLE=1 forces the mma.sync kernel so both paths stay verified on an H200.
    if portable:
        monkeypatch.setenv("LAMPO_GEMM_PORTABLE", "1")
    check_matmul(ops.gemm, T, out, inn, "gemm")


@pytest.mark.parametrize("T", [8, 9, 64])
def test_linear_dispatch(ops, T):
    check_matmul(ops.linear, T, 512, 1024, "linear")


# ---- sampling ------------------------------------------------------------------------------------


def draw(ops, logits, params: SamplingParams, *, seen=None, step=0, draws=1, seed=None, v_real=None):
    V = len(logits)
    seen = np.zeros(V, np.uint8) if seen is None else seen
    return ops.sample_token(logits.astype(np.float32), V if v_real is None else v_real, params.temperature,
                            params.top_k, params.top_p, params.min_p, params.presence_penalty,
                            params.seed if seed is None else seed, seen, step, draws)


def full_vocab_logits(rng):
    logits = rng.standard_normal(V_FULL).astype(np.float32)
    logits[248_100] = 100.0  # padding row: must be masked
    logits[5000] = logits[100_000] = 50.0  # tie -> lower id
    logits[7000] = 49.0
    return logits


def test_sample_greedy_mask_ties_penalty(ops):
    logits = full_vocab_logits(rng_for("greedy"))
    greedy = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, seed=0)
    ids, seen, step = draw(ops, logits, greedy, v_real=V_REAL, step=41)
    ref = ref_sampling.sample(logits, greedy, np.random.default_rng(0))
    assert ids[0] == ref == 5000 and step == 42 and seen[5000] == 1 and seen.sum() == 1
    penalised = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, presence_penalty=2.0, seed=0)
    seen0 = np.zeros(V_FULL, np.uint8)
    seen0[[5000, 100_000]] = 1
    ids, _, _ = draw(ops, logits, penalised, seen=seen0, v_real=V_REAL)
    assert ids[0] == ref_sampling.sample(logits, penalised, np.random.default_rng(0), [5000, 100_000]) == 7000


def test_sample_greedy_one_launch(ops):
    """The one-launch greedy kernel (blocks of id ranges, a last-block ticket): a tie at the max
    across distant ids -> the lowest, padding (from its first id) masked, the penalty moving the
    argmax, and back-to-back draws: the ticket and the running max reset, each draw sees the
    seen[] the previous one wrote, and a repeat token is penalised once."""
    logits = rng_for("greedy-one-launch").standard_normal(V_FULL).astype(np.float32)
    logits[[V_REAL, 248_300]] = 100.0  # padding
    logits[100] = 41.0  # seen already: 39 after the penalty
    logits[[200_003, 63_000, 5000]] = 40.0
    logits[150_000] = 39.5
    logits[7] = 38.5
    params = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, presence_penalty=2.0, seed=0)
    seen0 = np.zeros(V_FULL, np.uint8)
    seen0[100] = 1
    ids, seen, step = draw(ops, logits, params, seen=seen0, step=7, draws=6, v_real=V_REAL)
    seen_ids = [100]
    for _ in range(6):
        seen_ids.append(ref_sampling.sample(logits, params, np.random.default_rng(0), seen_ids))
    assert ref_sampling.sample(logits, params, np.random.default_rng(0)) == 100
    assert ids.tolist() == seen_ids[1:] == [5000, 63_000, 200_003, 150_000, 100, 100]
    assert step == 13 and np.flatnonzero(seen).tolist() == [100, 5000, 63_000, 150_000, 200_003]

    greedy = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, seed=0)
    last = logits.copy()
    last[V_REAL - 1] = 60.0  # the id after the last whole float4 of the real vocabulary
    signed_zeros = np.full(V_FULL, -1.0, np.float32)
    signed_zeros[[20_000, 130_000]] = [-0.0, 0.0]  # -0 ties +0 -> the lower id
    cases = [(last, V_REAL, V_REAL - 1), (signed_zeros, V_REAL, 20_000),
             (np.full(V_FULL, -np.inf, np.float32), V_REAL, 0), (np.arange(1001, dtype=np.float32), 1001, 1000)]
    for x, v_real, want in cases:
        ids, seen, step = draw(ops, x, greedy, v_real=v_real, draws=3)
        assert ids.tolist() == [want] * 3 and step == 3 and np.flatnonzero(seen).tolist() == [want], want


def test_sample_filters_reduce_to_greedy(ops):
    logits = full_vocab_logits(rng_for("filters"))
    for params in (SamplingParams(temperature=1.0, top_k=1, top_p=1.0), SamplingParams(temperature=1.0, top_k=0, top_p=1e-6),
                   SamplingParams(temperature=0.7, top_k=50, top_p=1e-6)):
        ids, _, _ = draw(ops, logits, params, draws=4, seed=3, v_real=V_REAL)
        assert (ids == 5000).all(), params


def test_sample_seeded_determinism(ops):
    logits = (rng_for("det").standard_normal(1000) * 0.5).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    a, _, step = draw(ops, logits, params, draws=64, seed=11)
    b, _, _ = draw(ops, logits, params, draws=64, seed=11)
    c, _, _ = draw(ops, logits, params, draws=64, seed=12)
    np.testing.assert_array_equal(a, b)
    assert step == 64 and (a != c).any() and len(set(a.tolist())) > 20


def sample_histogram(ops, logits, params, n, seed):
    ids, _, _ = draw(ops, logits, params, draws=n, seed=seed)
    return np.bincount(ids, minlength=len(logits)) / n


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02),
        SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.1),
        SamplingParams(temperature=1.0, top_k=7, top_p=1.0),
    ],
)
def test_sample_distribution(ops, params):
    logits = (rng_for("dist", params.top_k).standard_normal(64) * 2).astype(np.float32)
    expected = ref_sampling.filtered_probs(logits, params)
    n = 20_000
    got = sample_histogram(ops, logits, params, n, seed=5)
    assert got[expected == 0].sum() == 0, "drew a token the filters remove"
    sigma = np.sqrt(expected * (1 - expected) / n) + 1e-9
    assert (np.abs(got - expected) <= 5 * sigma + 1e-4).all(), np.c_[expected, got][expected > 0]


DRAFT_PARAMS = SamplingParams(temperature=0.8, top_k=12, top_p=0.95, min_p=0.0)


def test_sample_draft_draws_from_the_q_it_writes(ops):
    """sample_draft: q is the filtered distribution (ids ascending), its draws follow it, and its
    RNG stream is not sample_token's."""
    logits = (rng_for("draft").standard_normal(64) * 2).astype(np.float32)
    p = DRAFT_PARAMS
    expected = ref_sampling.filtered_probs(logits, p)
    n = 20_000
    ids, q_ids, q_probs, step = ops.sample_draft(logits, 64, p.temperature, p.top_k, p.top_p, p.min_p, 5, 0, n)
    assert step == n
    np.testing.assert_array_equal(q_ids, np.flatnonzero(expected))
    np.testing.assert_allclose(q_probs, expected[q_ids], rtol=1e-5, atol=1e-6)
    got = np.bincount(ids, minlength=64) / n
    sigma = np.sqrt(expected * (1 - expected) / n) + 1e-9
    assert (np.abs(got - expected) <= 5 * sigma + 1e-4).all(), np.c_[expected, got][expected > 0]
    plain, _, _ = draw(ops, logits, p, draws=200, seed=5)
    assert (plain != ids[:200]).any()


@pytest.mark.parametrize("shift", [0.0, 1.0, 3.0])
def test_sample_verify_row_keeps_the_target_distribution(ops, shift):
    """Drafts drawn from q (another row's distribution, `shift` apart) and judged by
    sample_verify_row: the tokens follow p exactly, a draft is kept (token == draft) with
    probability sum(min(p, q)), and a rejected draft is never the token."""
    rng = rng_for("verify", shift)
    logits = (rng.standard_normal(64) * 2).astype(np.float32)
    prm = DRAFT_PARAMS
    p = ref_sampling.filtered_probs(logits, prm)
    q = ref_sampling.filtered_probs(logits + shift * rng.standard_normal(64).astype(np.float32), prm)
    n = 20_000
    drafts = rng.choice(64, size=n, p=q).astype(np.int32)
    q_ids = np.flatnonzero(q).astype(np.int32)
    ids, step = ops.sample_verify_row(logits, 64, prm.temperature, prm.top_k, prm.top_p, prm.min_p, 11, drafts,
                                      q_ids, q[q_ids].astype(np.float32), 0)
    assert step == n
    got = np.bincount(ids, minlength=64) / n
    sigma = np.sqrt(p * (1 - p) / n) + 1e-9
    assert (np.abs(got - p) <= 5 * sigma + 1e-4).all(), np.c_[p, got][p > 0]
    kept = np.mean(ids == drafts)
    want = np.minimum(p, q).sum()
    assert abs(kept - want) <= 5 * np.sqrt(want * (1 - want) / n) + 1e-3, (kept, want)


def test_sample_topk_ties_at_cut(ops):
    logits = np.round(rng_for("ties").standard_normal(200)).astype(np.float32)  # many equal values
    params = SamplingParams(temperature=1.0, top_k=9, top_p=1.0)
    expected = ref_sampling.filtered_probs(logits, params)
    got = sample_histogram(ops, logits, params, 4000, seed=9)
    np.testing.assert_array_equal(got > 0, expected > 0)


def test_sample_topk_off_uses_top_candidates(ops):
    rng = rng_for("cap")
    logits = rng.standard_normal(V_FULL).astype(np.float32)
    hot = rng.choice(V_REAL, 50, replace=False)
    logits[hot] += 12.0
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0)
    expected = ref_sampling.filtered_probs(logits, params)
    ids, _, _ = draw(ops, logits, params, draws=500, seed=1, v_real=V_REAL)
    assert (expected[ids] > 0).all()


def test_argmax_rows(ops):
    rng = rng_for("argmax")
    logits = rng.standard_normal((3, V_FULL)).astype(np.float32)
    logits[1, 248_200] = 99.0  # padding
    logits[1, [10, 20]] = 50.0
    logits[2] = 1.0
    np.testing.assert_array_equal(ops.argmax_rows(logits, V_REAL), [np.argmax(logits[0, :V_REAL]), 10, 0])


# ---- timings (printed, not asserted) ------------------------------------------------------------------


def test_zz_timings(ops, monkeypatch):
    lines, errors = [], []

    def bench(label, fn, fmt):
        try:
            lines.append(f"{label}: {fmt(fn())}")
        except Exception as e:  # keep the other figures; the failure is reported below
            errors.append(f"{label}: {e}")

    for out, inn, T in ((8192, 2048, 1), (8192, 2048, 8), (248_320, 2048, 1), (34_816, 5120, 1), (5120, 17_408, 4)):
        bench(f"GEMV  [{out},{inn}] T={T}", lambda: ops.bench_linear(out, inn, T, 50, out == 248_320),
              lambda r: f"{r['us']:8.1f} us  {r['GBps']:7.0f} GB/s")
    for path in ("default", "portable"):
        monkeypatch.setenv("LAMPO_GEMM_PORTABLE", "1" if path == "portable" else "0")
        for T, out, inn in ((8192, 8192, 2048), (8192, 34_816, 5120), (8192, 5120, 17_408), (1024, 2048, 4096),
                            (4096, 34_816, 5120)):
            bench(f"GEMM  {T} x [{out},{inn}] {path}", lambda: ops.bench_linear(out, inn, T, 10),
                  lambda r: f"{r['us']:9.1f} us  {r['TFLOPs']:6.1f} TFLOP/s")
    for nq, nkv, L, Tq in ((16, 2, 65_536, 1), (16, 2, 262_144, 1), (24, 4, 262_144, 1), (16, 2, 8192, 4),
                           (24, 4, 8192, 4), (16, 2, 262_144, 4), (24, 4, 262_144, 4), (16, 2, 8192, 5),
                           (16, 2, 262_144, 5), (16, 2, 8192, 8), (16, 2, 262_144, 8), (16, 2, 4096, 1)):
        for window_tiled in [""] if Tq == 1 else ["64", "32", "0"]:
            monkeypatch.setenv("LAMPO_ATTN_WINDOW_TILED", window_tiled)
            form = {"": "", "64": " tiled64", "32": " tiled32", "0": " core"}[window_tiled]
            bench(f"decode attn nq={nq} nkv={nkv} L={L} Tq={Tq}{form}",
                  lambda: ops.bench_attn_decode(nq, nkv, L, Tq, 50),
                  lambda r: f"{r['us']:7.1f} us  {r['GBps']:6.0f} GB/s")
    for tiled, form in (("1", "tiled "), ("4", "tiled4"), ("0", "core  ")):
        monkeypatch.setenv("LAMPO_ATTN_PREFILL_TILED", tiled)
        for nq, nkv, T, pos0 in ((16, 2, 8192, 0), (24, 4, 8192, 0), (16, 2, 1024, 65_536), (16, 2, 2048, 259_952),
                                 (24, 4, 2048, 259_952)):
            bench(f"prefill attn {form} nq={nq} nkv={nkv} T={T} pos0={pos0}",
                  lambda: ops.bench_attn_prefill(nq, nkv, T, pos0, 3),
                  lambda r: f"{r['us'] / 1e3:7.2f} ms  {r['TFLOPs']:6.1f} TFLOP/s")
    for temp, k, p in ((0.0, 0, 1.0), (0.6, 20, 0.95), (1.0, 0, 0.95)):
        bench(f"sample T={temp} top_k={k} top_p={p}", lambda: ops.bench_sample(V_FULL, V_REAL, temp, k, p, 50),
              lambda r: f"{r['us']:6.1f} us")
    print("\n== core kernel timings (CUDA graph replays) ==\n" + "\n".join(lines))
    assert not errors, errors
