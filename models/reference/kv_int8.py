"""INT8 KV-cache quantization with one fp16 scale per group of 64 values (oracle for the CUDA cache).

quantize_int8_g64(x [..., D]) -> (q int8 [..., D], scale float16 [..., D/64]), D a multiple of 64:
  scale = fp16(max|x_group| / 127)               (rounded to fp16 first: this is the stored scale)
  q     = clip(round_half_even(x / float32(scale)), -127, 127); a group whose scale is 0 gets q = 0
dequantize_int8_g64(q, scale) -> float32 q * scale.
|x - dequant| <= scale/2 per element, plus the fp16 rounding of the scale times |q| <= 127.
"""

from __future__ import annotations

import numpy as np

GROUP = 64


def _groups(x: np.ndarray, name: str) -> np.ndarray:
    if x.ndim == 0 or x.shape[-1] % GROUP:
        raise ValueError(f"{name}: last dim must be a multiple of {GROUP} (got shape {x.shape})")
    return x.reshape(*x.shape[:-1], x.shape[-1] // GROUP, GROUP)


def quantize_int8_g64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float32)
    g = _groups(x, "quantize_int8_g64")
    scale = (np.abs(g).max(axis=-1) / np.float32(127)).astype(np.float16)
    s32 = scale.astype(np.float32)[..., None]
    safe = np.where(s32 > 0, s32, np.float32(1))
    q = np.where(s32 > 0, np.clip(np.rint(g / safe), -127, 127), 0).astype(np.int8)
    return q.reshape(x.shape), scale


def dequantize_int8_g64(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    q = np.asarray(q)
    g = _groups(q, "dequantize_int8_g64")
    scale = np.asarray(scale)
    if scale.shape != g.shape[:-1]:
        raise ValueError(f"dequantize_int8_g64: scale shape {scale.shape} does not match {g.shape[:-1]}")
    return (g.astype(np.float32) * scale.astype(np.float32)[..., None]).reshape(q.shape)
