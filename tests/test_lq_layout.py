"""The LQ tile layout as a GPU lane reads it (models/quant/layout.py).

The emulated lane below follows the format's description, not `pack`'s code: it loads its 16
bytes of low nibbles (and its fifth/sixth-bit words) from the packed bytes, builds each mma.sync
m16n8k16 A-fragment register with the documented shifts and masks, and must find the codes of
the elements that PTX assigns to that lane and register."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lampo.models.quant import layout

MAGIC = 0x43004300  # bf16 128.0 in both halves: (MAGIC | code) is 128 + code


def ptx_a_fragment(lane: int) -> list[tuple[int, int]]:
    """(row, col) of A-fragment elements a0..a7 of m16n8k16 (PTX ISA, `mma.m16n8k16` .bf16)."""
    group, quad = lane // 4, lane % 4
    out = []
    for i in range(8):
        row = group + 8 * ((i // 2) % 2)
        col = 2 * quad + (i % 2) + 8 * (i // 4)
        out.append((row, col))
    return out


def shift(word: int, by: int) -> int:
    return (word >> by if by >= 0 else word << -by) & 0xFFFFFFFF


def lane_registers(tile: bytes, bits: int, lane: int, step: int) -> list[int]:
    """The four A registers of `lane` at k16 `step`, built from the tile's bytes as a kernel does."""
    word = int.from_bytes(tile[16 * lane + 4 * step: 16 * lane + 4 * step + 4], "little")
    regs = []
    for s in range(4):
        reg = (shift(word, 4 * s) & 0x000F000F) | MAGIC
        i = 4 * step + s
        if bits == 5:
            high = int.from_bytes(tile[512 + 4 * lane: 512 + 4 * lane + 4], "little")
            reg |= shift(high, i - 4) & 0x00100010
        elif bits == 6:
            u, ip = divmod(i, 8)
            high = int.from_bytes(tile[512 + 8 * lane + 4 * u: 512 + 8 * lane + 4 * u + 4], "little")
            reg |= shift(high, 2 * ip - 4) & 0x00300030
        regs.append(reg)
    return regs


@pytest.mark.parametrize("bits", layout.WIDTHS)
def test_every_lane_finds_its_fragment_in_its_bytes(bits):
    rng = np.random.default_rng(bits)
    rows, cols = 32, 128
    codes = rng.integers(0, 1 << bits, (rows, cols)).astype(np.uint8)
    scales = rng.standard_normal((rows, cols // 64)).astype(np.float16)
    packed = layout.pack(codes, scales, bits)
    size = layout.tile_bytes(bits)
    for strip in range(rows // 16):
        for tile_col in range(cols // 64):
            start = (strip * (cols // 64) + tile_col) * size
            tile = packed[start:start + size].tobytes()
            block = codes[16 * strip: 16 * strip + 16, 64 * tile_col: 64 * tile_col + 64]
            for lane in range(32):
                coords = ptx_a_fragment(lane)
                for step in range(4):
                    regs = lane_registers(tile, bits, lane, step)
                    for s, reg in enumerate(regs):
                        for half, element in ((0, 2 * s), (1, 2 * s + 1)):
                            row, col = coords[element]
                            value = (reg >> (16 * half)) & 0xFFFF
                            assert value == 0x4300 | int(block[row, 16 * step + col]), (lane, step, s, half)
            scale_bytes = tile[size - 32:]
            assert np.frombuffer(scale_bytes, "<f2").tolist() == \
                scales[16 * strip: 16 * strip + 16, tile_col].tolist()


@pytest.mark.parametrize("bits, size, bpw", [(4, 544, 4.25), (5, 672, 5.25), (6, 800, 6.25)])
def test_tile_sizes_are_16_byte_aligned(bits, size, bpw):
    assert layout.tile_bytes(bits) == size and size % 16 == 0
    assert layout.bits_per_weight(bits) == bpw
    assert layout.packed_bytes(2048, 512, bits) == 128 * 8 * size


def random_codes(seed: int, bits: int, rows: int, tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes [rows, 64 tiles] at `bits` and fp16 scales [rows, tiles]."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << bits, (rows, 64 * tiles)).astype(np.uint8)
    return codes, rng.standard_normal((rows, tiles)).astype(np.float16)


@given(bits=st.sampled_from(layout.WIDTHS), strips=st.integers(1, 3), tiles=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
def test_pack_and_unpack_are_inverse(bits, strips, tiles, seed):
    rows, cols = 16 * strips, 64 * tiles
    codes, scales = random_codes(seed, bits, rows, tiles)
    got_codes, got_scales = layout.unpack(layout.pack(codes, scales, bits), rows, cols, bits)
    assert np.array_equal(got_codes, codes) and np.array_equal(got_scales, scales)


def test_dequantize_is_scale_times_centred_code():
    codes = np.full((16, 64), 3, dtype=np.uint8)
    codes[0, 0] = 15
    scales = np.full((16, 1), 0.5, dtype=np.float16)
    w = layout.dequantize(layout.pack(codes, scales, 4), 16, 64, 4)
    assert w[0, 0] == 0.5 * (15 - 8) and w[1, 1] == 0.5 * (3 - 8)


def test_interleaved_rows_put_each_gate_row_beside_its_up_row():
    order = layout.interleaved_rows(64)  # gate rows 0..31, up rows 32..63
    assert list(order[:16]) == list(range(8)) + list(range(32, 40))
    assert list(order[16:32]) == list(range(8, 16)) + list(range(40, 48))
    assert sorted(order) == list(range(64))


@given(bits=st.sampled_from(layout.WIDTHS), pairs=st.integers(1, 3), tiles=st.integers(1, 2),
       seed=st.integers(0, 2**32 - 1))
def test_interleaved_block_gives_each_lane_a_gate_row_and_its_up_row(bits, pairs, tiles, seed):
    """Lane g of tile strip j holds rows g and g + 8 of its fragment: gate and up row 8j + g."""
    rows, cols = 32 * pairs, 64 * tiles
    codes, scales = random_codes(seed, bits, rows, tiles)
    packed = layout.interleave_halves(layout.pack(codes, scales, bits), rows, cols, bits)
    w = layout.dequantize(packed, rows, cols, bits)
    plain = layout.values(codes, scales, bits)
    for j in range(rows // 16):
        for g in range(8):
            assert np.array_equal(w[16 * j + g], plain[8 * j + g])
            assert np.array_equal(w[16 * j + 8 + g], plain[rows // 2 + 8 * j + g])


@pytest.mark.parametrize("call, message", [
    (lambda: layout.interleaved_rows(48), "multiple of 32"),
    (lambda: layout.tile_bytes(8), "widths are 4, 5, 6"),
    (lambda: layout.packed_bytes(24, 64, 4), "multiple of 16"),
    (lambda: layout.pack(np.zeros((16, 64), np.uint8), np.zeros((16, 2), np.float16), 4), "scales"),
    (lambda: layout.pack(np.full((16, 64), 16, np.uint8), np.zeros((16, 1), np.float16), 4), "below 16"),
    (lambda: layout.unpack(np.zeros(100, np.uint8), 16, 64, 4), "544 bytes"),
])
def test_bad_shapes_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
