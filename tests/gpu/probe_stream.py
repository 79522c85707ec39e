"""Can one persistent weight stream run through the decode step's dependency points? (needs an NVIDIA GPU)

The 35B-A3B decode step is 265 kernels; each hand-over leaves the DRAM partly idle, and loads that
kernels issue before their PDL wait compete with the running stream (docs/design/decode.md).
A persistent decode step would instead keep one stream of bulk copies going into
a shared-memory ring on every SM while consumer warps wait at the dependency points. This probe
measures that stream alone, before anything is built on it: the step's weight bytes per phase
(35B-A3B: 30 GDN and 10 attention layers, then the LM head), a grid-wide dependency point between
consecutive phases, and the latency-bound work of the GDN step, the top-k and attention modelled as
spins of a few microseconds. Schedules:

  stream     all bytes as one phase (no dependency point): the ceiling
  lockstep   every phase waits for the previous one to finish everywhere, producer included (a
             separate kernel per phase that loads nothing before its wait)
  ahead      the consumers still wait at every phase boundary, but the producer runs ahead through
             them, except that the routed experts' tiles wait until the top-k is done everywhere
  merged     ahead, and the consumers wait only where the data needs the whole grid: not before the
             GDN step, attention prep and attention (they need a few heads of the row before), nor
             before the shared expert (its input was complete before the router); routed gate_up
             waits for the top-k
  *-nowork   the same without the latency spins (what the dependency points alone cost)

--weights bf16,q5,q4 runs the schedules with each weight format's bytes: a phase's weight bytes are
scaled by its tensor class's bits per weight in that recipe (models/quant/recipes.py; the router,
the KV rows and the GDN state stay as they are), so the dependency points stay where they are
while the bytes between them shrink (q5: 2.18 GB a 35B-A3B step). --tiles sets the ring's tile
size and stages (e.g. 32768x6,16384x12).

Run on a machine with an NVIDIA GPU:  bash tests/gpu/run.sh stream (builds probe_stream.cu with nvcc, passes it
as --lib; STREAM_WEIGHTS / STREAM_TILES pass --weights / --tiles). Prints and writes (--json) each
schedule's time per step and bandwidth.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from dataclasses import dataclass

from lampo.models.quant.layout import bits_per_weight
from lampo.models.quant.recipes import get_recipe

MB = 1_000_000

# 35B-A3B bytes per decode step at depth 8,192 with bf16 weights (lampo.models.params for the same
# model gives 6.108 GB per token), each phase's bytes by tensor class (models/quant/recipes.py; None:
# not scaled by a recipe: the router, the GDN state, the KV rows), and the measured latency-bound
# phases (decode timelines).
GDN_LAYER = [  # (name, [(class, bytes)], work_ns, routed)
    ("gdn in projection", [("gdn", 50.6 * MB)], 0, False),
    ("gdn step (state)", [(None, 2.1 * MB)], 3000, False),
    ("gdn out projection", [("gdn", 16.8 * MB)], 0, False),
]
ATTENTION_LAYER = [
    ("attention qkv", [("attention", 37.7 * MB)], 0, False),
    ("attention prep", [], 1500, False),
    ("attention over the cache", [(None, 8.6 * MB)], 2000, False),
    ("attention combine", [], 1000, False),
    ("attention o projection", [("attention", 16.8 * MB)], 0, False),
]
MOE = [
    ("router", [(None, 1.0 * MB)], 0, False),
    ("top-k", [], 1500, False),
    ("shared expert gate_up", [("shared_expert", 4.2 * MB)], 0, False),
    ("routed gate_up", [("experts_gate_up", 33.6 * MB)], 0, True),
    ("down (routed + shared)", [("experts_down", 16.8 * MB), ("shared_expert", 2.1 * MB)], 0, True),
]
LM_HEAD = ("lm head", [("lm_head", 1017 * MB)], 0, False)
LAYERS, ATTENTION_EVERY = 40, 4


@dataclass
class Plan:
    bytes: list[int]
    work_ns: list[int]
    prod_dep: list[int]  # phase the producer waits for (-1: none)
    cons_dep: list[int]  # phase the consumers wait for (-1: none)

    @property
    def total(self) -> int:
        return sum(self.bytes)


def weight_scale(weights: str, cls: str | None) -> float:
    """Bytes of a class's weights in `weights` (bf16, or a recipe name) per bf16 byte."""
    if weights == "bf16" or cls is None:
        return 1.0
    return bits_per_weight(get_recipe(weights).bits[cls]) / 16


def step_phases(weights: str = "bf16") -> list[tuple[str, int, int, bool]]:
    """The 35B-A3B decode step as phases in order (bytes rounded up to 256)."""
    phases = []
    for layer in range(LAYERS):
        mixer = ATTENTION_LAYER if (layer + 1) % ATTENTION_EVERY == 0 else GDN_LAYER
        phases += mixer + MOE
    phases.append(LM_HEAD)
    out = []
    for name, parts, ns, routed in phases:
        b = sum(size * weight_scale(weights, cls) for cls, size in parts)
        out.append((name, int(-(-b // 256) * 256), ns, routed))
    return out


PARTIAL_INPUT = {"gdn step (state)", "attention prep", "attention over the cache", "shared expert gate_up"}


def plan(schedule: str, weights: str = "bf16") -> Plan:
    phases = step_phases(weights)
    kind, _, nowork = schedule.partition("-")
    if kind not in ("stream", "lockstep", "ahead", "merged") or nowork not in ("", "nowork"):
        raise ValueError(f"unknown schedule {schedule!r}")
    if kind == "stream":
        return Plan([sum(b for _, b, _, _ in phases)], [0], [-1], [-1])
    prod, cons, topk = [], [], -1
    for p, (name, _, _, routed) in enumerate(phases):
        if name == "top-k":
            topk = p
        prod.append(p - 1 if kind == "lockstep" else topk if routed else -1)
        if kind == "merged" and name in PARTIAL_INPUT:
            cons.append(-1)
        elif kind == "merged" and name == "routed gate_up":
            cons.append(topk)
        else:
            cons.append(p - 1)
    work = [0 if nowork else ns for _, _, ns, _ in phases]
    return Plan([b for _, b, _, _ in phases], work, prod, cons)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="probe_stream.so built from probe_stream.cu")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--weights", default="bf16,q5", help="comma list of bf16 and recipe names (q5, q4)")
    ap.add_argument("--tiles", default="32768x6", help="comma list of TILE_BYTESxSTAGES rings")
    args = ap.parse_args()
    weights_list = args.weights.split(",")
    for w in weights_list:
        if w != "bf16":
            get_recipe(w)  # an unknown recipe fails here, before the GPU is touched
    rings = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    lib = ctypes.CDLL(args.lib)
    lib.stream_error.restype = ctypes.c_char_p
    lib.stream_init.argtypes = [ctypes.c_size_t]
    lib.stream_time.restype = ctypes.c_double
    if lib.stream_init(plan("stream").total + 256 * len(step_phases())) != 0:  # bf16: the largest
        raise SystemExit(f"stream_init: {lib.stream_error().decode()}")
    results = []
    schedules = ("stream", "lockstep", "ahead", "merged", "lockstep-nowork", "ahead-nowork", "merged-nowork")
    for weights in weights_list:
        for (tile, stages), schedule in ((ring, s) for ring in rings for s in schedules):
            pl = plan(schedule, weights)
            n = len(pl.bytes)
            ints = [(ctypes.c_int * n)(*v) for v in (pl.work_ns, pl.prod_dep, pl.cons_dep)]
            seconds = lib.stream_time((ctypes.c_longlong * n)(*pl.bytes), *ints, n, tile, stages, args.repeats)
            if seconds < 0:
                raise SystemExit(f"stream_time({schedule}): {lib.stream_error().decode()}")
            row = {"weights": weights, "schedule": schedule, "tile_bytes": tile, "stages": stages, "phases": n,
                   "bytes": pl.total, "ms_per_step": seconds * 1e3, "tb_per_s": pl.total / seconds / 1e12}
            results.append(row)
            print(f"{weights:4s} {schedule:15s} tile {tile // 1024:2d} KiB x {stages:2d} stages, {n:4d} phases, "
                  f"{pl.total / 1e9:.3f} GB: {row['ms_per_step']:.3f} ms per step, {row['tb_per_s']:.2f} TB/s",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": "qwen3.6-35b-a3b step at depth 8,192 (bytes and spins)",
                       "commit": os.environ.get("LAMPO_COMMIT", "unknown"),
                       "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                       "command": " ".join(["python"] + sys.argv), "runs": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
