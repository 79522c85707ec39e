"""RMSNorms of the Qwen3.5/3.6 family, fp32.

- `rmsnorm1p`: zero-centred RMSNorm used everywhere except the GDN output
  (input/post-attention layernorms, final norm, q_norm, k_norm, the three MTP norms):
  y = x * rsqrt(mean(x^2) + eps) * (1 + w), over the last dim.
- `gated_rmsnorm`: GDN output norm per V head with a PLAIN weight, norm before gate:
  y = w * (o * rsqrt(mean(o^2) + eps)) * silu(z), over the last dim (dv).
"""

from __future__ import annotations

import numpy as np

from .activations import silu


def _rms_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    mean_sq = np.mean(x * x, axis=-1, keepdims=True)
    return x * (np.float32(1) / np.sqrt(mean_sq + np.float32(eps)))


def rmsnorm1p(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Zero-centred RMSNorm: x [..., n], w [n] -> [..., n] float32."""
    w = np.asarray(w, dtype=np.float32)
    if w.shape != (np.shape(x)[-1],):
        raise ValueError(f"rmsnorm1p: weight shape {w.shape} does not match last dim of x {np.shape(x)}")
    return _rms_normalize(x, eps) * (np.float32(1) + w)


def gated_rmsnorm(o: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GDN gated RMSNorm: o, z [..., dv], plain w [dv] -> [..., dv] float32."""
    w = np.asarray(w, dtype=np.float32)
    if np.shape(o) != np.shape(z) or w.shape != (np.shape(o)[-1],):
        raise ValueError(f"gated_rmsnorm: shapes o {np.shape(o)}, z {np.shape(z)}, w {w.shape} do not match")
    return w * _rms_normalize(o, eps) * silu(z)
