"""NaN/Inf scan of a checkpoint's tensors at load: a model that loads is a model that runs.

`count_nonfinite(raw)` counts the non-finite values of one stored tensor (`Checkpoint.raw`: bf16
bit patterns as uint16, or float32) straight from the bits, an exponent of all ones being +-Inf or
NaN, in bounded chunks; it is the reference the CUDA engine's own census
(native/src/weights/nonfinite_scan.cu, returned by `Engine.nonfinite_census`) is tested against. `check_finite(ck)` scans
every tensor the text engine uses (the reference backend's load step) and raises
`nonfinite_error`: one CheckpointError line naming the file, the tensor, how many values and the
first one's index, and the other tensors affected. Of a quantized tensor (a converted checkpoint)
the fp16 scales are scanned: a NaN/Inf scale is damage, a zero scale a group of zeros (the
vocabulary's padding rows have them), and a tensor whose every scale is zero holds no weights at
all: damage too (`zeroed_error`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from lampo.models.checkpoint import Checkpoint, CheckpointError
from lampo.models.quant.checkpoint_format import scales

CHUNK_ELEMENTS = 1 << 22  # values tested per step: temporaries stay a few MB for any tensor size
_EXPONENT = {np.dtype(np.uint16): np.uint16(0x7F80), np.dtype(np.float32): np.uint32(0x7F800000),
             np.dtype(np.float16): np.uint16(0x7C00)}
_MORE_NAMED = 3  # other affected tensors named in the message


@dataclass(frozen=True)
class NonFinite:
    """A tensor holding `count` NaN/Inf values, the first at flat (C-order) index `first`."""

    name: str
    count: int
    first: int


def count_nonfinite(raw: np.ndarray) -> tuple[int, int]:
    """(number of NaN/Inf values, flat index of the first or -1) of bf16 bits (uint16), float32 or
    float16."""
    exponent = _EXPONENT[raw.dtype]
    bits = raw.reshape(-1).view(exponent.dtype)
    count, first = 0, -1
    for start in range(0, bits.size, CHUNK_ELEMENTS):
        bad = (bits[start:start + CHUNK_ELEMENTS] & exponent) == exponent
        n = int(np.count_nonzero(bad))
        if n and first < 0:
            first = start + int(np.argmax(bad))
        count += n
    return count, first


def scan_checkpoint(ck: Checkpoint, names: Iterable[str] | None = None) -> list[NonFinite]:
    """The tensors (`names`, default all the engine uses) holding NaN/Inf, in checkpoint order."""
    return _scan(ck, names)[0]


def _scan(ck: Checkpoint, names: Iterable[str] | None = None) -> tuple[list[NonFinite], list[str]]:
    """One pass over the tensors: those holding NaN/Inf, and the quantized ones whose every scale
    is zero (their scales are read once for both)."""
    found, zeroed = [], []
    for name in ck.names() if names is None else names:
        lq = ck.quantized(name)
        values = ck.raw(name) if lq is None else scales(ck.raw(name), lq)
        count, first = count_nonfinite(values)
        if count:
            found.append(NonFinite(name, count, first))
        elif lq is not None and not values.any():
            zeroed.append(name)
    return found, zeroed


def nonfinite_error(ck: Checkpoint, found: list[NonFinite]) -> CheckpointError:
    """One line naming the first affected tensor, its file, the count and where the first value
    sits, and (some of) the others."""
    order = {name: i for i, name in enumerate(ck.names())}
    found = sorted(found, key=lambda f: order.get(f.name, len(order)))
    head = found[0]
    lq = ck.quantized(head.name)
    shape, what = (ck.spec(head.name).shape, "value") if lq is None else (lq.scale_shape, "scale")
    where = list(np.unravel_index(head.first, shape)) if shape else []
    msg = (f"checkpoint: {ck.path_of(head.name).name}: tensor {head.name!r} holds {head.count:,} NaN/Inf "
           f"{what}{'s' if head.count > 1 else ''} (the first at [{', '.join(str(int(i)) for i in where)}] "
           f"of [{', '.join(map(str, shape))}])")
    others = found[1:]
    if others:
        named = ", ".join(f"{o.name!r} ({o.count:,})" for o in others[:_MORE_NAMED])
        rest = len(others) - _MORE_NAMED
        msg += f"; so do {len(others)} more tensor{'s' if len(others) > 1 else ''}: {named}"
        msg += f" and {rest} more" if rest > 0 else ""
    return CheckpointError(msg + "; the checkpoint is damaged")


def zeroed_error(ck: Checkpoint, name: str) -> CheckpointError:
    """One line naming a quantized tensor whose every scale is zero."""
    lq = ck.quantized(name)
    return CheckpointError(f"checkpoint: {ck.path_of(name).name}: tensor {name!r}: every one of its "
                           f"{int(np.prod(lq.scale_shape)):,} scales is zero, so it holds no weights; "
                           f"the checkpoint is damaged (convert it again)")


def check_finite(ck: Checkpoint) -> None:
    """Raise `nonfinite_error` when any tensor the engine uses holds NaN/Inf, `zeroed_error` when a
    quantized one holds no weights."""
    found, zeroed = _scan(ck)
    if found:
        raise nonfinite_error(ck, found)
    if zeroed:
        raise zeroed_error(ck, zeroed[0])
