"""The LQ format made and unmade on the GPU (lampo._native_ops: native/src/weights/lq_quantize.cu)
against numpy (models/quant/quantizer.py, models/quant/layout.py).

lq_quantize is meant to be bit-identical to layout.pack(*quantizer.quantize(w, bits), bits) for
bf16 weights (every fp32 step is the same IEEE operation, the refit's dot product is exact, the
squared errors are summed in numpy's order). The only tolerated difference is the choice between
two candidate scales whose squared errors tie to the last bits: at least 99.9% of the groups
identical, and every other group's squared error within 1e-6 (relative) of numpy's. lq_dequantize
is exact: bf16 of layout.values. lq_fill_random is checked for its distribution and its seeding.
lq_place_half puts the two halves of a gate|up block where layout.interleave_halves does.
test_zz_lq_quant_timings prints the quantize-on-load throughput (never asserted).
"""

from __future__ import annotations

import numpy as np
import pytest

from lampo.models.bf16 import from_bf16, to_bf16
from lampo.models.quant import layout, quantizer

from .test_ops_core import rng_for


def gaussian(rng, shape):
    return rng.standard_normal(shape) * 0.02


def student_t(rng, shape):
    return rng.standard_t(3, shape) * 0.02


def zero_groups(rng, shape):
    """Gaussian rows with whole groups of +0, of -0, and groups with a single non-zero weight."""
    w = rng.standard_normal(shape) * 0.02
    w[0::3, :64] = 0.0
    w[1::3, -64:] = -0.0
    w[2::3, :64] = 0.0
    w[2::3, 5] = 0.5
    return w


def tiny(rng, shape):
    """Group scales near and below the smallest fp16 (rounded to zero or subnormal), and bf16 subnormals."""
    mag = 10.0 ** rng.choice([-5.0, -7.0, -9.0, -30.0, -39.0], (shape[0], shape[1] // 64, 1))
    return (rng.standard_normal((shape[0], shape[1] // 64, 64)) * mag).reshape(shape)


def huge(rng, shape):
    """Group scales past the largest fp16 (clamped to +-65504), up to near the largest bf16."""
    mag = 10.0 ** rng.choice([4.0, 6.0, 20.0, 37.0], (shape[0], shape[1] // 64, 1))
    return (rng.standard_normal((shape[0], shape[1] // 64, 64)) * mag).reshape(shape)


def few_levels(rng, shape):
    """Weights on a few levels: exact rounding ties and candidates with equal errors."""
    return rng.integers(-3, 4, shape) * 0.25


WEIGHTS = {f.__name__: f for f in (gaussian, student_t, zero_groups, tiny, huge, few_levels)}


def bf16_weights(name: str, shape: tuple[int, int], bits: int) -> np.ndarray:
    rng = rng_for("lq_quantize", name, shape, bits)
    return to_bf16(WEIGHTS[name](rng, shape).astype(np.float32))


def squared_errors(w: np.ndarray, codes: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """Per group (rows x groups), in fp64."""
    d = w.astype(np.float64) - layout.values(codes, scales, bits).astype(np.float64)
    return np.square(d).reshape(w.shape[0], -1, layout.TILE_COLS).sum(axis=-1)


def check_matches_quantizer(packed: np.ndarray, w_bits: np.ndarray, bits: int, what: str) -> None:
    w = from_bf16(w_bits)
    rows, cols = w.shape
    with np.errstate(all="ignore"):
        codes, scales = quantizer.quantize(w, bits)
    want = layout.pack(codes, scales, bits)
    assert packed.dtype == np.uint8 and packed.shape == want.shape, (what, packed.dtype, packed.shape)
    if np.array_equal(packed, want):
        return
    got_codes, got_scales = layout.unpack(packed, rows, cols, bits)
    same = ((got_codes == codes).reshape(rows, -1, layout.TILE_COLS).all(axis=-1)
            & (got_scales.view(np.uint16) == scales.view(np.uint16)))
    assert same.mean() >= 0.999, f"{what}: {(~same).sum()} of {same.size} groups differ from numpy"
    err_got = squared_errors(w, got_codes, got_scales, bits)[~same]
    err_want = squared_errors(w, codes, scales, bits)[~same]
    worst = np.abs(err_got - err_want) - 1e-6 * err_want
    assert (worst <= 0).all(), (f"{what}: {(~same).sum()} groups differ, worst squared error "
                                f"{err_got[worst.argmax()]:.9g} vs numpy's {err_want[worst.argmax()]:.9g}")
    assert np.array_equal(packed, layout.pack(got_codes, got_scales, bits)), f"{what}: bytes off the layout"


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("name, shape", [
    ("gaussian", (16, 64)),
    ("gaussian", (48, 192)),
    ("gaussian", (512, 2048)),
    ("student_t", (48, 192)),
    ("student_t", (256, 1024)),
    ("zero_groups", (48, 192)),
    ("tiny", (64, 512)),
    ("huge", (64, 512)),
    ("few_levels", (48, 192)),
])
def test_lq_quantize_matches_numpy(ops, bits, name, shape):
    w = bf16_weights(name, shape, bits)
    check_matches_quantizer(ops.lq_quantize(w, bits), w, bits, f"lq_quantize {name} {list(shape)} bits={bits}")


def random_codes_and_scales(rng, rows: int, cols: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Random codes; scales of both signs over fp16's range: zeros, subnormals, +-65504."""
    codes = rng.integers(0, 1 << bits, (rows, cols)).astype(np.uint8)
    scales = (rng.standard_normal((rows, cols // 64)) * 10.0 ** rng.integers(-6, 4, (rows, cols // 64)))
    special = np.array([0.0, -0.0, 6e-8, -3e-6, 65504.0, -65504.0], np.float32)
    flat = scales.reshape(-1)
    flat[: min(flat.size, special.size)] = special[: flat.size]
    return codes, scales.astype(np.float16)


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("rows, cols", [(16, 64), (48, 192), (512, 2048)])
def test_lq_dequantize_is_exact(ops, bits, rows, cols):
    rng = rng_for("lq_dequantize", bits, rows, cols)
    codes, scales = random_codes_and_scales(rng, rows, cols, bits)
    got = ops.lq_dequantize(layout.pack(codes, scales, bits), rows, cols, bits)
    want = to_bf16(layout.values(codes, scales, bits))
    assert got.dtype == np.uint16 and got.shape == (rows, cols)
    bad = got != want
    assert not bad.any(), f"lq_dequantize bits={bits}: {bad.sum()} of {bad.size} differ, first at {np.argwhere(bad)[0]}"


@pytest.mark.parametrize("bits", layout.WIDTHS)
def test_lq_quantize_then_dequantize(ops, bits):
    w = bf16_weights("student_t", (128, 512), bits)
    packed = ops.lq_quantize(w, bits)
    codes, scales = layout.unpack(packed, 128, 512, bits)
    assert np.array_equal(ops.lq_dequantize(packed, 128, 512, bits), to_bf16(layout.values(codes, scales, bits)))


@pytest.mark.parametrize("bits", layout.WIDTHS)
def test_lq_fill_random(ops, bits):
    rows, cols, std = 512, 2048, 0.02
    packed = ops.lq_fill_random(rows, cols, bits, std, 7)
    assert packed.dtype == np.uint8 and packed.size == layout.packed_bytes(rows, cols, bits)
    codes, scales = layout.unpack(packed, rows, cols, bits)
    counts = np.bincount(codes.reshape(-1), minlength=1 << bits)
    assert counts.size == 1 << bits and counts.min() > 0, counts
    assert np.abs(counts / counts.mean() - 1).max() < 0.05, counts  # >= 16k draws per code
    s = scales.astype(np.float64)
    mid = std / np.sqrt((4.0**bits - 1) / 12)
    assert (s >= 0.9 * mid * (1 - 1e-3)).all() and (s <= 1.1 * mid * (1 + 1e-3)).all(), (s.min(), s.max(), mid)
    assert abs(s.std() / mid - 0.1 / np.sqrt(3)) < 0.01  # uniform over +-10%
    assert abs(layout.values(codes, scales, bits).std() / std - 1) < 0.02
    assert np.array_equal(ops.lq_fill_random(rows, cols, bits, std, 7), packed)
    other = ops.lq_fill_random(rows, cols, bits, std, 8)
    assert (other != packed).mean() > 0.9


@pytest.mark.parametrize("call, message", [
    (lambda ops: ops.lq_quantize(np.zeros((16, 64), np.uint16), 7), "lq_quantize: bits must be 4, 5 or 6"),
    (lambda ops: ops.lq_quantize(np.zeros((24, 64), np.uint16), 4), r"lq_quantize: W must be \[16n, 64k\]"),
    (lambda ops: ops.lq_quantize(np.zeros((16, 96), np.uint16), 4), r"lq_quantize: W must be \[16n, 64k\]"),
    (lambda ops: ops.lq_quantize(np.zeros((0, 64), np.uint16), 4), r"lq_quantize: W must be \[16n, 64k\]"),
    (lambda ops: ops.lq_quantize(np.zeros(64, np.uint16), 4), "lq_quantize: w must have 2 dims"),
    (lambda ops: ops.lq_dequantize(np.zeros(100, np.uint8), 16, 64, 4), "lq_dequantize: packed: size"),
    (lambda ops: ops.lq_dequantize(np.zeros(544, np.uint8), 16, 64, 3), "lq_dequantize: bits must be 4, 5 or 6"),
    (lambda ops: ops.lq_dequantize(np.zeros(544, np.uint8), -16, 64, 4), r"lq_dequantize: W must be \[16n, 64k\]"),
    (lambda ops: ops.lq_fill_random(16, 64, 4, 0.0, 1), "lq_fill_random: weight_std must be > 0"),
    (lambda ops: ops.lq_fill_random(16, 64, 4, 1e9, 1), "lq_fill_random: weight_std must be > 0"),
    (lambda ops: ops.lq_fill_random(16, 32, 4, 0.02, 1), r"lq_fill_random: W must be \[16n, 64k\]"),
    (lambda ops: ops.bench_lq_quantize(16, 64, 9, 1), "lq_quantize: bits must be 4, 5 or 6"),
])
def test_lq_quant_refuses_bad_arguments(ops, call, message):
    with pytest.raises(ValueError, match=message):
        call(ops)


def test_zz_lq_quant_timings(ops):
    lines = []
    for rows, cols, what in ((248_320, 2048, "LM head"), (34_816, 5120, "27B gate|up")):
        cells = []
        for bits in layout.WIDTHS:
            r = ops.bench_lq_quantize(rows, cols, bits, 3)
            cells.append(f"q{bits} {r['ms']:7.2f} ms {r['GBps']:6.1f} GB/s")
        lines.append(f"lq_quantize [{rows},{cols}] ({what}): " + " | ".join(cells))
    print("\n" + "\n".join(lines))


@pytest.mark.parametrize("bits", layout.WIDTHS)
@pytest.mark.parametrize("up_first", [False, True])
def test_placed_halves_are_the_interleaved_block(ops, bits, up_first):
    """Each half placed in pieces of whole strips, in either order, over a block of garbage: the
    bytes of layout.interleave_halves of the gate|up block."""
    rng = rng_for("lq_place_half", bits, up_first)
    half, cols = 48, 192  # three strips a half
    codes = rng.integers(0, 1 << bits, (2 * half, cols)).astype(np.uint8)
    scales = rng.standard_normal((2 * half, cols // 64)).astype(np.float16)
    gate = layout.pack(codes[:half], scales[:half], bits)
    up = layout.pack(codes[half:], scales[half:], bits)
    block = rng.integers(0, 256, layout.packed_bytes(2 * half, cols, bits)).astype(np.uint8)
    strip = layout.packed_bytes(16, cols, bits)
    for h in ((1, 0) if up_first else (0, 1)):
        part = (gate, up)[h]
        block = ops.lq_place_half(block, part[:strip], 0, cols, bits, h)  # pieces of 1 and 2 strips
        block = ops.lq_place_half(block, part[strip:], 1, cols, bits, h)
    want = layout.interleave_halves(np.concatenate([gate, up]), 2 * half, cols, bits)
    np.testing.assert_array_equal(block, want)
