"""The weights a quantized engine computes with, in fp32, for the numpy reference to run on: each
tensor the engine holds in the LQ format replaced by the numpy quantizer's round trip (its codes
and scales back to values by `layout.values`), every other tensor as the checkpoint has it. The
GPU quantizer that quantizes a bf16 checkpoint while it loads makes the same codes (the GPU tests
hold it to that), so the reference on these weights is the oracle of a quantized engine."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lampo.models.quant import layout, quantizer


def round_trip(w: np.ndarray, bits: int) -> np.ndarray:
    """w [..., N, K] -> the values its LQ codes and scales stand for (groups lie along rows, so a
    bank of experts quantizes as one tall matrix)."""
    codes, scales = quantizer.quantize(w.reshape(-1, w.shape[-1]), bits)
    return layout.values(codes, scales, bits).reshape(w.shape)


def quantized_weights(ck, bits: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint `ck` in fp32; those named in `bits` (engine tensor name ->
    width, `engine_formats.recipe_tensor_bits`) as their round trip at that width."""
    weights = {}
    for name in ck.names():
        w = ck.tensor_f32(name)
        weights[name] = round_trip(w, bits[name]) if name in bits else w
    return weights
