"""Summary of a `tests/gpu/run.sh ab` call: the builds' decode steps over the repeated rounds.

run.sh ab benches every build (base, then each variant) once per round, AB_REPEAT rounds, into
BENCH_DIR/<model>-<build>-r<round>.json (`lampo bench ... --depths 0,8192 --fast-depth`; model
35b-a3b unless run.sh's AB_MODEL names others, e.g. 27b; run.sh prints one summary per model). This
prints, per build, the median ms per token at each depth with the spread over the rounds and the
median's difference from the base's, and the same for the verify windows of k + 1 tokens where
the runs measured them (run.sh's AB_SPEC_K); `--faster` prints only the names of the variants whose median
at the deepest depth beats the base's by more than --keep-ms (the ones worth testing).

    python tests/gpu/ab_summary.py BENCH_DIR [--model 35b-a3b] [--keep-ms 0.02] [--faster]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Build:
    name: str
    ms: dict[int, list[float]]  # depth -> ms per token, one per round (depths in the bench's order)
    windows: dict[tuple[int, int], list[float]] = field(default_factory=dict)  # (depth, k) -> verify ms

    @property
    def depths(self) -> list[int]:
        return list(self.ms)

    def median(self, depth: int) -> float:
        return statistics.median(self.ms[depth])


def load_builds(bench_dir: Path, model: str = "35b-a3b") -> dict[str, Build]:
    """Builds from the round files of `model`: base first, then the variants by name."""
    run_name = re.compile(rf"^{re.escape(model)}-(?P<build>.+)-r(?P<round>\d+)\.json$")
    runs: dict[str, list[tuple[int, dict]]] = {}
    for path in sorted(bench_dir.glob(f"{model}-*-r*.json")):
        m = run_name.match(path.name)
        if m:
            runs.setdefault(m["build"], []).append((int(m["round"]), json.loads(path.read_text())))
    if "base" not in runs:
        raise SystemExit(f"ab_summary: no base runs ({model}-base-r<N>.json) in {bench_dir}")
    builds = {}
    for name in ["base"] + sorted(n for n in runs if n != "base"):
        ms: dict[int, list[float]] = {}
        windows: dict[tuple[int, int], list[float]] = {}
        for _, report in sorted(runs[name], key=lambda r: r[0]):
            for d in report["decode"]:
                ms.setdefault(d["depth"], []).append(d["ms_per_token"])
            for row in report.get("speculative") or []:
                for w in row["draft_counts"]:
                    windows.setdefault((row["depth"], w["k"]), []).append(w["verify_ms"])
        builds[name] = Build(name, ms, windows)
    return builds


def faster(builds: dict[str, Build], keep_ms: float) -> list[str]:
    base = builds["base"]
    deepest = base.depths[-1]
    return [b.name for b in builds.values()
            if b.name != "base" and b.median(deepest) < base.median(deepest) - keep_ms]


def cell(label: str, runs: list[float], base_runs: list[float] | None) -> str:
    """One measurement's median over the rounds, its spread, and its difference from the base's."""
    text = f"{label}: {statistics.median(runs):.3f} ms ({min(runs):.3f}-{max(runs):.3f})"
    if base_runs:
        text += f" {statistics.median(runs) - statistics.median(base_runs):+.3f}"
    return text


def table(builds: dict[str, Build]) -> str:
    base = builds["base"]
    lines = []
    for b in builds.values():
        other = b.name != "base"
        cells = [cell(f"depth {depth:,}", b.ms[depth], base.ms.get(depth) if other else None) for depth in b.depths]
        cells += [cell(f"{k + 1}-token window at {depth:,}", runs, base.windows.get((depth, k)) if other else None)
                  for (depth, k), runs in b.windows.items()]
        lines.append(f"{b.name} (median of {len(b.ms[b.depths[0]])}): " + "; ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_dir", type=Path)
    ap.add_argument("--model", default="35b-a3b", help="the file name prefix of the runs (run.sh's AB_MODEL)")
    ap.add_argument("--keep-ms", type=float, default=0.02)
    ap.add_argument("--faster", action="store_true", help="only the names of the variants worth testing")
    args = ap.parse_args(argv)
    builds = load_builds(args.bench_dir, args.model)
    print(" ".join(faster(builds, args.keep_ms)) if args.faster else table(builds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
