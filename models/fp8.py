"""Block-scaled FP8 weights, as the Qwen3.6 `*-FP8` releases store them.

A matrix W [out, in] is stored as two tensors: `<name>` of dtype F8_E4M3 (one code per weight) and
`<name>_scale_inv` [ceil(out / bo), ceil(in / bi)] (F32 or BF16), with (bo, bi) the
`weight_block_size` of config.json's `quantization_config` (`quant_method` "fp8", `fmt` "e4m3";
128 x 128 in the releases):

    W[i, j] = e4m3(q[i, j]) * scale_inv[i // bo, j // bi]     (the "inverse" scale multiplies)

e4m3 ("fn"): 1 sign, 4 exponent (bias 7) and 3 mantissa bits, subnormals, no infinities, 0x7F and
0xFF are NaN, the largest value is 448. Every e4m3 value is exact in bf16 and float32.

Lampo holds such a weight as the bf16 rounding of that product (`dequantize_bf16`): quantize-on-load,
`lampo convert` and the reference engine all start from the same bf16 values. `quantize_blocks` is
the inverse the synthetic writer uses to publish a checkpoint in this form.
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lampo.models.bf16 import to_bf16

FP8 = "F8_E4M3"
SCALE_SUFFIX = "_scale_inv"
E4M3_MAX = 448.0
_ROWS_PER_TASK = 1 << 22  # elements decoded per thread task (whole rows)


class Fp8ConfigError(ValueError):
    """config.json's quantization_config names a format Lampo cannot read; one line."""


def scale_name(name: str) -> str:
    """The block scales of the FP8 matrix `name`."""
    return name + SCALE_SUFFIX


def read_fp8_block(model_dir: Path) -> tuple[int, int] | None:
    """The (rows, cols) weight block of an FP8 checkpoint from its config.json, None for a checkpoint
    without a quantization_config; any other quantization method raises Fp8ConfigError."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # load_config reports an unreadable config.json
    q = raw.get("quantization_config") if isinstance(raw, dict) else None
    if q is None:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method != "fp8":
        raise Fp8ConfigError(
            f"{path}: quantization_config has quant_method {method!r}; Lampo reads bf16 checkpoints and "
            f"block-scaled FP8 ones (quant_method 'fp8', as Qwen's *-FP8 releases): use one of those")
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise Fp8ConfigError(f"{path}: quantization_config has fmt {fmt!r}; Lampo reads FP8 weights in e4m3 only")
    block = q.get("weight_block_size")
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise Fp8ConfigError(f"{path}: quantization_config.weight_block_size must be two positive integers "
                             f"(per-tensor FP8 scales are not supported), got {block!r}")
    return block[0], block[1]


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    """The shape of the block scales of a matrix of `shape`."""
    rows, cols = shape
    return math.ceil(rows / block[0]), math.ceil(cols / block[1])


def decode_e4m3(q: np.ndarray) -> np.ndarray:
    """e4m3 codes (uint8) -> float32, exactly: (-1)^s 2^(e - 7) (1 + m / 8), subnormals (e = 0)
    m 2^-9."""
    q = np.asarray(q, dtype=np.uint8)
    e, m = (q >> 3) & 0xF, (q & 0x7).astype(np.float32)
    f = np.where(e == 0, np.ldexp(m / 8, -6), np.ldexp(1 + m / 8, e.astype(np.int32) - 7)).astype(np.float32)
    f[(q & 0x7F) == 0x7F] = np.nan
    return np.where(q >= 0x80, -f, f)


_VALUES = decode_e4m3(np.arange(256, dtype=np.uint8))  # every code's value: decoding is a lookup


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """float -> e4m3 codes (uint8), rounding to the nearest value (ties to the even code) and
    saturating at +-448; NaN -> 0x7F."""
    x = np.asarray(x, dtype=np.float32)
    values = _VALUES[:0x7F]  # the 127 finite magnitudes, increasing
    a = np.minimum(np.abs(x), np.float32(E4M3_MAX))
    hi = np.clip(np.searchsorted(values, a), 1, 0x7E)  # values[hi - 1] <= a <= values[hi] (a > 0)
    lo = hi - 1
    below, above = a - values[lo], values[hi] - a
    code = np.where((below < above) | ((below == above) & (lo % 2 == 0)), lo, hi).astype(np.uint8)
    code[a == 0] = 0
    code |= np.signbit(x).astype(np.uint8) << 7
    code[np.isnan(x)] = 0x7F
    return code


def _dequantize_rows(q: np.ndarray, scale: np.ndarray, block: tuple[int, int], out: np.ndarray) -> None:
    rows, cols = q.shape
    (bo, bi), (sr, sc) = block, scale.shape
    if rows % bo or cols % bi:  # blocks cut at the edges: the values times their scales, rounded
        out[...] = to_bf16(_VALUES[q] * np.repeat(np.repeat(scale, bo, axis=0)[:rows], bi, axis=1)[:, :cols])
        return
    # whole blocks: each block's 256 possible bf16 results, looked up by code
    tables = to_bf16(scale.reshape(-1, 1) * _VALUES[None, :]).reshape(-1)
    base = (np.arange(sr * sc, dtype=np.int32) * 256).reshape(sr, 1, sc, 1)
    np.take(tables, q.reshape(sr, bo, sc, bi) + base, out=out.reshape(sr, bo, sc, bi))


def on_threads(task, items) -> None:
    """`task(item)` for every item, on up to one thread per CPU (numpy's loops release the GIL)."""
    items = list(items)
    if len(items) == 1:
        task(items[0])
        return
    with ThreadPoolExecutor(min(len(items), os.cpu_count() or 1)) as pool:
        list(pool.map(task, items))  # list(): a task's error is raised here


def dequantize_bf16(q: np.ndarray, scale: np.ndarray, block: tuple[int, int],
                    out: np.ndarray | None = None) -> np.ndarray:
    """A block-scaled FP8 matrix (codes [out, in] uint8, scales float32) as bf16 bits [out, in]
    (into `out`, C-contiguous uint16, when given), in row slices of whole blocks decoded on
    several threads."""
    rows, cols = q.shape
    if scale.shape != scale_shape(q.shape, block):
        raise ValueError(f"fp8: scales of shape {scale.shape} for a [{rows}, {cols}] matrix in blocks of {block}")
    out = np.empty((rows, cols), dtype=np.uint16) if out is None else out
    step = max(1, _ROWS_PER_TASK // max(cols, 1) // block[0]) * block[0]

    def task(r0: int) -> None:
        r1 = min(rows, r0 + step)
        _dequantize_rows(q[r0:r1], scale[r0 // block[0]:-(-r1 // block[0])], block, out[r0:r1])

    on_threads(task, range(0, rows, step))
    return out


def quantize_blocks(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A float matrix as block-scaled FP8: (codes uint8, scales float32), each block's scale its
    largest magnitude over 448 (1 for an all-zero block)."""
    rows, cols = w.shape
    sr, sc = scale_shape(w.shape, block)
    padded = np.zeros((sr * block[0], sc * block[1]), dtype=np.float32)
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(sr, block[0], sc, block[1])).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / np.float32(E4M3_MAX), 1).astype(np.float32)
    expanded = np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)[:rows, :cols]
    return encode_e4m3(w / expanded), scale
