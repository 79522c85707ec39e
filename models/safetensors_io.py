"""The safetensors container, read and written by hand so that every problem gets a precise error.

Layout: 8-byte little-endian header length N, N bytes of JSON (`{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}`, padded with spaces to a multiple of 8), then
the data area; offsets are relative to the start of the data area (byte 8 + N).

`read_header(path)` validates the container itself (length, JSON, entry fields, offsets against the
dtype and shape and against the file size) and raises `SafetensorsError` with one line naming the
file and tensor. What a model expects of the tensors is checked by `lampo.models.checkpoint`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from lampo.models.json_quote import quote_json, quote_name

# Bytes per element of every safetensors dtype.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's own limit
METADATA_KEY = "__metadata__"


class SafetensorsError(ValueError):
    """A malformed safetensors file; the message is one line naming the file (and tensor)."""


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor lives: absolute byte range [start, end) in `path`."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> list[StoredTensor]:
    """Parse and validate one file's header; tensors in data-offset order. Reads no tensor data."""
    path = Path(path)
    fname = path.name

    def fail(msg: str) -> SafetensorsError:
        return SafetensorsError(f"{fname}: {msg}")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise fail(f"file is {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise fail(f"bad header: header length {n} does not fit the {size}-byte file")
            raw = f.read(n)
    except OSError as e:
        raise fail(f"cannot read ({e.strerror or e})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise fail("bad header: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # not UTF-8, JSONDecodeError, an integer literal of over 4,300 digits
        raise fail(f"bad header: not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise fail("bad header: JSON is not an object")

    data_start = 8 + n
    out: list[StoredTensor] = []
    for name, entry in header.items():
        if name == METADATA_KEY:
            continue
        out.append(_parse_entry(fname, path, name, entry, data_start, size))
    out.sort(key=lambda t: (t.start, t.end))
    for prev, cur in zip(out, out[1:]):
        if cur.start < prev.end:
            raise fail(f"bad header: tensors {quote_name(prev.name)} and {quote_name(cur.name)} overlap")
    return out


def _parse_entry(fname: str, path: Path, name: str, entry: object, data_start: int, size: int) -> StoredTensor:
    def fail(msg: str) -> SafetensorsError:
        return SafetensorsError(f"{fname}: tensor {quote_name(name)} {msg}")

    if not isinstance(entry, dict):
        raise fail(f"has a header entry that is not an object ({quote_json(entry)})")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise fail(f"has unknown dtype {quote_json(dtype)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise fail(f"has an invalid shape {quote_json(shape)}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise fail(f"has invalid data_offsets {quote_json(offsets)}")
    need = math.prod(shape) * DTYPE_BYTES[dtype]
    if offsets[1] - offsets[0] != need:
        raise fail(
            f"has data_offsets spanning {offsets[1] - offsets[0]} bytes, "
            f"but {dtype} {quote_json(shape)} needs {need} bytes"
        )
    start, end = data_start + offsets[0], data_start + offsets[1]
    if end > size:
        raise fail(f"is truncated: it needs bytes up to {end} but the file has only {size} bytes")
    return StoredTensor(name, path, dtype, tuple(shape), start, end)


def build_header(tensors: Iterable[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None = None) -> tuple[bytes, list[int]]:
    """Header bytes (length prefix + padded JSON) for tensors laid out back to back in the given
    order, and each tensor's offset relative to the data area. `tensors`: (name, dtype, shape)."""
    entries: dict[str, object] = {METADATA_KEY: metadata or {"format": "pt"}}
    offsets: list[int] = []
    pos = 0
    for name, dtype, shape in tensors:
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        offsets.append(pos)
        pos += nbytes
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, offsets
