"""session 10: the host gap between decode steps. The 35B-A3B step (random weights, depth 8,192 by
random fill) timed three ways, interleaved over rounds: decode(-1) per token (host reads each id before
the next step), submit-one-ahead (decode_submit / decode_collect, one step always queued), and the
same queued loop with a Python work stand-in per token (WORK_US of busy Python)."""
import json, sys, time
import numpy as np
from lampo import _native
from lampo.bench import CudaTarget, Workload
from lampo.models.presets import get_preset

cfg = get_preset("qwen3.6-35b-a3b")
N, ROUNDS = 256, 5
w = Workload([512], [8192], N, 2048, 8192 + 6000, True, 0)
t = CudaTarget(_native, cfg, w, None, 0)
e = t.engine
e.fill_state_random(8192, 1)
e.begin_generation()
e.decode(0)

def busy(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass

def sync_loop(work_us=0):
    t0 = time.perf_counter()
    for _ in range(N):
        e.decode(-1)
        if work_us: busy(work_us)
    return (time.perf_counter() - t0) / N * 1e3

def queued_loop(work_us=0):
    t0 = time.perf_counter()
    e.decode_submit(-1)
    for i in range(N):
        if i + 1 < N: e.decode_submit(-1)
        e.decode_collect()
        if work_us: busy(work_us)
    return (time.perf_counter() - t0) / N * 1e3

res = {"sync": [], "queued": [], "sync_work50": [], "queued_work50": [], "sync_work500": [], "queued_work500": []}
for r in range(ROUNDS):
    if e.position > 8192 + 2500:
        e.fill_state_random(8192, 1); e.decode(0)
    res["sync"].append(sync_loop()); res["queued"].append(queued_loop())
    res["sync_work50"].append(sync_loop(50)); res["queued_work50"].append(queued_loop(50))
    res["sync_work500"].append(sync_loop(500)); res["queued_work500"].append(queued_loop(500))
out = {k: {"median_ms": float(np.median(v)), "all": v} for k, v in res.items()}
out["note"] = "35B-A3B random weights, depth ~8,192-10,500 by random fill, 256 tokens per loop, medians of 5 rounds"
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
