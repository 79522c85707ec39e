"""`lampo convert` quantizing on the GPU (lampo._native.LqBlockQuantizer, lq_quantize.cu) writes the
same bytes as the numpy quantizer and packer, tensor for tensor."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lampo.cli import main
from lampo.models.checkpoint import Checkpoint
from lampo.models.presets import get_preset
from lampo.models.quant.convert import convert
from lampo.models.synthetic import write_checkpoint

_native = pytest.importorskip("lampo._native")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device"),
]


@pytest.mark.parametrize("preset, recipe", [("tiny-moe", "q5"), ("tiny-dense", "q4")])
def test_the_gpu_conversion_is_the_numpy_conversion(tmp_path, capsys, preset, recipe):
    src = write_checkpoint(tmp_path / "src", replace(get_preset(preset), vocab_size=512), seed=3)
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
