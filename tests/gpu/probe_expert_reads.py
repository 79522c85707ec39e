"""Read-bandwidth probe for the 35B-A3B decode step's weight access patterns (needs an NVIDIA GPU).

The decode step's dense projections stream at the copy bandwidth inside the graph, while the routed
experts (8 of 256 per layer, picked per token) reach ~2.5 TB/s (docs/design/kernels-gdn-moe.md).
This probe separates the access pattern from everything else: one kernel per "layer" that only
reads (16-byte loads, the same number in flight per thread as the expert kernels), over 40 layers
whose weights are spread through one large allocation as the real ones are, with fresh random
experts for every token. Patterns (bytes per layer as in the 35B-A3B):

  contiguous   18.9 MB in one run per layer (what a dense projection reads)
  down         the down GEMV today: block b reads rows 8b..8b+7 (8 KiB) of each of 9 experts of a
               [256, 2048, 512] bf16 bank, i.e. 9 runs 2 MiB apart
  down-tiled   the same bytes if the bank were stored as [2048/8, 256, 8, 512]: a block's 9 runs lie
               in one 2 MiB stretch
  gate-up      the gate_up GEMV today: 9 experts of a [256, 1024, 2048] bank, 16 row pairs per block
               (a 64 KiB run of gate rows and one of up rows)
  down-fixed   `down` with the same 9 experts for every token (translation and DRAM pages warm)

Run on a machine with an NVIDIA GPU:  bash tests/gpu/run.sh probe, which builds the timing half
(probe_expert_reads.cu: the read kernel, graph capture and replay) with nvcc and passes it as --lib.
Prints, per pattern, the time per layer and GB/s: the bytes of --tokens x 40 launches, replayed as
one CUDA graph, over its time (best of --repeats). Each launch also pays the gap between kernels,
the same for every pattern, so the patterns compare with each other and with `contiguous`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import numpy as np

LAYERS = 40
E, H, I, SLOTS = 256, 2048, 512, 9  # experts, hidden, expert intermediate, routed + shared
BF16 = 2
VEC = 16  # bytes per load


def down_runs(experts: np.ndarray, bank: int, tiled: bool) -> tuple[np.ndarray, int, int]:
    """Run starts (in vectors) for one layer's down GEMV: one block per 8 output rows."""
    rows_per_block, row_bytes = 8, I * BF16
    blocks = H // rows_per_block
    b = np.arange(blocks)[:, None]
    e = experts[None, :]
    if tiled:  # [H/8, E, 8, I]
        start = bank + (b * E + e) * rows_per_block * row_bytes
    else:  # [E, H, I]
        start = bank + (e * H + b * rows_per_block) * row_bytes
    return (start // VEC).reshape(-1), SLOTS, rows_per_block * row_bytes // VEC


def gate_up_runs(experts: np.ndarray, bank: int) -> tuple[np.ndarray, int, int]:
    """Run starts for one layer's gate_up GEMV: 16 row pairs per block, gate run + up run."""
    pairs, row_bytes, expert_bytes = 16, H * BF16, 2 * I * H * BF16
    tiles = I // pairs
    t = np.arange(tiles)[None, :, None]
    e = experts[:, None, None]
    half = np.array([0, I * row_bytes])[None, None, :]  # the gate rows, then the up rows
    start = bank + e * expert_bytes + t * pairs * row_bytes + half
    return (start // VEC).reshape(-1), 2, pairs * row_bytes // VEC


def contiguous_runs(region: int) -> tuple[np.ndarray, int, int]:
    blocks, run_bytes = 256, SLOTS * 8 * I * BF16  # the down GEMV's blocks and bytes
    return (region + np.arange(blocks) * run_bytes) // VEC, 1, run_bytes // VEC


def load_timer(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.probe_error.restype = ctypes.c_char_p
    lib.probe_init.argtypes = [ctypes.c_size_t]
    lib.probe_time.restype = ctypes.c_double
    lib.probe_time.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 5
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="probe_expert_reads.cu built as a shared library")
    ap.add_argument("--tokens", type=int, default=16, help="tokens (fresh random experts each)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    lib = load_timer(args.lib)
    down_bank, gate_up_bank = E * H * I * BF16, E * 2 * I * H * BF16
    down_base, gate_up_base = 0, LAYERS * down_bank
    contiguous_base = gate_up_base + LAYERS * gate_up_bank
    total = contiguous_base + LAYERS * SLOTS * H * I * BF16
    if lib.probe_init(total) != 0:  # one allocation, like the weight store's per-tensor buffers
        raise SystemExit(f"probe_init: {lib.probe_error().decode()}")
    rng = np.random.default_rng(0)
    fixed = rng.choice(E, SLOTS, replace=False)

    def layer_runs(pattern: str, layer: int) -> tuple[np.ndarray, int, int]:
        experts = fixed if pattern == "down-fixed" else rng.choice(E, SLOTS, replace=False)
        if pattern in ("down", "down-fixed", "down-tiled"):
            return down_runs(experts, down_base + layer * down_bank, pattern == "down-tiled")
        if pattern == "gate-up":
            return gate_up_runs(experts, gate_up_base + layer * gate_up_bank)
        return contiguous_runs(contiguous_base + layer * SLOTS * H * I * BF16)

    results = {}
    for pattern in ("contiguous", "down", "down-tiled", "gate-up", "down-fixed"):
        plan = [layer_runs(pattern, layer) for _ in range(args.tokens) for layer in range(LAYERS)]
        starts = np.ascontiguousarray(np.stack([s for s, _, _ in plan]), dtype=np.int64)
        per_block, run_vecs = plan[0][1], plan[0][2]
        blocks = plan[0][0].size // per_block
        layer_bytes = plan[0][0].size * run_vecs * VEC
        launches = len(plan)  # every launch of the pattern in one graph: the host is not measured
        best = lib.probe_time(starts.ctypes.data, launches, blocks, per_block, run_vecs, args.repeats)
        if best < 0:
            raise SystemExit(f"{pattern}: {lib.probe_error().decode()}")
        results[pattern] = {
            "bytes_per_layer": layer_bytes,
            "us_per_layer": best / launches * 1e6,
            "GB_per_s": layer_bytes * launches / best / 1e9,
        }
        print(f"{pattern:12s} {layer_bytes / 1e6:6.1f} MB/layer  {best / launches * 1e6:6.2f} us/layer  "
              f"{layer_bytes * launches / best / 1e9:7.0f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "tokens": args.tokens,
                       "repeats": args.repeats, "patterns": results}, f, indent=1)


if __name__ == "__main__":
    main()
