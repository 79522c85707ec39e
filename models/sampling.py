"""Token sampling on CPU (numpy): the reference for the engine's sampler and the reference backend.

sample(logits [V], params, rng, seen_ids) -> token id, in this order:
 1. padding ids (>= 248,077, rows of lm_head that belong to no token) are masked to -inf;
 2. presence penalty: subtract params.presence_penalty once from the logit of every id in seen_ids
    (the ids generated so far in this generation);
 3. temperature 0 -> argmax (ties -> lower id); otherwise logits / temperature, softmax;
 4. top-k (k > 0): keep the k highest (ties at the cut -> lower ids);
 5. top-p (< 1): of what is left, keep the smallest highest-first set whose probability mass
    (renormalised after top-k) reaches top_p; always at least one token;
 6. min-p (> 0): drop tokens whose probability is below min_p x the highest probability;
 7. draw: one u = rng.random() in [0, 1), inverse CDF over the kept ids in ascending id order.
Probabilities are computed in float64.
"""

from __future__ import annotations

import numpy as np

from lampo.models.sampling_params import SamplingParams

FIRST_PADDING_ID = 248_077


def _seen_array(seen_ids, vocab: int) -> np.ndarray:
    if seen_ids is None:
        return np.zeros(0, dtype=np.int64)
    if isinstance(seen_ids, (set, frozenset)):
        seen_ids = np.fromiter(seen_ids, dtype=np.int64, count=len(seen_ids))
    ids = np.unique(np.asarray(seen_ids, dtype=np.int64).reshape(-1))
    if len(ids) and (ids[0] < 0 or ids[-1] >= vocab):
        raise ValueError(f"sample: seen id outside the vocabulary 0..{vocab - 1}")
    return ids


def _penalised(logits: np.ndarray, params: SamplingParams, seen_ids) -> np.ndarray:
    """Steps 1-2: float64 copy with padding ids masked and the presence penalty applied."""
    x = np.array(logits, dtype=np.float64).reshape(-1)
    x[FIRST_PADDING_ID:] = -np.inf
    x[_seen_array(seen_ids, len(x))] -= params.presence_penalty
    return x


def top_k_ids(x: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """The k of `ids` (ascending) whose x is largest, ties to the lower ids (the first k of a stable
    descending sort), ascending. One partition, not a sort: a 248,320-entry vocabulary in ~2 ms."""
    v = x[ids]
    kth = np.partition(v, len(v) - k)[len(v) - k]  # the k-th largest value
    above = ids[v > kth]  # fewer than k
    return np.sort(np.concatenate([above, ids[v == kth][: k - len(above)]]))


def filtered_probs(logits: np.ndarray, params: SamplingParams, seen_ids=None) -> np.ndarray:
    """The distribution sample() draws from (steps 1-6) as float64 [V] (temperature must be > 0)."""
    if params.greedy:
        raise ValueError("filtered_probs: temperature 0 is greedy (a point mass), not a distribution")
    x = _penalised(logits, params, seen_ids) / params.temperature
    keep = np.flatnonzero(np.isfinite(x))  # ascending ids
    if not len(keep):
        raise ValueError("sample: every logit is -inf")
    if 0 < params.top_k < len(keep):
        keep = top_k_ids(x, keep, params.top_k)
    p = np.exp(x[keep] - x[keep].max())
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        mass = np.cumsum(p[order])
        n = int(np.searchsorted(mass, params.top_p, side="left")) + 1
        chosen = np.sort(order[: min(n, len(order))])
        keep, p = keep[chosen], p[chosen]
    if params.min_p > 0.0:
        ok = p >= params.min_p * p.max()
        keep, p = keep[ok], p[ok]
    out = np.zeros(len(x), dtype=np.float64)
    out[keep] = p / p.sum()
    return out


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator, seen_ids=None) -> int:
    params.validate()
    if params.greedy:
        return int(np.argmax(_penalised(logits, params, seen_ids)))
    probs = filtered_probs(logits, params, seen_ids)
    keep = np.flatnonzero(probs)
    cdf = np.cumsum(probs[keep])
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(keep[min(i, len(keep) - 1)])
