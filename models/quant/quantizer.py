"""Codes and scales for a matrix: Lampo's quantizer and the plain round-to-nearest baseline.

Both work group by group (64 weights of one row, one fp16 scale) and produce the codes of
`layout.py`: W ~ scale * (code - m), m = 2**(bits-1), code in [0, 2m).

`quantize` (the format's quantizer) searches each group's scale: the levels run from -m to m-1,
so the scale is signed and the group's largest magnitude may land on either end; for a few
stretch factors of each end it rounds, refits the scale by least squares for those codes,
rounds again, and keeps the candidate with the smallest squared error (scale rounded to fp16
before the final codes are chosen). `round_to_nearest` is the baseline the format must beat at
the same bits per weight: scale = max|w| / (m - 1), one rounding.
"""

from __future__ import annotations

import numpy as np

from lampo.models.quant.layout import TILE_COLS, check_bits, check_shape

STRETCH = np.linspace(0.84, 1.0, 9, dtype=np.float32)  # candidate scales as fractions of the end-point scale
ROWS_PER_CHUNK = 128  # rows per step: small scratch arrays (fresh large ones cost more to zero than to use)


def quantize(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """w [N, K] float -> (codes [N, K] uint8, scales [N, K/64] fp16) by the scale search."""
    return _by_chunks(w, bits, _search_groups)


def round_to_nearest(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """w [N, K] -> (codes, scales) by plain symmetric round-to-nearest (the baseline)."""
    return _by_chunks(w, bits, _rtn_groups)


def _by_chunks(w: np.ndarray, bits: int, method) -> tuple[np.ndarray, np.ndarray]:
    check_bits(bits)
    if w.ndim != 2:
        raise ValueError(f"quantize takes a matrix, not shape {list(w.shape)}")
    n, k = w.shape
    check_shape(n, k)
    codes = np.empty((n, k), dtype=np.uint8)
    scales = np.empty((n, k // TILE_COLS), dtype=np.float16)
    for start in range(0, n, ROWS_PER_CHUNK):
        rows = slice(start, min(n, start + ROWS_PER_CHUNK))
        groups = np.asarray(w[rows], dtype=np.float32).reshape(-1, TILE_COLS)
        c, s = method(groups, bits)
        codes[rows] = c.reshape(-1, k)
        scales[rows] = s.reshape(-1, k // TILE_COLS)
    return codes, scales


def _codes_for(groups: np.ndarray, scale: np.ndarray, m: int) -> np.ndarray:
    """Signed levels in [-m, m-1] for each group's scale (a zero scale gives zeros)."""
    safe = np.where(scale == 0, 1.0, scale)
    return np.clip(np.rint(groups / safe[:, None]), -m, m - 1) * (scale != 0)[:, None]


def _fp16_scale(scale: np.ndarray) -> np.ndarray:
    """Rounded to fp16, overflow clamped to the largest finite fp16."""
    return np.clip(scale, -65504.0, 65504.0).astype(np.float16).astype(np.float32)


def _search_groups(groups: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    m = 1 << (bits - 1)
    peak = groups[np.arange(len(groups)), np.abs(groups).argmax(axis=1)]  # signed largest magnitude
    best_err = np.full(len(groups), np.inf)
    best_scale = np.zeros(len(groups), dtype=np.float32)
    for end in (-m, m - 1):  # the peak on the -m level, or on the m-1 level
        for stretch in STRETCH:
            scale = peak / (end * stretch)
            q = _codes_for(groups, scale, m)
            qq = (q * q).sum(axis=1)
            refit = np.where(qq > 0, np.einsum("gi,gi->g", groups, q, dtype=np.float64) / np.where(qq > 0, qq, 1), scale)
            scale = _fp16_scale(refit)
            q = _codes_for(groups, scale, m)
            err = (np.square(groups - q * scale[:, None], dtype=np.float64)).sum(axis=1)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_scale = np.where(better, scale, best_scale)
    q = _codes_for(groups, best_scale, m)
    return (q + m).astype(np.uint8), best_scale.astype(np.float16)


def _rtn_groups(groups: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    m = 1 << (bits - 1)
    scale = _fp16_scale(np.abs(groups).max(axis=1) / (m - 1))
    q = _codes_for(groups, scale, m)
    return (q + m).astype(np.uint8), scale.astype(np.float16)
