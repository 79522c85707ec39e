"""How fast the host turns FP8 expert weights into the bf16 bank the engine takes: one 35B-A3B
layer's `mlp.experts.gate_up_proj` (256 experts x [gate 512 | up 512] x 2,048 columns, 537 M
weights) assembled from its 512 FP8 parts (`checkpoint_parts.Assembled.bf16`), random codes and
128 x 128 block scales; each round into a freshly allocated bank, as a load does.

    python tests/bench_fp8_decode.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from lampo.models.checkpoint_parts import Assembled, Fp8Matrix
from lampo.models.fp8 import FP8, scale_shape
from lampo.models.safetensors_io import StoredTensor

EXPERTS, ROWS, COLS, BLOCK = 256, 512, 2048, (128, 128)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    rounds = p.parse_args().rounds
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 0x7F, (ROWS, COLS), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-2, scale_shape((ROWS, COLS), BLOCK)).astype(np.float32)
    arrays, parts = {}, []
    for e in range(EXPERTS):
        for proj in ("gate", "up"):
            c = StoredTensor(f"{e}.{proj}", Path("-"), FP8, (ROWS, COLS), 0, codes.nbytes)
            s = StoredTensor(f"{e}.{proj}.scales", Path("-"), "F32", scales.shape, 0, scales.nbytes)
            arrays[c.name], arrays[s.name] = codes, scales
            parts.append(Fp8Matrix(c, s, BLOCK))
    bank = Assembled("gate_up_proj", (EXPERTS, 2 * ROWS, COLS), tuple(parts))
    for _ in range(rounds):
        start = time.perf_counter()
        out = bank.bf16(lambda t: arrays[t.name])
        seconds = time.perf_counter() - start
        print(f"{seconds:.2f} s for {out.size / 1e6:.0f} M weights: {seconds / out.size * 1e9:.2f} ns a weight")
        del out


if __name__ == "__main__":
    main()
