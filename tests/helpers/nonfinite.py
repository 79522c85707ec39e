"""Plant NaN/Inf values into a checkpoint on disk, in place: the damage `lampo.models.finite_scan`
and the CUDA engine's census must find."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lampo.models.safetensors_io import read_header

BF16_NAN, BF16_INF, BF16_NEG_INF = 0x7FC0, 0x7F80, 0xFF80
F32_NAN, F32_INF = 0x7FC00000, 0x7F800000


def plant(model_dir: Path, name: str, flat_indices: list[int], bits: int) -> Path:
    """Overwrite elements `flat_indices` of tensor `name` with the bit pattern `bits` (a bf16
    pattern for BF16 tensors, an f32 one for F32); returns the file changed."""
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for t in read_header(path):
            if t.name != name:
                continue
            width = {"BF16": 2, "F32": 4}[t.dtype]
            word = np.array([bits], dtype="<u2" if width == 2 else "<u4").tobytes()
            with open(path, "r+b") as f:
                for i in flat_indices:
                    assert 0 <= i * width < t.nbytes
                    f.seek(t.start + i * width)
                    f.write(word)
            return path
    raise KeyError(f"no tensor {name!r} in {model_dir}")
