"""The numpy sampler: every filter's exact effect on small hand-made logits, the draw, seeding."""

from __future__ import annotations

import numpy as np
import pytest

from hypothesis import given
from hypothesis import strategies as st

from lampo.models.sampling import FIRST_PADDING_ID, filtered_probs, sample, top_k_ids
from lampo.models.sampling_params import GREEDY, SamplingParams

P4 = np.log(np.array([0.5, 0.2, 0.2, 0.1]))  # logits whose softmax is [0.5, 0.2, 0.2, 0.1]


def params(**kw) -> SamplingParams:
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.0)
    return SamplingParams(**{**base, **kw})


class FixedU:
    """A stand-in rng whose random() returns a chosen u."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


def test_greedy_argmax_ties_lower_id_and_penalty():
    logits = np.array([1.0, 3.0, 0.5, 3.0])
    assert sample(logits, GREEDY, np.random.default_rng(0)) == 1
    pen = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, presence_penalty=2.0)
    assert sample(logits, pen, np.random.default_rng(0), seen_ids={1}) == 3
    assert sample(logits, pen, np.random.default_rng(0), seen_ids=np.array([1, 3, 3])) == 0  # [1, 1, .5, 1]


def test_padding_ids_never_chosen():
    logits = np.zeros(248_320, np.float32)
    logits[FIRST_PADDING_ID + 5] = 100.0
    logits[42] = 1.0
    assert sample(logits, GREEDY, np.random.default_rng(0)) == 42
    probs = filtered_probs(logits, params())
    assert probs[FIRST_PADDING_ID:].sum() == 0 and probs.sum() == pytest.approx(1.0)


def test_temperature_scales_logits():
    logits = np.array([2.0, 1.0, 0.0])
    for t in (0.5, 1.0, 2.0):
        e = np.exp(logits / t)
        np.testing.assert_allclose(filtered_probs(logits, params(temperature=t)), e / e.sum(), rtol=1e-12)


def test_top_k_keeps_k_highest_ties_to_lower_ids():
    logits = np.array([1.0, 3.0, 2.0, 3.0, 0.0])
    p2 = filtered_probs(logits, params(top_k=2))
    np.testing.assert_allclose(p2, [0, 0.5, 0, 0.5, 0])
    p1 = filtered_probs(logits, params(top_k=1))
    np.testing.assert_array_equal(p1, [0, 1, 0, 0, 0])
    p3 = filtered_probs(logits, params(top_k=3))
    e = np.exp([3.0, 2.0, 3.0])
    np.testing.assert_allclose(p3[[1, 2, 3]], e / e.sum())
    assert p3[0] == p3[4] == 0


@given(values=st.integers(1, 6), n=st.integers(1, 300), k=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_top_k_ids_is_the_stable_sort_s_first_k(values, n, k, seed):
    """The partition-based top-k keeps exactly what a stable descending sort keeps, ties included
    (few distinct values make many ties at the boundary)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, values, 2 * n).astype(np.float64)
    ids = np.sort(rng.choice(2 * n, n, replace=False))
    k = min(k, n)
    want = np.sort(ids[np.argsort(-x[ids], kind="stable")[:k]])
    np.testing.assert_array_equal(top_k_ids(x, ids, k), want)


@pytest.mark.parametrize(
    "top_p, kept",
    [(0.45, [0]), (0.6, [0, 1]), (0.85, [0, 1, 2]), (0.95, [0, 1, 2, 3])],
)
def test_top_p_smallest_set_reaching_mass(top_p, kept):
    # sorted [0.5, 0.2 (id 1), 0.2 (id 2), 0.1]: the tie between ids 1 and 2 keeps id 1 first
    probs = filtered_probs(P4, params(top_p=top_p))
    want = np.zeros(4)
    want[kept] = np.array([0.5, 0.2, 0.2, 0.1])[kept] / np.array([0.5, 0.2, 0.2, 0.1])[kept].sum()
    np.testing.assert_allclose(probs, want, rtol=1e-12, atol=1e-15)


def test_top_p_always_keeps_one_token():
    probs = filtered_probs(np.array([5.0, 0.0, 0.0]), params(top_p=1e-9))
    np.testing.assert_array_equal(probs, [1, 0, 0])


def test_min_p_drops_below_fraction_of_max():
    probs = filtered_probs(P4, params(min_p=0.3))  # threshold 0.15: drops the 0.1
    np.testing.assert_allclose(probs, np.array([0.5, 0.2, 0.2, 0.0]) / 0.9, rtol=1e-12)
    probs = filtered_probs(P4, params(min_p=0.5))  # threshold 0.25: only the top remains
    np.testing.assert_array_equal(probs, [1, 0, 0, 0])


def test_filters_apply_in_order():
    # top-k 3 -> [0.5, 0.2, 0.2]/0.9; top-p 0.7 of that -> ids 0, 1 (0.556 + 0.222);
    # min-p 0.5 of the renormalised [0.714, 0.286] keeps only id 0.
    np.testing.assert_allclose(filtered_probs(P4, params(top_k=3, top_p=0.7)), [5 / 7, 2 / 7, 0, 0], rtol=1e-12)
    np.testing.assert_array_equal(filtered_probs(P4, params(top_k=3, top_p=0.7, min_p=0.5)), [1, 0, 0, 0])


def test_presence_penalty_subtracts_once_per_seen_id():
    logits = np.array([1.0, 1.0, 1.0])
    probs = filtered_probs(logits, params(presence_penalty=1.0, temperature=0.5), seen_ids=[2, 2, 2])
    e = np.exp(np.array([1.0, 1.0, 0.0]) / 0.5)
    np.testing.assert_allclose(probs, e / e.sum(), rtol=1e-12)
    same = [filtered_probs(logits, params(presence_penalty=1.0), seen_ids=s) for s in ({2}, np.array([2]), [2, 2])]
    for p in same[1:]:
        np.testing.assert_array_equal(p, same[0])
    with pytest.raises(ValueError, match="seen id"):
        filtered_probs(logits, params(), seen_ids=[3])


def test_draw_is_inverse_cdf_in_id_order():
    # probabilities [0.5, 0.2, 0.2, 0.1] -> cdf [0.5, 0.7, 0.9, 1.0]
    for u, want in [(0.0, 0), (0.49, 0), (0.5, 1), (0.69, 1), (0.71, 2), (0.95, 3), (0.999999, 3)]:
        assert sample(P4, params(), FixedU(u)) == want


def test_seeded_draws_are_deterministic_and_follow_the_distribution():
    logits = np.array([0.0, 1.0, 2.0, 0.5, -1.0])
    p = params(temperature=0.8, top_k=4)
    a = [sample(logits, p, np.random.default_rng(11)) for _ in range(3)]
    assert len(set(a)) == 1  # same seed, same first draw
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    seq1 = [sample(logits, p, rng1) for _ in range(50)]
    assert seq1 == [sample(logits, p, rng2) for _ in range(50)]
    rng = np.random.default_rng(6)
    draws = np.array([sample(logits, p, rng) for _ in range(20_000)])
    assert draws.max() < 4 and not (draws == 4).any()  # top-k removed id 4
    freq = np.bincount(draws, minlength=5) / len(draws)
    np.testing.assert_allclose(freq, filtered_probs(logits, p), atol=0.015)


def test_invalid_params_and_greedy_distribution():
    with pytest.raises(ValueError, match="temperature"):
        sample(P4, params(temperature=-1.0), np.random.default_rng(0))
    with pytest.raises(ValueError, match="greedy"):
        filtered_probs(P4, GREEDY)


@pytest.mark.parametrize("field, value", [
    ("temperature", float("nan")), ("temperature", float("inf")), ("top_p", float("nan")),
    ("min_p", float("nan")), ("presence_penalty", float("nan")), ("top_k", 2**31),
    ("max_tokens", 2**31), ("seed", -1), ("seed", 2**64),
])
def test_values_outside_what_every_engine_takes_are_refused_by_name(field, value):
    """A seed of -1 or a NaN temperature once passed config.toml and failed at the first reply."""
    with pytest.raises(ValueError, match=rf"^{field} must be .* \(got {value}\)$"):
        params(**{field: value}).validate()


def test_the_widest_accepted_values_validate():
    params(top_k=2**31 - 1, max_tokens=2**31 - 1, seed=2**64 - 1).validate()
