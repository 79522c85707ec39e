"""Comparisons of logits rows for the GPU tests (tests/cuda/): the engine's rows against the
numpy reference's or against another kernel path's, over the real vocabulary (the engine leaves
padding-row logits unmasked; its sampler masks them), and chunked prefill."""

from __future__ import annotations

import numpy as np

from lampo.models import logit_agreement

REAL_VOCAB = 248_077
MOE_MEDIAN, LOOSE = logit_agreement.MOE_MEDIAN, logit_agreement.LOOSE


def rel_l2(got, want) -> float:
    return logit_agreement.rel_l2(got, want, REAL_VOCAB)


def assert_rows_agree(got_rows, want_rows, moe: bool, what: str, dense_tol: float):
    """Every row within `dense_tol` relative L2; an MoE model's median row within MOE_MEDIAN and
    every row within LOOSE (a router near-tie may pick another expert and move a row far)."""
    errs = [rel_l2(g, w) for g, w in zip(got_rows, want_rows)]
    report = f"{what}: rel L2 per row {[f'{e:.1e}' for e in errs]}"
    if moe:
        assert np.median(errs) <= MOE_MEDIAN and max(errs) <= LOOSE, report
    else:
        assert max(errs) <= dense_tol, report


def prefill(engine, ids, chunk=None) -> int:
    """Prefill `ids` from the current position in calls of `chunk` tokens (the engine's prefill
    chunk by default); returns the sampled id."""
    chunk = chunk or engine.prefill_chunk
    token = -1
    for s in range(0, len(ids), chunk):
        token = engine.prefill(np.asarray(ids[s:s + chunk], np.int32), s + chunk >= len(ids))
    return token
