"""`lampo convert` quantizing on the GPU (lampo._native.LqBlockQuantizer, lq_quantize.cu; FP8 rows
decoded by fp8_dequantize.cu first) writes the same bytes as the numpy quantizer and packer, tensor
for tensor."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lampo.cli import main
from lampo.models.checkpoint import Checkpoint
from lampo.models.fp8_release import publish_fp8
from lampo.models.presets import get_preset
from lampo.models.quant.convert import convert
from lampo.models.synthetic import write_checkpoint

_native = pytest.importorskip("lampo._native")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device"),
]


@pytest.mark.parametrize("preset, recipe, fp8_block", [
    ("tiny-moe", "q5", None), ("tiny-dense", "q4", None), ("tiny-moe", "q5", 32), ("tiny-dense", "q4", 128)])
def test_the_gpu_conversion_is_the_numpy_conversion(tmp_path, capsys, preset, recipe, fp8_block):
    """bf16 sources, and FP8 releases (every projection's codes and scales decoded on the GPU)."""
    src = write_checkpoint(tmp_path / "src", replace(get_preset(preset), vocab_size=512), seed=3)
    if fp8_block:
        src = publish_fp8(src, tmp_path / "fp8", block=(fp8_block, fp8_block))
    convert(src, tmp_path / "numpy", recipe)
    assert main(["convert", str(src), str(tmp_path / "gpu"), "--recipe", recipe, "--quantizer", "cuda"]) == 0
    assert capsys.readouterr().err.rstrip().endswith(f"({recipe}), quantized on the GPU")
    want, got = Checkpoint.open(tmp_path / "numpy"), Checkpoint.open(tmp_path / "gpu")
    assert got.names() == want.names() and got.lq.tensors == want.lq.tensors
    for name in want.names():
        assert got.raw(name).tobytes() == want.raw(name).tobytes(), name


def test_the_block_quantizer_refuses_blocks_off_the_tile_grid():
    q = _native.LqBlockQuantizer()
    with pytest.raises(ValueError, match=r"\[16n, 64k\] block, got bits 5, \[8, 64\]"):
        q.quantize(np.zeros((8, 64), np.uint16), 5)
    with pytest.raises(ValueError, match="needs bits 4..6"):
        q.quantize(np.zeros((16, 64), np.uint16), 3)
    with pytest.raises(ValueError, match=r"quantize_fp8: needs bits 4..6 and a \[16n, 64k\] block, got bits 4, \[8, 64\]"):
        q.quantize_fp8(np.zeros((8, 64), np.uint8), np.ones((1, 1), np.float32), 128, 128, 4)
    with pytest.raises(ValueError, match=r"quantize_fp8: scales of shape \[1, 1\] for codes \[256, 64\] in blocks of 128 x 128"):
        q.quantize_fp8(np.zeros((256, 64), np.uint8), np.ones((1, 1), np.float32), 128, 128, 4)
