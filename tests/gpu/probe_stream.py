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

Run on a machine with an NVIDIA GPU:  bash tests/gpu/run.sh stream (builds probe_stream.cu with nvcc, passes it
as --lib). Prints and writes (--json) each schedule's time per step and bandwidth.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from dataclasses import dataclass

MB = 1_000_000

# 35B-A3B bytes per decode step at depth 8,192 (bf16 weights; lampo.models.params for the same
# model gives 6.108 GB per token) and the measured latency-bound phases (timelines, session 7-8).
GDN_LAYER = [  # (name, bytes, work_ns, routed)
    ("gdn in projection", 50.6 * MB, 0, False),
    ("gdn step (state)", 2.1 * MB, 3000, False),
    ("gdn out projection", 16.8 * MB, 0, False),
]
ATTENTION_LAYER = [
    ("attention qkv", 37.7 * MB, 0, False),
    ("attention prep", 0, 1500, False),
    ("attention over the cache", 8.6 * MB, 2000, False),
    ("attention combine", 0, 1000, False),
    ("attention o projection", 16.8 * MB, 0, False),
]
MOE = [
    ("router", 1.0 * MB, 0, False),
    ("top-k", 0, 1500, False),
    ("shared expert gate_up", 4.2 * MB, 0, False),
    ("routed gate_up", 33.6 * MB, 0, True),
    ("down (routed + shared)", 18.9 * MB, 0, True),
]
LM_HEAD = ("lm head", 1017 * MB, 0, False)
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


def step_phases() -> list[tuple[str, int, int, bool]]:
    """The 35B-A3B decode step as phases in order (bytes rounded up to 256)."""
    phases = []
    for layer in range(LAYERS):
        mixer = ATTENTION_LAYER if (layer + 1) % ATTENTION_EVERY == 0 else GDN_LAYER
        phases += mixer + MOE
    phases.append(LM_HEAD)
    return [(name, int(-(-b // 256) * 256), ns, routed) for name, b, ns, routed in phases]


PARTIAL_INPUT = {"gdn step (state)", "attention prep", "attention over the cache", "shared expert gate_up"}


def plan(schedule: str) -> Plan:
    phases = step_phases()
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
    args = ap.parse_args()
    lib = ctypes.CDLL(args.lib)
    lib.stream_error.restype = ctypes.c_char_p
    lib.stream_init.argtypes = [ctypes.c_size_t]
    lib.stream_time.restype = ctypes.c_double
    if lib.stream_init(plan("stream").total + 256 * len(step_phases())) != 0:
        raise SystemExit(f"stream_init: {lib.stream_error().decode()}")
    results = []
    runs = [(schedule, 32768, 6) for schedule in
            ("stream", "lockstep", "ahead", "merged", "lockstep-nowork", "ahead-nowork", "merged-nowork")]
    for schedule, tile, stages in runs:
        pl = plan(schedule)
        n = len(pl.bytes)
        ints = [(ctypes.c_int * n)(*v) for v in (pl.work_ns, pl.prod_dep, pl.cons_dep)]
        seconds = lib.stream_time((ctypes.c_longlong * n)(*pl.bytes), *ints, n, tile, stages, args.repeats)
        if seconds < 0:
            raise SystemExit(f"stream_time({schedule}): {lib.stream_error().decode()}")
        row = {"schedule": schedule, "tile_bytes": tile, "stages": stages, "phases": n, "bytes": pl.total,
               "ms_per_step": seconds * 1e3, "tb_per_s": pl.total / seconds / 1e12}
        results.append(row)
        print(f"{schedule:15s} tile {tile // 1024:2d} KiB x {stages:2d} stages, {n:4d} phases: "
              f"{row['ms_per_step']:.3f} ms per step, {row['tb_per_s']:.2f} TB/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": "qwen3.6-35b-a3b step at depth 8,192 (bytes and spins)",
                       "commit": os.environ.get("LAMPO_COMMIT", "unknown"),
                       "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                       "command": " ".join(["python"] + sys.argv), "runs": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
