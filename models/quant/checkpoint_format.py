"""A converted (LQ) checkpoint directory: its format file and how each tensor is stored.

`lampo convert` (`convert.py`) writes an HF-layout directory - config.json, the tokenizer files,
safetensors shards, model.safetensors.index.json - and, last, `lampo-format.json`:

    {"format": "lampo-lq", "version": 1, "recipe": "q5",
     "source": {"sha256": hex digest of the source tensors' bytes in canonical order,
                "files": [the source's safetensors files]},
     "tensors": {name: {"bits": 4 | 5 | 6 | "bf16", "shape": [the logical shape]}}}

A tensor at 4, 5 or 6 bits is stored as U8: a matrix [N, K] as [layout.packed_bytes(N, K, b)],
an expert bank [E, N, K] as [E, packed_bytes(N, K, b)] (row e: expert e's packed bytes). A "bf16"
tensor is stored as in the source (BF16, or F32 for the vectors that may be either).

`read_format(dir)` is the parsed `LqFormat`, or None when the directory has no format file;
`FormatError` (one line naming the file) for another format or version, an unknown recipe or a
malformed entry. `stored_specs` gives what the shards must hold; `dequantize` and `scales` read a
stored tensor back. A directory named `*.partial-<pid>` (`is_partial`) is an unfinished
conversion, never a model.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lampo.models.quant import layout
from lampo.models.quant.recipes import BF16, RECIPES
from lampo.models.tensor_specs import TensorSpec

FORMAT_FILE = "lampo-format.json"
FORMAT_NAME = "lampo-lq"
VERSION = 1
PACKED_DTYPE = "U8"
_PARTIAL = re.compile(r".+\.partial-\d+")


class FormatError(ValueError):
    """A format file Lampo cannot read; the message is one line naming the file."""


@dataclass(frozen=True)
class LqTensor:
    """One tensor of a converted checkpoint: its width ("bf16": not quantized) and logical shape."""

    bits: int | str
    shape: tuple[int, ...]

    @property
    def quantized(self) -> bool:
        return self.bits != BF16

    @property
    def packed_shape(self) -> tuple[int, ...]:
        """The stored U8 shape: [packed bytes] of a matrix, [E, packed bytes per expert] of a bank."""
        *banks, n, k = self.shape
        return (*banks, layout.packed_bytes(n, k, self.bits))

    def stored_spec(self, source: TensorSpec) -> TensorSpec:
        """What the shards hold: packed U8 when quantized, else `source` (the tensor's HF spec)."""
        return TensorSpec(self.packed_shape, PACKED_DTYPE, frozenset({PACKED_DTYPE})) if self.quantized else source

    @property
    def scale_shape(self) -> tuple[int, ...]:
        return (*self.shape[:-1], self.shape[-1] // layout.TILE_COLS)


@dataclass(frozen=True)
class LqFormat:
    recipe: str
    tensors: dict[str, LqTensor]  # in canonical order
    source_sha256: str
    source_files: tuple[str, ...]

    def to_json(self) -> str:
        """The format file's text, one line per tensor."""
        head = {"format": FORMAT_NAME, "version": VERSION, "recipe": self.recipe,
                "source": {"sha256": self.source_sha256, "files": list(self.source_files)}}
        rows = [f"  {json.dumps(n)}: {json.dumps({'bits': t.bits, 'shape': list(t.shape)})}"
                for n, t in self.tensors.items()]
        return json.dumps(head)[:-1] + ',\n "tensors": {\n' + ",\n".join(rows) + "\n }\n}\n"


def is_partial(model_dir: Path) -> bool:
    return bool(_PARTIAL.fullmatch(Path(model_dir).name))


def partial_dir(out_dir: Path) -> Path:
    """Where `lampo convert` builds OUT_DIR before renaming it into place."""
    return out_dir.with_name(f"{out_dir.name}.partial-{os.getpid()}")


def read_format(model_dir: Path) -> LqFormat | None:
    path = Path(model_dir) / FORMAT_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{FORMAT_FILE} cannot be read ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise FormatError(f"{FORMAT_FILE} is not a {FORMAT_NAME} format file (format {found!r})")
    if doc.get("version") != VERSION:
        raise FormatError(f"{FORMAT_FILE} has format version {doc.get('version')!r}; this Lampo reads "
                          f"version {VERSION} (convert the checkpoint again)")
    recipe = doc.get("recipe")
    if not isinstance(recipe, str) or recipe not in RECIPES:
        raise FormatError(f"{FORMAT_FILE} names unknown recipe {recipe!r}: the recipes are {', '.join(RECIPES)}")
    source, tensors = doc.get("source"), doc.get("tensors")
    if not isinstance(source, dict) or not isinstance(source.get("sha256"), str) or not isinstance(source.get("files"), list):
        raise FormatError(f"{FORMAT_FILE} has no valid 'source' object (sha256, files)")
    if not isinstance(tensors, dict):
        raise FormatError(f"{FORMAT_FILE} has no valid 'tensors' object")
    return LqFormat(recipe, {n: _tensor(n, e) for n, e in tensors.items()}, source["sha256"],
                    tuple(map(str, source["files"])))


def _tensor(name: str, entry: object) -> LqTensor:
    bits = entry.get("bits") if isinstance(entry, dict) else None
    shape = entry.get("shape") if isinstance(entry, dict) else None
    if not (bits == BF16 or (type(bits) is int and bits in layout.WIDTHS)):
        raise FormatError(f"{FORMAT_FILE}: tensor {name!r} has bits {bits!r}, not one of "
                          f"{', '.join(map(str, layout.WIDTHS))} or {BF16!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise FormatError(f"{FORMAT_FILE}: tensor {name!r} has an invalid shape {shape!r}")
    if bits != BF16 and not layout.quantizable(tuple(shape)):
        raise FormatError(f"{FORMAT_FILE}: tensor {name!r} of shape {shape} cannot be stored at {bits} bits")
    return LqTensor(bits, tuple(shape))


def stored_specs(fmt: LqFormat, expected: dict[str, TensorSpec]) -> dict[str, TensorSpec]:
    """What the shards must hold for the model's tensors `expected` (logical specs): the packed U8
    spec of each quantized one, the logical spec of the others. FormatError for a tensor the format
    file does not list, or lists with another shape."""
    out = {}
    for name, spec in expected.items():
        t = fmt.tensors.get(name)
        if t is None:
            raise FormatError(f"{FORMAT_FILE} does not list tensor {name!r}")
        if t.shape != spec.shape:
            raise FormatError(f"{FORMAT_FILE}: tensor {name!r} has shape {list(t.shape)}, but config.json "
                              f"makes it {list(spec.shape)}")
        out[name] = t.stored_spec(spec)
    return out


def dequantize(stored: np.ndarray, t: LqTensor) -> np.ndarray:
    """The fp32 tensor [.., N, K] that a stored (uint8, `packed_shape`) tensor stands for."""
    n, k = t.shape[-2:]
    out = np.empty(t.shape, dtype=np.float32)
    flat_out, flat_in = out.reshape(-1, n, k), stored.reshape(-1, stored.shape[-1])
    for e in range(len(flat_in)):
        flat_out[e] = layout.dequantize(flat_in[e], n, k, t.bits)
    return out


def scales(stored: np.ndarray, t: LqTensor) -> np.ndarray:
    """The fp16 scales [.., N, K/64] of a stored tensor (no codes decoded)."""
    n, k = t.shape[-2:]
    flat = stored.reshape(-1, stored.shape[-1])
    return np.stack([layout.packed_scales(flat[e], n, k, t.bits) for e in range(len(flat))]).reshape(t.scale_shape)
