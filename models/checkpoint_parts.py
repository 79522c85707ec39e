"""Tensors a checkpoint stores in parts, read back as the one bf16 tensor the engine expects.

Two forms, both in Qwen's `*-FP8` releases:
- an FP8 matrix: its e4m3 codes and their block scales (`lampo.models.fp8`);
- a fused expert bank (`mlp.experts.gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) stored as
  its experts' own matrices (`tensor_specs.expert_parts`), each bf16 or FP8: the parts' rows, in
  order, are the bank's rows.

`Assembled.bf16(view)` builds the whole tensor as bf16 bits; `Assembled.stored_parts(view)` yields
its parts with each part's stored bytes, for `lampo convert`'s streaming (`part_bf16` decodes one);
`Assembled.fp8_parts(view)` gives a tensor stored as FP8 throughout as its parts' codes and scales,
which the CUDA engine decodes on the GPU. `view(stored)` is the checkpoint's zero-copy map of one
stored tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from lampo.models.bf16 import from_bf16
from lampo.models.fp8 import dequantize_bf16, on_threads
from lampo.models.safetensors_io import StoredTensor

View = Callable[[StoredTensor], np.ndarray]  # bf16 as uint16 bits, F32 as float32, FP8 codes as uint8


@dataclass(frozen=True)
class Fp8Matrix:
    """One block-scaled FP8 matrix: codes [rows, cols] and scales, in blocks of `block`."""

    codes: StoredTensor
    scales: StoredTensor
    block: tuple[int, int]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.codes.shape

    @property
    def stored(self) -> tuple[StoredTensor, ...]:
        return self.codes, self.scales

    def scales_f32(self, view: View) -> np.ndarray:
        """The block scales as float32 (stored F32 or BF16)."""
        scales = view(self.scales)
        return from_bf16(scales) if scales.dtype == np.uint16 else np.asarray(scales, dtype=np.float32)

    def bf16(self, view: View, out: np.ndarray | None = None) -> np.ndarray:
        """The matrix as bf16 bits (into `out` when given)."""
        return dequantize_bf16(view(self.codes), self.scales_f32(view), self.block, out)


Part = StoredTensor | Fp8Matrix


def _stored(part: Part) -> tuple[StoredTensor, ...]:
    return part.stored if isinstance(part, Fp8Matrix) else (part,)


def part_bf16(part: Part, view: View, out: np.ndarray | None = None) -> np.ndarray:
    """One part as bf16 bits [rows, cols] (a plain part is a bf16 matrix: checked at open), into
    `out` when given."""
    if isinstance(part, Fp8Matrix):
        return part.bf16(view, out)
    if out is None:
        return view(part)
    out[...] = view(part)
    return out


@dataclass(frozen=True)
class Assembled:
    """The tensor `name` of `shape`, whose rows are its `parts`' rows in order."""

    name: str
    shape: tuple[int, ...]
    parts: tuple[Part, ...]

    @property
    def stored(self) -> tuple[StoredTensor, ...]:
        """Every stored tensor it reads, in part order."""
        return tuple(t for p in self.parts for t in _stored(p))

    @property
    def first(self) -> StoredTensor:
        """The stored tensor its first rows come from (its file is the tensor's file in messages)."""
        return self.stored[0]

    @property
    def nbytes(self) -> int:
        """Bytes stored."""
        return sum(t.nbytes for t in self.stored)

    @property
    def has_fp8(self) -> bool:
        return any(isinstance(p, Fp8Matrix) for p in self.parts)

    def fp8_parts(self, view: View) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """(codes uint8 [rows, cols], scales float32) of every part, its rows in order, for a tensor
        stored as FP8 throughout (the engine decodes those on the GPU); None when any part is bf16."""
        if not all(isinstance(p, Fp8Matrix) for p in self.parts):
            return None
        return [(view(p.codes), p.scales_f32(view)) for p in self.parts]

    def bf16(self, view: View) -> np.ndarray:
        """The whole tensor as bf16 bits (a new array)."""
        out = np.empty(self.shape, dtype=np.uint16)
        flat = out.reshape(-1, self.shape[-1])
        starts = np.cumsum([0] + [p.shape[0] for p in self.parts])

        def task(i: int) -> None:
            part_bf16(self.parts[i], view, flat[starts[i]:starts[i + 1]])

        on_threads(task, range(len(self.parts)))
        return out

    def stored_parts(self, view: View) -> Iterator[tuple[bytes, Part]]:
        """(the part's stored bytes, the part) for each part in order."""
        for part in self.parts:
            yield b"".join(view(t).tobytes() for t in _stored(part)), part
