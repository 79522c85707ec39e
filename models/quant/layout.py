"""The LQ tile layout: the packed bytes of one quantized matrix, as the GPU kernels read them.

A matrix W [N, K] (N a multiple of 16, K of 64) at `bits` b in {4, 5, 6} is cut into tiles of 16
rows x 64 columns. Each row of a tile holds one group of 64 weights with one fp16 scale, and

    W[n, k] = scale[n, k // 64] * (code[n, k] - 2**(b-1)),   code in [0, 2**b)

Tiles are stored row-strip by row-strip (tile (r, c) at index r * K/64 + c), each
`tile_bytes(b)` = 512 + 128 (b - 4) + 32 bytes (16-byte aligned):

- [0, 512): the low 4 bits of every code, in the order of the mma.sync m16n8k16 A fragment, so
  that lane t of a warp reads its 16 bytes with one load and holds exactly its fragment for the
  tile's four k16 steps. Lane t (g = t // 4, quad = t % 4) owns, for step j, the elements
      e = 0,1: (row g,   col 16j + 2quad + {0,1})     e = 2,3: (row g+8, same cols)
      e = 4,5: (row g,   col 16j + 2quad + 8 + {0,1}) e = 6,7: (row g+8, same cols)
  whose low nibbles form the 32-bit word at byte 16t + 4j: element 2s at nibble s, element
  2s+1 at nibble s+4, so `(word >> 4s) & 0x000F000F` is fragment register s as two halves.
- b = 5: [512, 640): the fifth bit, one 32-bit word per lane (byte 4t): for step j and register
  s (i = 4j + s) bit i belongs to element 2s and bit 16 + i to element 2s + 1.
  b = 6: [512, 768): bits 4-5, two words per lane (byte 8t + 4u, u = i // 8, i' = i % 8): bits
  2i'..2i'+1 of word u belong to element 2s, bits 16 + 2i'.. to element 2s + 1.
- the last 32 bytes: the tile's 16 fp16 scales, row by row.

Every register comes out of the bytes with a shift and a mask (no branches, no tables); the
fifth and sixth bits with one more shift, mask and or.

The engine keeps a dense SwiGLU gate|up block with its two halves' rows interleaved by 8
(`interleave_halves`): each tile then holds 8 gate rows and the up rows of the same outputs, rows g
and g + 8 of one lane's fragment, so the GEMV's lane has both factors of silu(gate) * up in its
accumulators.
"""

from __future__ import annotations

import numpy as np

TILE_ROWS = 16
TILE_COLS = 64  # one scale group
WIDTHS = (4, 5, 6)
LANES = 32
STEPS = 4  # k16 steps per tile


def tile_bytes(bits: int) -> int:
    check_bits(bits)
    return 512 + 128 * (bits - 4) + 2 * TILE_ROWS


def bits_per_weight(bits: int) -> float:
    return tile_bytes(bits) * 8 / (TILE_ROWS * TILE_COLS)


def packed_bytes(rows: int, cols: int, bits: int) -> int:
    check_shape(rows, cols)
    return (rows // TILE_ROWS) * (cols // TILE_COLS) * tile_bytes(bits)


def check_bits(bits: int) -> None:
    if bits not in WIDTHS:
        raise ValueError(f"LQ widths are {', '.join(map(str, WIDTHS))} bits, not {bits}")


def check_shape(rows: int, cols: int) -> None:
    if rows <= 0 or cols <= 0 or rows % TILE_ROWS or cols % TILE_COLS:
        raise ValueError(f"an LQ matrix has rows a multiple of {TILE_ROWS} and columns a multiple of "
                         f"{TILE_COLS}, not [{rows}, {cols}]")


def quantizable(shape: tuple[int, ...]) -> bool:
    """Whether a matrix (or a bank of matrices, [E, N, K]) fits the tile grid."""
    return len(shape) in (2, 3) and shape[-2] % TILE_ROWS == 0 and shape[-1] % TILE_COLS == 0


def _fragment_coordinates() -> tuple[np.ndarray, np.ndarray]:
    """(row, col) within a tile of element e of lane t at step j: two [32, 4, 8] arrays."""
    t = np.arange(LANES)[:, None, None]
    j = np.arange(STEPS)[None, :, None]
    e = np.arange(8)[None, None, :]
    g, quad = t // 4, t % 4
    row = g + 8 * ((e // 2) % 2)
    col = 16 * j + 2 * quad + 8 * (e // 4) + e % 2
    return np.broadcast_to(row, (LANES, STEPS, 8)), np.broadcast_to(col, (LANES, STEPS, 8))


FRAG_ROW, FRAG_COL = _fragment_coordinates()
# nibble position of element e in its word: element 2s at s, 2s+1 at s+4
NIBBLE = np.array([0, 4, 1, 5, 2, 6, 3, 7])
# element e's bit offset within its half (0 for the low half, 16 for the high half) and register s
HALF = np.array([0, 16, 0, 16, 0, 16, 0, 16])
REGISTER = np.array([0, 0, 1, 1, 2, 2, 3, 3])


def _tiles(a: np.ndarray) -> np.ndarray:
    """[N, K] -> [N/16, K/64, 16, 64]."""
    n, k = a.shape
    return a.reshape(n // TILE_ROWS, TILE_ROWS, k // TILE_COLS, TILE_COLS).swapaxes(1, 2)


def pack(codes: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """codes [N, K] (integers in [0, 2**bits)), scales [N, K/64] (fp16) -> packed uint8 bytes."""
    check_bits(bits)
    n, k = codes.shape
    check_shape(n, k)
    if scales.shape != (n, k // TILE_COLS):
        raise ValueError(f"scales of a [{n}, {k}] matrix are [{n}, {k // TILE_COLS}], not {list(scales.shape)}")
    codes = codes.astype(np.uint32)
    if codes.size and int(codes.max()) >= 1 << bits:
        raise ValueError(f"a {bits}-bit code is below {1 << bits}")
    frag = _tiles(codes)[:, :, FRAG_ROW, FRAG_COL]  # [R, C, 32, 4, 8]
    low = (frag & 0xF) << (4 * NIBBLE)
    words = np.ascontiguousarray(np.bitwise_or.reduce(low, axis=-1), dtype="<u4")  # [R, C, 32, 4]
    parts = [words.view(np.uint8).reshape(*words.shape[:2], 512)]
    i = 4 * np.arange(STEPS)[:, None] + REGISTER[None, :]  # [4, 8]: i = 4j + s of each element
    if bits == 5:
        high = ((frag >> 4) & 1) << (i + HALF)
        hwords = np.ascontiguousarray(np.bitwise_or.reduce(high.reshape(*frag.shape[:3], 32), axis=-1), dtype="<u4")
        parts.append(hwords.view(np.uint8).reshape(*frag.shape[:2], 128))
    elif bits == 6:
        u, ip = i // 8, i % 8
        high = ((frag >> 4) & 3) << (2 * ip + HALF)  # [R, C, 32, 4, 8]
        hwords = np.zeros((*frag.shape[:3], 2), dtype=np.uint32)
        for word in (0, 1):
            mine = np.where(u == word, high, 0)
            hwords[..., word] = np.bitwise_or.reduce(mine.reshape(*frag.shape[:3], 32), axis=-1)
        parts.append(np.ascontiguousarray(hwords, dtype="<u4").view(np.uint8).reshape(*frag.shape[:2], 256))
    s = _tiles(scales.astype("<f2").reshape(n, k // TILE_COLS, 1).repeat(TILE_COLS, axis=2)
               .reshape(n, k))[:, :, :, 0]  # [R, C, 16]
    parts.append(np.ascontiguousarray(s).view(np.uint8).reshape(*s.shape[:2], 32))
    return np.concatenate(parts, axis=-1).reshape(-1)


def unpack(packed: np.ndarray, rows: int, cols: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `pack`: (codes [N, K] uint8, scales [N, K/64] fp16)."""
    check_bits(bits)
    size = packed_bytes(rows, cols, bits)
    if packed.dtype != np.uint8 or packed.size != size:
        raise ValueError(f"a [{rows}, {cols}] matrix at {bits} bits packs into {size:,} bytes, "
                         f"not {packed.size:,} of {packed.dtype}")
    r, c = rows // TILE_ROWS, cols // TILE_COLS
    tiles = packed.reshape(r, c, tile_bytes(bits))
    words = np.ascontiguousarray(tiles[:, :, :512]).view("<u4").reshape(r, c, LANES, STEPS, 1)
    frag = (words >> (4 * NIBBLE).astype(np.uint32)) & 0xF  # [R, C, 32, 4, 8]
    i = (4 * np.arange(STEPS)[:, None] + REGISTER[None, :]).astype(np.uint32)
    half = HALF.astype(np.uint32)
    if bits == 5:
        h = np.ascontiguousarray(tiles[:, :, 512:640]).view("<u4").reshape(r, c, LANES, 1, 1)
        frag |= ((h >> (i + half)) & 1) << 4
    elif bits == 6:
        h = np.ascontiguousarray(tiles[:, :, 512:768]).view("<u4").reshape(r, c, LANES, 2)
        hw = np.where(i // 8 == 0, h[..., 0, None, None], h[..., 1, None, None])
        frag |= ((hw >> (2 * (i % 8) + half)) & 3) << 4
    codes = np.zeros((r, c, TILE_ROWS, TILE_COLS), dtype=np.uint8)
    codes[:, :, FRAG_ROW, FRAG_COL] = frag
    return codes.swapaxes(1, 2).reshape(rows, cols), packed_scales(packed, rows, cols, bits)


def packed_scales(packed: np.ndarray, rows: int, cols: int, bits: int) -> np.ndarray:
    """Only the scales of the packed bytes (no codes decoded): fp16 [N, K/64]."""
    r, c = rows // TILE_ROWS, cols // TILE_COLS
    tiles = packed.reshape(r, c, tile_bytes(bits))
    s = np.ascontiguousarray(tiles[:, :, tile_bytes(bits) - 2 * TILE_ROWS:]).view("<f2").reshape(r, c, TILE_ROWS)
    return s.swapaxes(1, 2).reshape(rows, c).astype(np.float16)


def interleaved_rows(rows: int) -> np.ndarray:
    """Row order of a gate|up block [rows, ...] (gate rows, then up rows) with its halves interleaved
    by 8: position 16j + r holds gate row 8j + r, position 16j + 8 + r up row 8j + r (r < 8)."""
    if rows <= 0 or rows % (2 * TILE_ROWS):
        raise ValueError(f"a gate|up block of LQ strips has rows a multiple of {2 * TILE_ROWS}, not {rows}")
    gate = np.arange(rows // 2).reshape(-1, TILE_ROWS // 2)
    return np.concatenate([gate, gate + rows // 2], axis=1).reshape(-1)


def interleave_halves(packed: np.ndarray, rows: int, cols: int, bits: int) -> np.ndarray:
    """The packed bytes of a gate|up block [rows, cols] with its rows in `interleaved_rows` order."""
    codes, scales = unpack(packed, rows, cols, bits)
    order = interleaved_rows(rows)
    return pack(codes[order], scales[order], bits)


def dequantize(packed: np.ndarray, rows: int, cols: int, bits: int) -> np.ndarray:
    """The matrix the packed bytes stand for, fp32 [N, K]."""
    codes, scales = unpack(packed, rows, cols, bits)
    return values(codes, scales, bits)


def values(codes: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """scale * (code - 2**(bits-1)) in fp32."""
    centred = codes.astype(np.float32) - np.float32(1 << (bits - 1))
    return (centred.reshape(scales.shape[0], -1, TILE_COLS) * scales.astype(np.float32)[:, :, None]
            ).reshape(codes.shape)
