"""Partial NeoX rotary embedding (text positions; for text the interleaved MRoPE reduces to 1-D RoPE).

Only the first `rotary_dim` dims of each head rotate, split in halves a = x[:r/2], b = x[r/2:r]:
  y[i] = a[i] cos(p f_i) - b[i] sin(p f_i),  y[r/2+i] = b[i] cos(p f_i) + a[i] sin(p f_i),
  y[r:] = x[r:],  f_i = theta^(-2i/r).
As in HF, f_i and the angle p * f_i are float32 values (the product is rounded to fp32); cos/sin
of that fp32 angle are then evaluated accurately.
"""

from __future__ import annotations

import numpy as np


def rope_inv_freq(rotary_dim: int, theta: float) -> np.ndarray:
    """f_i = theta^(-2i/rotary_dim), i < rotary_dim/2, as float32 [rotary_dim/2]."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rope: rotary_dim must be a positive even number (got {rotary_dim})")
    exps = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    return (1.0 / (float(theta) ** exps)).astype(np.float32)


def rope_cos_sin(positions: np.ndarray, rotary_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of the fp32 angles: each [T, rotary_dim/2] float32."""
    pos = np.asarray(positions, dtype=np.float32).reshape(-1, 1)
    angles = pos * rope_inv_freq(rotary_dim, theta)[None, :]  # fp32 product, as HF
    angles64 = angles.astype(np.float64)
    return np.cos(angles64).astype(np.float32), np.sin(angles64).astype(np.float32)


def rope_partial(x: np.ndarray, positions: np.ndarray, rotary_dim: int, theta: float) -> np.ndarray:
    """x [T, heads, D], positions [T] int -> rotated copy [T, heads, D] float32."""
    x = np.asarray(x, dtype=np.float32)
    positions = np.asarray(positions)
    if x.ndim != 3 or positions.shape != (x.shape[0],):
        raise ValueError(f"rope_partial: need x [T, heads, D] and positions [T] (got {x.shape}, {positions.shape})")
    if rotary_dim > x.shape[2]:
        raise ValueError(f"rope_partial: rotary_dim {rotary_dim} exceeds head dim {x.shape[2]}")
    half = rotary_dim // 2
    cos, sin = rope_cos_sin(positions, rotary_dim, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    a, b = x[..., :half], x[..., half:rotary_dim]
    out = x.copy()
    out[..., :half] = a * cos - b * sin
    out[..., half:rotary_dim] = b * cos + a * sin
    return out
