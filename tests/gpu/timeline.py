"""Where a graphed decode step's time goes, launch by launch (NVIDIA GPU, LAMPO_TIMELINE=ON build).

Every decode-step kernel of a LAMPO_TIMELINE build records, per block, when it reached pdl_begin
(resident, waiting) and when its wait returned (the kernel before it had completed); the MoE gate_up
also records when its experts were known (native/src/diagnostics/timeline.h). From those marks, per launch:

  head start   first block released - first block resident (how early the launch was resident)
  critical     next launch released - this launch released: this kernel's share of the step's
               critical path (its work after the wait, its tail, and the hand-over to the next)
  spread       last block released - first block released (blocks that became resident late)
  selected     (gate_up) median block: experts known - released (the top-k's latency)
  staged       (LQ GEMV) median block: x staged - released
  done / last  (LQ GEMV) median / last warp: its last rows written - released
  hand-over    (LQ GEMV) next launch released - last warp done (the completion's latency)

Run on a machine with an NVIDIA GPU: bash tests/gpu/run.sh timeline (configures the extension's build with
-DLAMPO_TIMELINE=ON, builds it, then runs this script). The instrumented step is
slower than the plain one (each mark is an atomic and a store); the script prints both.

With --window T (T > 1) the recorded pass is a graphed verify window of T tokens (the token to feed and
T - 1 random drafts, one row kept after each) instead of the decode step.

Usage: python tests/gpu/timeline.py [--preset P] [--weights W] [--layers N] [--depth D] [--steps S] [--window T]
       [--json PATH] [--raw PATH.npy [--raw-launches N]]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

EVENT = np.dtype([("time_ns", "<u8"), ("grid_id", "<u8"), ("block", "<u4"), ("sm", "<u2"), ("stage", "u1"),
                  ("warp", "u1")])
ENTRY, RELEASED, SELECTED, STAGED, DONE = 0, 1, 2, 3, 4


@dataclass
class Launch:
    grid_id: int            # %gridid: one per graph node (the same in every replay)
    blocks: int
    resident_ns: int        # first block at pdl_begin
    released_ns: int        # first block past the wait
    released_last_ns: int
    selected_ns: int | None  # median block's "experts known" mark (gate_up only)
    staged_ns: int | None    # median block's "x staged" mark (LQ GEMV only)
    done_ns: int | None      # median warp's "last rows written" mark (LQ GEMV only)
    done_last_ns: int | None


def group_launches(events: np.ndarray) -> list[Launch]:
    """One Launch per grid id of one step's events, in launch order (first release, then grid id)."""
    out = []
    for gid in np.unique(events["grid_id"]):
        ev = events[events["grid_id"] == gid]
        entry, rel, sel, staged, done = (ev["time_ns"][ev["stage"] == s] for s in (ENTRY, RELEASED, SELECTED, STAGED,
                                                                                    DONE))
        if rel.size == 0:
            continue
        median = lambda t: int(np.median(t)) if t.size else None  # noqa: E731
        out.append(Launch(int(gid), int(rel.size), int(entry.min()) if entry.size else int(rel.min()),
                          int(rel.min()), int(rel.max()), median(sel), median(staged), median(done),
                          int(done.max()) if done.size else None))
    out.sort(key=lambda launch: (launch.released_ns, launch.grid_id))
    return out


SETTLE_NAME = "gdn_replay: gdn_replay_kernel"


def pass_names(names: list[str], launches: int, settles: bool) -> list[str]:
    """The names of a recorded pass's launches: the graph's, and before a verify window's the eager
    replay that settles the previous window's kept rows (settles: a model with GDN layers), which
    runs outside the window's graph, so its names do not list it."""
    return [SETTLE_NAME, *names] if settles and launches == len(names) + 1 else names


def step_rows(step: list[Launch], names: list[str]) -> list[dict]:
    """Per launch of one step: name and the measures of the module docstring (us)."""
    if len(names) != len(step):
        names = [f"launch {i}" for i in range(len(step))]
    rows = []
    for i, (launch, name) in enumerate(zip(step, names)):
        nxt = step[i + 1].released_ns if i + 1 < len(step) else None
        since = lambda t: (t - launch.released_ns) / 1e3 if t is not None else None  # noqa: E731
        rows.append({
            "name": name,
            "blocks": launch.blocks,
            "head_start_us": (launch.released_ns - launch.resident_ns) / 1e3,
            "critical_us": (nxt - launch.released_ns) / 1e3 if nxt is not None else None,
            "spread_us": (launch.released_last_ns - launch.released_ns) / 1e3,
            "selected_us": since(launch.selected_ns),
            "staged_us": since(launch.staged_ns),
            "done_us": since(launch.done_ns),
            "last_done_us": since(launch.done_last_ns),
            "handover_us": None if nxt is None or launch.done_last_ns is None else (nxt - launch.done_last_ns) / 1e3,
        })
    return rows


def warp_balance(events: np.ndarray) -> list[dict]:
    """Per launch with warp marks (in release order): when its warps finished after the first release
    (median and last), the latest SM mean (when it would end if each SM's warps shared their work
    evenly) and the median spread between an SM's first and last warp (us)."""
    out = []
    for launch in group_launches(events):
        ev = events[(events["grid_id"] == launch.grid_id) & (events["stage"] == DONE)]
        if ev.size == 0:
            continue
        t = (ev["time_ns"].astype(np.int64) - launch.released_ns) / 1e3
        per_sm = [t[ev["sm"] == sm] for sm in np.unique(ev["sm"])]
        out.append({"grid_id": launch.grid_id, "warps": int(ev.size), "done_median_us": float(np.median(t)),
                    "done_last_us": float(t.max()), "sm_mean_last_us": float(max(x.mean() for x in per_sm)),
                    "sm_spread_median_us": float(np.median([x.max() - x.min() for x in per_sm]))})
    return out


MARKS = ("selected", "staged", "done", "last_done", "handover")  # measures of the kernels that mark them
MARK_HEADS = ("select", "staged", "done", "last", "hand")


def by_name(steps_rows: list[list[dict]]) -> list[dict]:
    """Per launch name over all steps: launches per step, critical path per step (sum), and means."""
    acc: dict[str, dict[str, list[float]]] = {}
    for rows in steps_rows:
        for r in rows:
            a = acc.setdefault(r["name"], {k: [] for k in ("critical", "head", "spread", *MARKS)})
            if r["critical_us"] is not None:
                a["critical"].append(r["critical_us"])
            a["head"].append(r["head_start_us"])
            a["spread"].append(r["spread_us"])
            for k in MARKS:
                if r.get(f"{k}_us") is not None:
                    a[k].append(r[f"{k}_us"])
    n = len(steps_rows)
    out = []
    for name, a in acc.items():
        mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
        out.append({"name": name, "per_step": len(a["head"]) // n,
                    "critical_us_per_step": sum(a["critical"]) / n, "critical_us_mean": mean(a["critical"]),
                    "head_start_us_mean": mean(a["head"]), "spread_us_mean": mean(a["spread"]),
                    **{f"{k}_us_mean": mean(a[k]) for k in MARKS}})
    out.sort(key=lambda r: -r["critical_us_per_step"])
    return out


LAYER_OPENERS = ("gdn in projection", "attention qkv projection")  # the first op of a decoder layer
AFTER_LAYERS = ("rmsnorm", "lm_head", "engine")                    # ops after the last layer


def by_layer(steps_rows: list[list[dict]]) -> list[dict]:
    """Per layer kind (named by its first op): layers per step, the mean critical path of one layer,
    and its parts in launch order (mean us per layer)."""
    kinds: dict[str, list[list[dict]]] = {}
    for rows in steps_rows:
        layer = None
        for r in rows:
            op = r["name"].split(":")[0]
            if op in LAYER_OPENERS:
                layer = []
                kinds.setdefault(op, []).append(layer)
            elif op in AFTER_LAYERS:
                layer = None
            if layer is not None and r["critical_us"] is not None:
                layer.append(r)
    out = []
    for kind, layers in kinds.items():
        parts: dict[str, float] = {}
        for layer in layers:
            for r in layer:
                parts[r["name"]] = parts.get(r["name"], 0.0) + r["critical_us"] / len(layers)
        out.append({"kind": kind, "per_step": len(layers) // len(steps_rows),
                    "critical_us_mean": sum(parts.values()), "parts_us": parts})
    return out


def format_report(summary: list[dict], first_rows: list[dict], step_us: float, plain_ms: float,
                  layers: list[dict] | None = None) -> str:
    fmt = lambda v: "      -" if v is None else f"{v:7.2f}"  # noqa: E731
    heads = " ".join(f"{h:>7s}" for h in MARK_HEADS)
    marks = lambda r, suffix: " ".join(fmt(r.get(f"{k}_us{suffix}")) for k in MARKS)  # noqa: E731
    lines = [f"instrumented graph step {step_us / 1e3:.3f} ms (first release to last release; the plain "
             f"graph step measured here: {plain_ms:.3f} ms)", "",
             "per launch name (critical path per step, then per-launch means, us):",
             f"  {'name':58s} {'n':>3s} {'crit/step':>9s} {'crit':>7s} {'head':>7s} {'spread':>7s} {heads}"]
    for r in summary:
        lines.append(f"  {r['name'][:58]:58s} {r['per_step']:3d} {r['critical_us_per_step']:9.1f} "
                     f"{fmt(r['critical_us_mean'])} {fmt(r['head_start_us_mean'])} {fmt(r['spread_us_mean'])} "
                     f"{marks(r, '_mean')}")
    for k in layers or []:
        ops = [name.split(": ")[0] for name in k["parts_us"]]
        label = lambda name: name if ops.count(name.split(": ")[0]) > 1 else name.split(": ")[0]  # noqa: E731
        parts = " + ".join(f"{label(name)} {us:.1f}" for name, us in k["parts_us"].items())
        lines += ["", f"a layer opened by {k['kind']} ({k['per_step']} per step): {k['critical_us_mean']:.1f} us = {parts}"]
    lines += ["", "the first launches of the step (us):",
              f"  {'#':>3s} {'name':58s} {'blocks':>6s} {'crit':>7s} {'head':>7s} {'spread':>7s} {heads}"]
    for i, r in enumerate(first_rows):
        lines.append(f"  {i:3d} {r['name'][:58]:58s} {r['blocks']:6d} {fmt(r['critical_us'])} "
                     f"{fmt(r['head_start_us'])} {fmt(r['spread_us'])} {marks(r, '')}")
    return "\n".join(lines)


def main() -> int:
    from lampo import bench
    from lampo.engine.cuda import load_native

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3.6-35b-a3b")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--depth", type=int, default=8192, help="context depth (random fill)")
    ap.add_argument("--weights", default="bf16", help="weight format of the random fill (bf16, q5, q4)")
    ap.add_argument("--steps", type=int, default=4, help="recorded graph steps")
    ap.add_argument("--window", type=int, default=1, help="tokens of the recorded pass: 1 the decode step, more "
                    "a verify window")
    ap.add_argument("--show", type=int, default=24, help="launches listed one by one")
    ap.add_argument("--per-sm", type=int, default=1 << 16, help="event capacity per SM")
    ap.add_argument("--json")
    ap.add_argument("--raw", help="write the first recorded step's events of its first --raw-launches launches "
                    "here (.npy, the EVENT records: per-warp marks with their SM, block and warp)")
    ap.add_argument("--raw-launches", type=int, default=8)
    args = ap.parse_args()

    native = load_native()
    if not native.timeline_built:
        print("lampo._native was built without LAMPO_TIMELINE=ON", file=sys.stderr)
        return 2
    bench_args = ["--preset", args.preset, "--random-weights", "--prompt", "512", "--depths", str(args.depth),
                  "--fast-depth", "--profile-steps", "0", "--weights", args.weights] + (
                      ["--layers", str(args.layers)] if args.layers else []) + (
                      ["--speculate-accept", "0.8", "--draft-k", str(args.window - 1)] if args.window > 1 else [])
    parsed = bench.build_parser().parse_args(bench_args)
    cfg, _ = bench.resolve_model(parsed)
    w = bench.plan_workload(parsed, cfg, cuda=True)
    target = bench.CudaTarget(native, cfg, w, None, parsed.seed)
    rng = np.random.default_rng(0)
    bench.reach_depth(target, w.depths[0], w, rng, parsed.seed)

    def one_pass(record: bool = False) -> bytes | None:
        """The decode step or a verify window; record: stop the recording after it (a window keeps one
        row after that, outside the recording) and return its events."""
        if args.window == 1:
            target.decode(1)
            return native.timeline_stop() if record else None
        own = target.verify([target.next_token] + [int(t) for t in rng.integers(0, cfg.vocab_size, args.window - 1)])
        events = native.timeline_stop() if record else None
        target.accept(1, own[0])
        return events

    for _ in range(8):  # captures the graph, warms up
        one_pass()
    t0 = time.perf_counter()
    for _ in range(32):
        one_pass()
    plain_ms = (time.perf_counter() - t0) / 32 * 1e3
    steps, n_events, balance = [], 0, []
    for _ in range(args.steps):  # one recording per pass: a graph node keeps its grid id in every replay
        native.timeline_start(args.per_sm)
        raw_events = one_pass(record=True)
        events = np.frombuffer(raw_events, dtype=EVENT)
        if events.size and np.bincount(events["sm"]).max() >= args.per_sm:
            raise SystemExit(f"an SM filled its {args.per_sm} event slots (later marks were dropped): raise --per-sm")
        steps.append(group_launches(events))
        n_events += events.size
        if args.raw and len(steps) == 1:
            first = {x.grid_id for x in steps[0][:args.raw_launches]}
            raw = events[np.isin(events["grid_id"], list(first))]
            np.save(args.raw, raw)
            balance = warp_balance(raw)
    names = pass_names(list(native.timeline_launches(args.window)), len(steps[0]),
                       args.window > 1 and bool(cfg.linear_layer_ids))
    rows = [step_rows(s, names) for s in steps]
    step_us = statistics.median((s[-1].released_ns - s[0].released_ns) / 1e3 for s in steps)
    summary, layers = by_name(rows), by_layer(rows)
    print(format_report(summary, rows[0][:args.show], step_us, plain_ms, layers))
    if args.raw:
        names_at = {x.grid_id: n for x, n in zip(steps[0], names if len(names) == len(steps[0]) else [])}
        print("\nwarps of the first launches (us after the release: median / last done, latest SM mean, "
              "median spread within an SM):")
        for b in balance:
            print(f"  {names_at.get(b['grid_id'], b['grid_id'])!s:58.58s} {b['done_median_us']:7.2f} "
                  f"{b['done_last_us']:7.2f} {b['sm_mean_last_us']:7.2f} {b['sm_spread_median_us']:7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "num_layers": cfg.num_hidden_layers, "depth": w.depths[0],
                       "steps": args.steps, "events": n_events, "plain_step_ms": plain_ms,
                       "instrumented_step_us": step_us, "summary": summary, "layers": layers, "steps_rows": rows,
                       "launches": [asdict(x) for x in steps[0]],
                       "warp_balance": balance}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
