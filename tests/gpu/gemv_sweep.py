"""The LQ decode GEMV, shape by shape, and what one launch costs besides its bytes (NVIDIA GPU).

Two tables (tests/gpu/run.sh gemv):
- every LQ matrix a decode step or verify window of the preset reads, at its width in the q5
  recipe (`RECIPES`), for T = 1 and 4 tokens: time and packed bytes read per second;
- for each (in, bits, T) of those matrices, the same GEMV at several row counts, and the least
  squares line us = fixed + bytes / rate through them: `fixed` is what a launch costs whatever its
  size (the wait for the previous kernel, x staged by every block, the first tiles' latency, the
  tail), `rate` the streaming rate of its main loop.
Each time is `ops.bench_gemv_lq`: graph-replayed launches over rotating copies of the weights (cold
L2), as a decode step runs them.

    python tests/gpu/gemv_sweep.py [--preset qwen3.6-27b ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from lampo import _native_ops as ops
from lampo.models.config import ModelConfig
from lampo.models.presets import get_preset
from lampo.models.quant import layout
from lampo.models.quant.recipes import RECIPES

ROWS = (1024, 4096, 16384, 65536)  # row counts of the fixed-cost fit
TOKENS = (1, 4)


def lq_matrices(cfg: ModelConfig, recipe: str = "q5") -> dict[str, tuple[int, int, int]]:
    """name -> (out, in, bits) of the fused matrices the engine holds in LQ (one expert for a bank)."""
    bits = RECIPES[recipe].bits
    h = cfg.hidden_size
    m = {
        "attention q|k|v": (cfg.attn_proj_rows, h, bits["attention"]),
        "attention o": (h, cfg.attn_inner, bits["attention"]),
        "gdn qkv|z|b|a": (cfg.gdn_proj_rows, h, bits["gdn"]),
        "gdn out": (h, cfg.value_dim, bits["gdn"]),
        "lm head": (cfg.vocab_size, h, bits["lm_head"]),
    }
    if cfg.is_moe:
        m["expert gate|up"] = (2 * cfg.moe_intermediate_size, h, bits["experts_gate_up"])
        m["expert down"] = (h, cfg.moe_intermediate_size, bits["experts_down"])
        m["shared gate|up"] = (2 * cfg.shared_expert_intermediate_size, h, bits["shared_expert"])
        m["shared down"] = (h, cfg.shared_expert_intermediate_size, bits["shared_expert"])
    else:
        m["ffn gate|up"] = (2 * cfg.intermediate_size, h, bits["ffn_gate_up"])
        m["ffn down"] = (h, cfg.intermediate_size, bits["ffn_down"])
    return {k: (-(-out // 16) * 16, inn, b) for k, (out, inn, b) in m.items()}  # rows padded to the tile


def timed(out: int, inn: int, bits: int, T: int) -> dict:
    r = ops.bench_gemv_lq(out, inn, bits, T, 50)
    return {"out": out, "in": inn, "bits": bits, "T": T, "us": r["us"], "GBps": r["GBps"],
            "bytes": layout.packed_bytes(out, inn, bits)}


def fixed_cost(inn: int, bits: int, T: int) -> dict:
    """The line us = fixed + bytes / rate through the GEMV at ROWS rows."""
    runs = [timed(rows, inn, bits, T) for rows in ROWS]
    x = np.array([r["bytes"] for r in runs], float)
    y = np.array([r["us"] for r in runs], float)
    slope, fixed = np.polyfit(x, y, 1)
    return {"in": inn, "bits": bits, "T": T, "fixed_us": float(fixed), "rate_TBps": float(1e-6 / slope),
            "points": [(r["out"], r["us"]) for r in runs]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="a model preset (default: both Qwen3.6 models)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    report = {}
    for preset in args.preset or ["qwen3.6-35b-a3b", "qwen3.6-27b"]:
        matrices = lq_matrices(get_preset(preset))
        shapes = []
        for name, (out, inn, bits) in matrices.items():
            for T in TOKENS:
                r = {"name": name, **timed(out, inn, bits, T)}
                shapes.append(r)
                print(f"{preset} {name:16} [{out},{inn}] q{bits} T={T}: {r['us']:8.1f} us {r['GBps']:6.0f} GB/s",
                      flush=True)
        fits = []
        for inn, bits in sorted({(inn, bits) for _, inn, bits in matrices.values()}):
            for T in TOKENS:
                f = fixed_cost(inn, bits, T)
                fits.append(f)
                print(f"{preset} in={inn} q{bits} T={T}: fixed {f['fixed_us']:.1f} us, "
                      f"stream {f['rate_TBps']:.2f} TB/s", flush=True)
        report[preset] = {"shapes": shapes, "fixed_cost": fits}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
