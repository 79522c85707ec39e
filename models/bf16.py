"""bfloat16 <-> float32 conversion on numpy arrays (numpy has no bf16 dtype).

bf16 values are carried as uint16 arrays holding the upper half of the fp32 bit pattern.
"""

from __future__ import annotations

import numpy as np


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float -> bf16 bits (uint16), round to nearest even; NaN stays NaN."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded through bf16 (what a bf16 store then load gives)."""
    return from_bf16(to_bf16(x))
