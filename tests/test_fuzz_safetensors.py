"""Hostile input to the safetensors header parser (`read_header`), fuzzed with Hypothesis: arbitrary
bytes, headers built from strategies (wrong types, offsets, shapes, dtypes, huge numbers,
overlapping ranges), and valid files truncated at every length. The only outcomes allowed are a
valid result (every tensor inside the file, sized by its dtype and shape, none overlapping) or one
`SafetensorsError` line naming the file; never another exception."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lampo.models.safetensors_io import DTYPE_BYTES, SafetensorsError, StoredTensor, build_header, read_header

MAX_MESSAGE = 400  # a message quotes values cut short, never a whole hostile header


@pytest.fixture(scope="module")
def st_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-safetensors") / "model.safetensors"


def _outcome(path: Path, data: bytes, write: bool = True) -> list[StoredTensor] | None:
    """read_header of a file holding `data` (written first unless `write` is False: the file holds
    it already): the tensors (checked for consistency), or None after a well-formed
    SafetensorsError."""
    if write:
        path.write_bytes(data)
    try:
        tensors = read_header(path)
    except SafetensorsError as e:
        msg = str(e)
        assert msg.startswith(f"{path.name}: ") and "\n" not in msg and len(msg) <= MAX_MESSAGE, msg
        return None
    (n,) = struct.unpack("<Q", data[:8])
    for t in tensors:
        assert 8 + n <= t.start <= t.end <= len(data)
        assert t.nbytes == math.prod(t.shape) * DTYPE_BYTES[t.dtype]
    for prev, cur in zip(tensors, tensors[1:]):
        assert prev.end <= cur.start
    return tensors


def _with_header(header: object, data_len: int, pad: bool = True) -> bytes:
    try:
        text = json.dumps(header, allow_nan=True).encode("utf-8")
    except (ValueError, RecursionError):
        text = b"{"
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(data_len)


# ---- strategies --------------------------------------------------------------------------------
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=12)
big_ints = st.sampled_from([0, 1, 2, 7, 8, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**30, -1, -(2**63)])
ints = st.integers(min_value=-3, max_value=64) | big_ints
dtypes = st.sampled_from(sorted(DTYPE_BYTES)) | st.sampled_from(["bf16", "F128", "", "I4"]) | json_values
shapes = st.lists(ints, max_size=4) | st.lists(ints | json_scalars, max_size=3) | json_values
offsets = st.lists(ints, min_size=2, max_size=2) | st.lists(ints, max_size=3) | json_values


@st.composite
def entries(draw) -> object:
    """A header entry: mostly well-formed objects with hostile parts, sometimes anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    entry = {"dtype": draw(dtypes), "shape": draw(shapes), "data_offsets": draw(offsets)}
    for key in draw(st.sets(st.sampled_from(sorted(entry)), max_size=1)):
        del entry[key]
    return entry


@st.composite
def consistent_entry(draw, pos: int) -> dict:
    """A well-formed entry placed at or near `pos` (so neighbours may overlap or leave gaps)."""
    dtype = draw(st.sampled_from(sorted(DTYPE_BYTES)))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    start = max(0, pos + draw(st.integers(-8, 8)))
    end = start + math.prod(shape) * DTYPE_BYTES[dtype]
    return {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}


@st.composite
def headers(draw) -> tuple[dict, int]:
    header: dict[str, object] = {}
    pos = 0
    for i in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            entry = draw(consistent_entry(pos))
            pos = entry["data_offsets"][1]
        else:
            entry = draw(entries())
        header[draw(st.text(max_size=5)) + str(i)] = entry
    if draw(st.booleans()):
        header["__metadata__"] = draw(json_values)
    return header, max(0, pos + draw(st.integers(-16, 16)))


@st.composite
def valid_files(draw) -> bytes:
    dtype, shape = st.sampled_from(sorted(DTYPE_BYTES)), st.lists(st.integers(0, 4), max_size=3)
    tensors = [(f"t{i}", draw(dtype), tuple(draw(shape))) for i in range(draw(st.integers(1, 4)))]
    head, _ = build_header(tensors)
    data = b"".join(bytes(math.prod(s) * DTYPE_BYTES[d]) for _, d, s in tensors)
    return head + data


# ---- properties --------------------------------------------------------------------------------
@given(st.binary(max_size=256))
def test_arbitrary_bytes(st_file: Path, data: bytes):
    _outcome(st_file, data)


@given(st.binary(max_size=64), st.integers(0, 2**64 - 1))
def test_arbitrary_header_length(st_file: Path, body: bytes, n: int):
    _outcome(st_file, struct.pack("<Q", n) + body)


@given(json_values, st.integers(0, 64))
def test_arbitrary_json_header(st_file: Path, header: object, data_len: int):
    _outcome(st_file, _with_header(header, data_len))


@given(headers(), st.booleans())
def test_hostile_entries(st_file: Path, header_and_len: tuple[dict, int], pad: bool):
    header, data_len = header_and_len
    _outcome(st_file, _with_header(header, data_len, pad))


@given(st.text(max_size=64))
def test_arbitrary_header_text(st_file: Path, text: str):
    raw = text.encode("utf-8", "surrogatepass")
    _outcome(st_file, struct.pack("<Q", len(raw)) + raw)


@given(valid_files())
def test_truncation_at_every_length(st_file: Path, data: bytes):
    full = _outcome(st_file, data)
    assert full is not None
    needed = max([8 + struct.unpack("<Q", data[:8])[0]] + [t.end for t in full])
    for length in reversed(range(len(data))):  # cutting the file down in place: one syscall a length
        os.truncate(st_file, length)
        assert (_outcome(st_file, data[:length], write=False) is not None) == (length >= needed)


@pytest.mark.parametrize("header", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a": {"dtype": "F32", "shape": [1' + b"0" * 5000 + b'], "data_offsets": [0, 4]}}',
    b'{"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}',
    b'{"a": {"dtype": {"F32": 1}, "shape": [1], "data_offsets": [0, 4]}}',
    b'{"a": {"dtype": "F32", "shape": [' + b"1, " * 2000 + b'-1], "data_offsets": [0, 4]}}',
], ids=["deeply-nested", "5000-digit-int", "list-dtype", "object-dtype", "long-shape"])
def test_known_hostile_headers(st_file: Path, header: bytes):
    header += b" " * (-len(header) % 8)
    assert _outcome(st_file, struct.pack("<Q", len(header)) + header + bytes(8)) is None
