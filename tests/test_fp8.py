"""lampo.models.fp8: e4m3 codes, block scales, and config.json's quantization_config."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lampo.models import fp8
from lampo.models.bf16 import from_bf16, to_bf16


def e4m3_value(code: int) -> float:
    """An e4m3 code's value from its fields (sign, 4-bit exponent of bias 7, 3-bit mantissa)."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    return sign * (math.ldexp(m / 8, -6) if e == 0 else math.ldexp(1 + m / 8, e - 7))


def test_decode_every_code():
    codes = np.arange(256, dtype=np.uint8)
    got = fp8.decode_e4m3(codes)
    want = np.array([e4m3_value(int(c)) for c in codes], dtype=np.float32)
    np.testing.assert_array_equal(got, want)  # NaN where NaN, -0.0 kept
    assert np.signbit(got[0x80]) and got[0x7E] == fp8.E4M3_MAX and got[0x01] == 2.0**-9
    assert np.isnan(got[0x7F]) and np.isnan(got[0xFF])


def test_encode_round_trips_every_value_and_rounds_to_nearest_even():
    finite = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    np.testing.assert_array_equal(fp8.encode_e4m3(fp8.decode_e4m3(finite)), finite)
    values = fp8.decode_e4m3(np.arange(0x7F, dtype=np.uint8))
    mids = (values[:-1] + values[1:]) / 2  # exact in float32: each is halfway between two codes
    got = fp8.encode_e4m3(mids)
    low = np.arange(0x7E, dtype=np.uint8)
    np.testing.assert_array_equal(got, np.where(low % 2 == 0, low, low + 1))  # ties to the even code
    np.testing.assert_array_equal(fp8.encode_e4m3(np.nextafter(mids, np.float32(0))), low)
    assert list(fp8.encode_e4m3(np.array([500, -1e9, np.nan, -2.0**-12], np.float32))) == [0x7E, 0xFE, 0x7F, 0x80]


@pytest.mark.parametrize("shape", [(100, 70), (96, 64)])  # blocks cut at the edges, whole blocks
def test_dequantize_is_the_bf16_rounding_of_codes_times_their_block_scale(monkeypatch, shape):
    monkeypatch.setattr(fp8, "_ROWS_PER_TASK", 64 * 70)  # several thread tasks
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, shape, dtype=np.uint8)  # NaN codes included
    scales = rng.uniform(0.5, 2.0, fp8.scale_shape(codes.shape, (32, 16))).astype(np.float32)
    got = fp8.dequantize_bf16(codes, scales, (32, 16))
    want = np.empty(codes.shape, np.float32)
    for i in range(shape[0]):
        for j in range(shape[1]):
            want[i, j] = e4m3_value(int(codes[i, j])) * scales[i // 32, j // 16]
    np.testing.assert_array_equal(got, to_bf16(want))
    with pytest.raises(ValueError, match="scales of shape"):
        fp8.dequantize_bf16(codes, scales[:2], (32, 16))


def test_quantize_blocks_error_is_within_half_a_step():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((300, 200)) * rng.uniform(0.01, 10, (300, 1))).astype(np.float32)
    w[:128, :128] = 0  # an all-zero block gets scale 1
    codes, scales = fp8.quantize_blocks(w, (128, 128))
    assert scales.shape == (3, 2) and scales[0, 0] == 1
    back = from_bf16(fp8.dequantize_bf16(codes, scales, (128, 128)))
    step = np.repeat(np.repeat(scales, 128, 0), 128, 1)[:300, :200]
    # e4m3 keeps 3 mantissa bits (half a step: 1/16 of the value), subnormals 2^-10 of the scale;
    # the bf16 rounding after it adds 2^-9 of the value
    bound = np.abs(w) * (1 / 16 + 2.0**-8) + step * 2.0**-10
    assert np.all(np.abs(back - w) <= bound)
    assert np.abs(back).max() <= np.abs(w).max() * (1 + 2.0**-8)


def _config(tmp_path, quantization):
    cfg = {"model_type": "qwen3_5"}
    if quantization is not None:
        cfg["quantization_config"] = quantization
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_read_fp8_block(tmp_path):
    assert fp8.read_fp8_block(_config(tmp_path, None)) is None
    release = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    assert fp8.read_fp8_block(_config(tmp_path, release)) == (128, 128)


@pytest.mark.parametrize("quantization,words", [
    ({"quant_method": "awq", "bits": 4}, "quant_method 'awq'"),
    ({"quant_method": "gptq"}, "quant_method 'gptq'"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "fmt 'e5m2'"),
    ({"quant_method": "fp8", "fmt": "e4m3"}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128, 0]}, "weight_block_size"),
    ("fp8", "quant_method None"),
])
def test_read_fp8_block_refuses_other_methods(tmp_path, quantization, words):
    with pytest.raises(fp8.Fp8ConfigError) as e:
        fp8.read_fp8_block(_config(tmp_path, quantization))
    assert words in str(e.value) and "\n" not in str(e.value)
