"""How fast FP8 expert weights become the bank the engine holds: one 35B-A3B layer's
`mlp.experts.gate_up_proj` (256 experts x [gate 512 | up 512] x 2,048 columns, 537 M weights)
assembled from its 512 FP8 parts, random codes (each part its own) and 128 x 128 block scales.

Without --engine: the host's decode alone (`checkpoint_parts.Assembled.bf16`, each round into a
freshly allocated bank). With --engine bf16|q5 (a GPU and lampo._native): the bank loaded into a
35B-A3B engine of that format both ways a load can go, the host's decode then `load_tensor` of the
bf16 bank, and `load_tensor_fp8` of the parts (decoded on the GPU); each timing ends when the call
returns, with at most the last two staging pieces (128 MiB) still in flight.

    python tests/bench_fp8_decode.py [--rounds 3] [--engine q5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from lampo.models.checkpoint_parts import Assembled, Fp8Matrix
from lampo.models.fp8 import FP8, scale_shape
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


def timed(task) -> float:
    start = time.perf_counter()
    task()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engine", choices=("bf16", "q5"), help="also load the bank into a 35B-A3B engine (GPU)")
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
    rows = []
    for r in range(args.rounds):
        row = {"round": r + 1, "host_decode_s": timed(lambda: bank.bf16(view))}
        if engine is not None:
            row["host_decode_and_load_s"] = timed(lambda: engine.load_tensor(BANK, bank.bf16(view)))
            row["gpu_decode_load_s"] = timed(lambda: engine.load_tensor_fp8(BANK, bank.fp8_parts(view), *BLOCK))
        rows.append(row)
        print("  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
              + f"  ({weights / 1e6:.0f} M weights)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"what": "35B-A3B gate_up bank from 512 FP8 parts", "weights": weights,
                                         "engine": args.engine, "rows": rows}, separators=(",", ":")))


if __name__ == "__main__":
    main()
