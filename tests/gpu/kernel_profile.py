"""Per-kernel view of one decode step, for Nsight Compute.

    ncu --profile-from-start off --csv --page raw --metrics ... \
        python3 tests/gpu/kernel_profile.py step --preset qwen3.6-35b-a3b > ncu.csv
    python3 tests/gpu/kernel_profile.py table ncu.csv [--graph-ms 2.78]

`step` builds the engine with random weights (as `lampo bench --random-weights` does), prefills a
short prompt, warms the decode graph up, then runs ONE un-graphed decode step between
cuProfilerStart/Stop, so ncu profiles exactly that step's kernels (each one replayed alone, caches
flushed: the durations are isolated kernel times, without the overlap the graph's programmatic
dependent launches give).
`table` groups the CSV by kernel name: launches, summed isolated time, DRAM bytes and achieved
DRAM bandwidth, and compares the summed time with a measured graph step time.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import io
import re
import sys
from collections import defaultdict

TIME = "gpu__time_duration.sum"
READ = "dram__bytes_read.sum"
WRITE = "dram__bytes_write.sum"
METRICS = [TIME, READ, WRITE, "launch__grid_size", "launch__block_size", "launch__registers_per_thread"]


def run_step(preset: str, prompt: int, seed: int) -> None:
    import numpy as np

    from lampo.bench import CudaTarget, Workload
    from lampo.engine.picker import native_for
    from lampo.models.presets import get_preset

    cfg = get_preset(preset)
    native = native_for("cuda")
    w = Workload(prompts=[prompt], depths=[0], decode_tokens=8, chunk=2048, context_max=prompt + 64,
                 fast_depth=False, profile_steps=1)
    target = CudaTarget(native, cfg, w, None, seed)
    rng = np.random.default_rng(seed)
    target.prefill(rng.integers(0, cfg.real_vocab_size, prompt, dtype=np.int64).astype(np.int32))
    target.decode(8)  # captures and replays the graph
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuProfilerStart()
    target.profile(1)
    cuda.cuProfilerStop()


def short_name(full: str) -> str:
    """'void (anonymous namespace)::gemv_kernel<1, bf16>(...)' -> 'gemv_kernel'."""
    name = full.strip().removeprefix("void ")
    name = name.replace("(anonymous namespace)", "anon").replace("<unnamed>", "anon")
    return re.split(r"[<(]", name, maxsplit=1)[0].split("::")[-1]


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text and text.strip() not in ("", "n/a") else 0.0


def read_rows(path: str) -> tuple[list[dict], dict[str, str]]:
    """ncu's raw CSV: a header row, a units row, then one row per profiled kernel."""
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit(f"{path}: no ncu CSV table found")
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    units = rows[0] if rows and not rows[0].get("ID", "").strip().isdigit() else {}
    return [r for r in rows if r.get("ID", "").strip().isdigit()], units


MICROSECONDS_PER = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0}
BYTES_PER = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def scale(units: dict[str, str], metric: str, unit_table: dict[str, float]) -> float:
    return unit_table.get(units.get(metric, "").strip(), 1.0)


def table(path: str, graph_ms: float | None) -> str:
    rows, units = read_rows(path)
    to_us = scale(units, TIME, MICROSECONDS_PER)
    read_scale = scale(units, READ, BYTES_PER)
    write_scale = scale(units, WRITE, BYTES_PER)
    groups: dict[str, dict] = defaultdict(lambda: dict(n=0, us=0.0, read=0.0, write=0.0, grid="", block=""))
    for r in rows:
        name = short_name(r.get("Kernel Name", "?"))
        g = groups[name]
        g["n"] += 1
        g["us"] += _number(r.get(TIME, "")) * to_us
        g["read"] += _number(r.get(READ, "")) * read_scale
        g["write"] += _number(r.get(WRITE, "")) * write_scale
        g["grid"], g["block"] = r.get("launch__grid_size", ""), r.get("launch__block_size", "")
    total_us = sum(g["us"] for g in groups.values())
    total_b = sum(g["read"] + g["write"] for g in groups.values())
    out = [f"{len(rows)} kernels, isolated time {total_us / 1e3:.3f} ms, DRAM {total_b / 1e9:.3f} GB "
           f"({total_b / max(total_us, 1e-9) / 1e6:.2f} TB/s over the isolated time)"]
    if graph_ms:
        out.append(f"graph step {graph_ms:.3f} ms: isolated kernels sum to {100 * total_us / 1e3 / graph_ms:.1f}% of it")
    out.append(f"{'kernel':40s} {'n':>4s} {'us total':>9s} {'us each':>8s} {'MB each':>8s} {'TB/s':>6s} {'grid':>7s} {'block':>5s}")
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["us"]):
        b = g["read"] + g["write"]
        out.append(f"{name[:40]:40s} {g['n']:4d} {g['us']:9.1f} {g['us'] / g['n']:8.2f} "
                   f"{b / g['n'] / 1e6:8.2f} {b / max(g['us'], 1e-9) / 1e6:6.2f} {g['grid']:>7s} {g['block']:>5s}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("step", help="run one profiled decode step (under ncu)")
    s.add_argument("--preset", default="qwen3.6-35b-a3b")
    s.add_argument("--prompt", type=int, default=512)
    s.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("table", help="summarise ncu's raw CSV")
    t.add_argument("csv")
    t.add_argument("--graph-ms", type=float)
    sub.add_parser("metrics", help="print the --metrics argument for ncu")
    a = p.parse_args(argv)
    if a.cmd == "step":
        run_step(a.preset, a.prompt, a.seed)
    elif a.cmd == "table":
        print(table(a.csv, a.graph_ms))
    else:
        print(",".join(METRICS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
