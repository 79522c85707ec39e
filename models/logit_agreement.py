"""How closely two next-token logit rows agree, over the real vocabulary (the CUDA engine leaves
the logits of the embedding's padding rows unmasked; its sampler masks them), and the bounds the
CUDA engine is held to against the numpy reference (tests/cuda, `lampo check`).

The engine keeps bf16 weights and activations, an fp32 residual stream and an INT8 KV cache; the
reference is fp32 throughout, so their logits agree to about 1e-2 relative."""

from __future__ import annotations

import numpy as np

ROW_REL_L2 = 4e-2  # engine against the reference on the same weights (and, for MoE, the same experts)
TOP5_KEPT = 4      # of the reference's five best ids, at least this many among the engine's five
REPEAT_REL_L2 = 1e-3  # one computation along another schedule (the graphed step against one-token prefills)
# An MoE row whose experts the reference cannot replay (the MTP layer's): a router near-tie may
# pick another expert and move the row far, so the median row must meet MOE_MEDIAN and every row
# LOOSE (a wrong routing weight, uniform instead of softmax, gives ~0.2).
MOE_MEDIAN, LOOSE = 6e-2, 0.6
NEAR_TIE = 0.1  # two logits closer than this many standard deviations of their row may swap under bf16


def rel_l2(got, want, vocab: int) -> float:
    """||got - want|| / ||want|| over the first `vocab` logits, in float64."""
    g, w = np.asarray(got, np.float64)[:vocab], np.asarray(want, np.float64)[:vocab]
    return float(np.linalg.norm(g - w) / np.linalg.norm(w))


def gap_in_stds(row, a: int, b: int, vocab: int) -> float:
    """|row[a] - row[b]| in standard deviations of the row's first `vocab` logits."""
    real = np.asarray(row, np.float64)[:vocab]
    return float(abs(real[a] - real[b]) / real.std())


def _top5(row, vocab: int) -> set[int]:
    return set(np.argsort(np.asarray(row)[:vocab])[-5:].tolist())


def top5_kept(got, want, vocab: int) -> int:
    """How many of `want`'s five largest logits (first `vocab`) are among `got`'s five largest."""
    return len(_top5(got, vocab) & _top5(want, vocab))
