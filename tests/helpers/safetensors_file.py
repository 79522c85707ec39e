"""One safetensors file written from raw tensor bytes, for tests that build checkpoints by hand."""

from __future__ import annotations

from pathlib import Path

from lampo.models.safetensors_io import build_header


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    """`tensors`: name -> (safetensors dtype, shape, the data's bytes), written in this order."""
    header, _ = build_header((name, dtype, shape) for name, (dtype, shape, _data) in tensors.items())
    with open(path, "wb") as f:
        f.write(header)
        for _dtype, _shape, data in tensors.values():
            f.write(data)
