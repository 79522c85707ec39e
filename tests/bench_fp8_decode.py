"""How fast FP8 expert weights become the bank the engine holds: one 35B-A3B layer's
`mlp.experts.gate_up_proj` (256 experts x [gate 512 | up 512] x 2,048 columns, 537 M weights)
assembled from its 512 FP8 parts, random codes (each part its own) and 128 x 128 block scales.

Without --engine: the host's decode alone (`checkpoint_parts.Assembled.bf16`, each round into a
freshly allocated bank). With --engine bf16|q5 (a GPU and lampo._native): the bank loaded into a
35B-A3B engine of that format both ways a load can go, the host's decode then `load_tensor` of the
bf16 bank, and `load_tensor_fp8` of the parts (decoded on the GPU); each timing ends when the call
returns, with at most the last two staging pieces (128 MiB) still in flight. With --convert (a GPU):
the bank converted to q5 (experts_gate_up: 4 bits) as `lampo convert` does it on the GPU, its
packed blocks in host memory, both ways: each part decoded on the host and its bf16 rows
quantized by `LqBlockQuantizer.quantize`, and its codes and scales handed to `quantize_fp8`.

    python tests/bench_fp8_decode.py [--rounds 3] [--engine q5] [--convert] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from lampo.models.checkpoint_parts import Assembled, Fp8Matrix
from lampo.models.fp8 import FP8, scale_shape
from lampo.models.quant.checkpoint_format import LqTensor
from lampo.models.quant.convert import NumpyBlockQuantizer, assembled_blocks
from lampo.models.safetensors_io import StoredTensor

EXPERTS, ROWS, COLS, BLOCK = 256, 512, 2048, (128, 128)
BANK = "model.language_model.layers.0.mlp.experts.gate_up_proj"


def fp8_bank(rng: np.random.Generator) -> tuple[Assembled, dict[str, np.ndarray]]:
    """The bank as its FP8 parts, and the arrays behind them by stored name."""
    codes = rng.integers(0, 0x7F, (2 * EXPERTS, ROWS, COLS), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-2, (2 * EXPERTS, *scale_shape((ROWS, COLS), BLOCK))).astype(np.float32)
    arrays, parts = {}, []
    for i in range(2 * EXPERTS):
        c = StoredTensor(f"{i}", Path("-"), FP8, (ROWS, COLS), 0, codes[i].nbytes)
        s = StoredTensor(f"{i}.scales", Path("-"), "F32", scales.shape[1:], 0, scales[i].nbytes)
        arrays[c.name], arrays[s.name] = codes[i], scales[i]
        parts.append(Fp8Matrix(c, s, BLOCK))
    return Assembled(BANK, (EXPERTS, 2 * ROWS, COLS), tuple(parts)), arrays


class HostDecodeQuantizer(NumpyBlockQuantizer):
    """`lampo convert`'s GPU quantizer with each FP8 block decoded on the host first (the numpy
    quantizer's `quantize_fp8`, its bf16 rows quantized on the GPU)."""

    def __init__(self, native):
        self.native = native

    def quantize(self, rows: np.ndarray, bits: int) -> bytes:
        return self.native.quantize(rows, bits)


def convert_bank(bank: Assembled, view, quantizer) -> int:
    """Bytes of the bank's packed q5 blocks, as `lampo convert` makes them."""
    return sum(len(packed) for _, packed in assembled_blocks(view, bank, LqTensor(4, bank.shape), quantizer))


def timed(task) -> float:
    start = time.perf_counter()
    task()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engine", choices=("bf16", "q5"), help="also load the bank into a 35B-A3B engine (GPU)")
    p.add_argument("--convert", action="store_true", help="also time the bank's conversion to q5 (GPU)")
    p.add_argument("--json", type=Path, help="write the timings here")
    args = p.parse_args()
    bank, arrays = fp8_bank(np.random.default_rng(0))

    def view(t: StoredTensor) -> np.ndarray:
        return arrays[t.name]

    weights = EXPERTS * 2 * ROWS * COLS
    engine = None
    if args.engine:
        from lampo import _native
        from lampo.engine.cuda import create_engine
        from lampo.models.presets import get_preset
        from lampo.models.quant.engine_formats import recipe_tensor_bits

        cfg = get_preset("qwen3.6-35b-a3b")
        bits = recipe_tensor_bits(cfg, args.engine) if args.engine != "bf16" else {}
        engine = create_engine(_native, cfg, context_max=4096, prefill_chunk=512, weights=args.engine, tensor_bits=bits)
    native_quantizer = None
    if args.convert:
        from lampo.engine.cuda import load_native

        native_quantizer = load_native().LqBlockQuantizer()
    rows = []
    for r in range(args.rounds):
        row = {"round": r + 1, "host_decode_s": timed(lambda: bank.bf16(view))}
        if engine is not None:
            row["host_decode_and_load_s"] = timed(lambda: engine.load_tensor(BANK, bank.bf16(view)))
            row["gpu_decode_load_s"] = timed(lambda: engine.load_tensor_fp8(BANK, bank.fp8_parts(view), *BLOCK))
        if native_quantizer is not None:
            host = HostDecodeQuantizer(native_quantizer)
            row["convert_host_decode_s"] = timed(lambda: convert_bank(bank, view, host))
            row["convert_gpu_decode_s"] = timed(lambda: convert_bank(bank, view, native_quantizer))
        rows.append(row)
        print("  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
              + f"  ({weights / 1e6:.0f} M weights)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"what": "35B-A3B gate_up bank from 512 FP8 parts", "weights": weights,
                                         "engine": args.engine, "convert": args.convert, "rows": rows}, separators=(",", ":")))


if __name__ == "__main__":
    main()
