"""`lampo bench`: prefill and decode speed, the per-op decode profile and the bandwidth roofline.

    lampo bench [--model DIR | --preset NAME --random-weights] [--layers N] [--prompt 8192,65536]
                [--depths 0,8192,65536,262144] [--decode-tokens 128] [--chunk N] [--context N]
                [--fast-depth] [--profile-steps N] [--backend auto|cuda|reference] [--json PATH]
                [--speculate-accept 0.6,0.8,0.9 [--draft-k 1,2,3,4]]

Measured (CUDA engine):
- prefill tok/s and TTFT for each prompt length (random token ids, fresh state; TTFT = the prefill
  chunks plus sampling of the first token);
- decode tok/s at each context depth: graph-replayed steps of the real decode loop (host reads
  back every sampled id). A depth is reached by real prefill (continuing from the previous depth),
  or with `--fast-depth` by filling the KV cache and the GDN states with random values (said so in
  the output: speed is representative, the text would not be);
- launches per decode step (kernel nodes of the captured graph), VRAM used, and a per-op-family
  breakdown from an un-graphed profiled run (event pairs around each op: the sum exceeds the graph
  step time by the launch gaps the graph removes);
- host memory: the process's peak RSS (ru_maxrss) after the load and at the end, and the largest
  anonymous RSS sampled during the load (the peak RSS also counts the pages of the memory-mapped
  checkpoint, which the kernel can drop; the anonymous part is what quantize-on-load must have);
- with --speculate-accept: at each depth the verify window's cost against a plain step and the
  speed of speculative rounds at a set draft acceptance (bench_speculative.py);
- the fraction of the bandwidth roofline: bytes read per token (active weights from
  `lampo.models.params`, bf16, + INT8 KV rows at that depth + GDN recurrent and conv state read and
  written) / time, divided by the measured device copy bandwidth (big D2D cudaMemcpy, bytes read +
  written).
Without a CUDA engine (CPU machines) the same measurements run on the numpy reference backend with
a small default workload, so the command works everywhere. `--preset` shapes need
`--random-weights` (weights filled in VRAM, or generated in memory for the reference).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from lampo.bench_speculative import SLOTS, SpecWorkload, accept_rates, format_speculative, measure_speculative
from lampo.cli import vram_bytes
from lampo.engine.loop import chunk_ends
from lampo.engine.picker import native_for
from lampo.models.config import ModelConfig
from lampo.models.memory_plan import active_weight_bytes, gdn_state_bytes, kv_bytes_per_token_per_layer
from lampo.models.quant.engine_formats import WEIGHT_CHOICES
from lampo.models.sampling_params import GREEDY

CUDA_DEFAULTS = dict(prompt="8192,65536", depths="0,8192,65536", decode_tokens=128)  # + the model's context
CPU_DEFAULTS = dict(prompt="64", depths="0,64", decode_tokens=8)
DEFAULT_PRESET = "tiny-moe"
WARMUP_STEPS = 4
BANDWIDTH_PROBE_BYTES = 1 << 30
MIN_PROBE_BYTES = 256 << 20  # several times any GPU's L2, so the copy still runs from DRAM


def probe_bytes(vram_limit: int, allocated: int) -> int:
    """Size of each of the copy-bandwidth probe's two buffers: BANDWIDTH_PROBE_BYTES, or under a VRAM
    limit (which the probe's buffers count against, as the engine's blocks do) what is left beside
    the engine, in whole MiB; 0 (no probe) where that is under MIN_PROBE_BYTES."""
    if not vram_limit:
        return BANDWIDTH_PROBE_BYTES
    n = min(BANDWIDTH_PROBE_BYTES, max(vram_limit - allocated, 0) // 2 >> 20 << 20)
    return n if n >= MIN_PROBE_BYTES else 0


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lampo bench", description="Measure prefill and decode speed.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, metavar="DIR", help="checkpoint directory (HF format)")
    src.add_argument("--preset", metavar="NAME", help="model shapes of a preset (needs --random-weights)")
    p.add_argument("--random-weights", action="store_true",
                   help="fill the preset's weights with deterministic random values (no file)")
    p.add_argument("--layers", type=int, metavar="N", help="keep only the first N layers")
    p.add_argument("--prompt", type=_int_list, metavar="N,N", help="prefill lengths "
                   f"(default {CUDA_DEFAULTS['prompt']} on CUDA, {CPU_DEFAULTS['prompt']} on CPU)")
    p.add_argument("--depths", type=_int_list, metavar="N,N", help="context depths for decode "
                   f"(default {CUDA_DEFAULTS['depths']} and the model's whole context on CUDA, "
                   f"{CPU_DEFAULTS['depths']} on CPU)")
    p.add_argument("--decode-tokens", type=int, metavar="N", help="timed decode steps per depth "
                   f"(default {CUDA_DEFAULTS['decode_tokens']} on CUDA, {CPU_DEFAULTS['decode_tokens']} on CPU)")
    p.add_argument("--chunk", type=int, default=2048, metavar="N", help="prefill chunk (default 2048)")
    p.add_argument("--context", type=int, metavar="N",
                   help="engine context (default: what the prompts and depths need, up to the model's)")
    p.add_argument("--fast-depth", action="store_true",
                   help="reach decode depths by filling KV cache and GDN state with random values")
    p.add_argument("--profile-steps", type=int, default=8, metavar="N",
                   help="un-graphed profiled decode steps per depth (0: skip; CUDA only)")
    p.add_argument("--backend", choices=("auto", "cuda", "reference"), default="auto")
    p.add_argument("--weights", choices=WEIGHT_CHOICES, default="auto",
                   help="weight format on CUDA: auto (a converted checkpoint's own, else the best LQ recipe that "
                   "fits), bf16, q5, q4 (quantized while loading; random weights are filled in that format)")
    p.add_argument("--vram-limit", type=vram_bytes, default=0, metavar="SIZE",
                   help="cap the engine's device memory, e.g. 24GiB (CUDA only)")
    p.add_argument("--speculate-accept", type=accept_rates, metavar="A,A",
                   help="also measure speculative decoding at these draft acceptance rates (e.g. 0.6,0.8,0.9)")
    p.add_argument("--draft-k", type=_int_list, default=[1, 2, 3, 4], metavar="K,K",
                   help="drafts per round for --speculate-accept (default 1,2,3,4)")
    p.add_argument("--mtp", action="store_true",
                   help="with --speculate-accept: load the MTP module, time its draft chain and run it in the rounds")
    p.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                   help="with --mtp: MTP drafts among ids [0, N) only, as `lampo chat` drafts for a conversation "
                   "whose tokens lie there (e.g. 98304: Latin-script text and code; lampo.models.draft_vocab); "
                   "the chain is also timed over every id. Default 0: every id")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    return p


@dataclass
class Workload:
    prompts: list[int]
    depths: list[int]
    decode_tokens: int
    chunk: int
    context_max: int
    fast_depth: bool
    profile_steps: int
    spec: SpecWorkload | None = None
    notes: list[str] = field(default_factory=list)


def plan_workload(args: argparse.Namespace, cfg: ModelConfig, cuda: bool) -> Workload:
    """Fill in per-backend defaults and fit everything into the context (noting any clamping)."""
    defaults = CUDA_DEFAULTS if cuda else CPU_DEFAULTS
    prompts = args.prompt or _int_list(defaults["prompt"])
    limit = cfg.max_position_embeddings
    if args.depths is not None:
        depths = args.depths
    else:
        depths = _int_list(defaults["depths"]) + ([limit] if cuda else [])
    n = args.decode_tokens or defaults["decode_tokens"]
    if n < 1 or args.chunk < 1:
        raise ValueError("--decode-tokens and --chunk must be >= 1")
    if any(p < 1 for p in prompts):
        raise ValueError("--prompt lengths must be >= 1")
    spec = None
    if args.speculate_accept:
        if not all(1 <= k <= 7 for k in args.draft_k):
            raise ValueError(f"--draft-k values must be in 1..7 (got {args.draft_k})")
        if args.mtp and not cfg.mtp_num_hidden_layers:
            raise ValueError("--mtp: this model has no MTP layer")
        if args.draft_vocab and not args.mtp:
            raise ValueError("--draft-vocab sets the MTP drafts' vocabulary: it needs --mtp")
        spec = SpecWorkload(args.speculate_accept, sorted(set(args.draft_k)), args.mtp, args.draft_vocab)
    # room after the deepest depth: warm-up + timed + profiled steps (+1 for the start token),
    # and what the speculative measurement runs past it
    tail = WARMUP_STEPS + n + (args.profile_steps if cuda else 0) + 1 + (spec.room(n) if spec else 0)
    context_max = args.context or min(limit, max(max(prompts), max(depths, default=0) + tail))
    if not 1 <= context_max <= limit:
        raise ValueError(f"--context must be in 1..{limit:,} (got {context_max:,})")
    w = Workload(prompts, [], n, args.chunk, context_max, args.fast_depth, args.profile_steps if cuda else 0, spec)
    omitted = os.environ.get("LAMPO_OMIT_OPS", "") if cuda else ""
    if omitted:
        w.notes.append(f"LAMPO_OMIT_OPS={omitted}: these op families are left out of every forward pass "
                       "(a timing diagnostic; the model's outputs are meaningless)")
    for p in prompts:
        if p > context_max:
            raise ValueError(f"prompt length {p:,} exceeds the context {context_max:,}")
    for d in sorted(set(depths)):
        fit = min(d, context_max - tail)
        if fit < 0:
            raise ValueError(f"the context {context_max:,} leaves no room for {tail} decode steps")
        if fit != d:
            w.notes.append(f"depth {d:,} lowered to {fit:,} to leave room for {tail} decode steps "
                           f"in the {context_max:,}-token context")
        if fit not in w.depths:
            w.depths.append(fit)
    return w


# ---- targets: what is being measured --------------------------------------------------------
def checkpoint_format(ck) -> str | None:
    """A checkpoint's weight format as stored: its LQ recipe, or "bf16" (HF); None without one."""
    if ck is None:
        return None
    return ck.lq.recipe if ck.lq is not None else "bf16"


class Target:
    """An engine under measurement, driven through the same `EngineSteps` adapter as the chat
    (greedy), so the bench times the chat's own calls. Subclasses make the adapter and add what
    only their engine can do (random depth fill, launch counts, the per-op profile)."""

    kind = ""

    weight_format = "bf16"  # the format the engine holds the weights in (a WEIGHT_FORMATS name)
    stored_format: str | None = None  # the checkpoint's: its recipe, or "bf16"; None for random weights

    def __init__(self, cfg: ModelConfig, steps, source: str, load: dict):
        self.cfg, self.steps, self.source, self.load = cfg, steps, source, load
        self.position = 0
        self.next_token = -1  # the last sampled token, fed by the next decode step
        self._slots: dict[int, tuple[int, int]] = {}  # slot -> (position, next_token)
        self._window: tuple[int, list[int]] = (0, [])  # the last verify: (start, ids)

    def reset(self) -> None:
        self.steps.reset()
        self.steps.begin()
        self.position = 0

    def snapshot(self, slot: int) -> None:
        self.steps.snapshot(slot)
        self._slots[slot] = (self.position, self.next_token)

    def restore(self, slot: int) -> None:
        self.steps.restore(slot)
        self.position, self.next_token = self._slots[slot]

    def verify(self, ids: list[int]) -> list[int]:
        """A speculative verify window (the token to feed, then drafts): each row's greedy token."""
        self._window = (self.position, list(ids))
        own = self._verify(ids)
        self.position += len(ids)
        return own

    def accept(self, keep: int, next_token: int) -> None:
        """Keep the first `keep` rows of the last verify; `next_token` is fed next."""
        start, ids = self._window
        self._accept(keep, ids)
        self.position, self.next_token = start + keep, next_token

    def settle(self) -> None:
        """Finish the work the last accept left for the next forward (the CUDA engine rebuilds
        the kept rows' GDN recurrent states then), so a timed window includes it."""

    def draft(self, k: int) -> list[int]:
        """k MTP drafts from the token to feed (the state is not advanced), each among ids [0,
        `draft_vocab`) (every id when 0)."""
        raise ValueError("--mtp needs an engine with the MTP module")

    draft_vocab = 0

    def _verify(self, ids: list[int]) -> list[int]:
        raise ValueError("--speculate-accept needs a verify window, which this engine has not")

    def _accept(self, keep: int, ids: list[int]) -> None:
        raise ValueError("--speculate-accept needs a verify window, which this engine has not")

    def prefill(self, ids: np.ndarray) -> int:
        start = self.position
        for end in chunk_ends(start, start + len(ids), self.steps.chunk):
            self.next_token = self.steps.prefill(ids[self.position - start:end - start], end == start + len(ids))
            self.position = end
        return self.next_token

    def decode(self, n: int) -> None:
        for _ in range(n):
            self.steps.decode_submit(self.next_token, 0)  # plain steps: no drafts
            self.next_token = self.steps.decode_collect().tokens[0]
            self.position += 1

    def fill_depth(self, depth: int, seed: int) -> None:
        raise ValueError("--fast-depth needs the CUDA engine")

    def device(self) -> dict:
        return {"name": "CPU (numpy reference)"}

    def vram(self) -> dict:
        return {}

    def launches(self) -> dict:
        return {}

    def profile(self, steps: int) -> dict[str, float]:
        return {}

    def profile_verify(self, ids: list[int], steps: int) -> dict[str, float]:
        """Un-graphed verify windows of `ids` timed per op family (the state moves on: restore it)."""
        return {}


class CudaTarget(Target):
    kind = "cuda"

    def __init__(self, native, cfg: ModelConfig, w: Workload, model_dir: Path | None, seed: int,
                 weights: str = "auto", vram_limit: int = 0):  # w.spec: the engine keeps verify rows and snapshots
        from lampo.engine.cuda import DEFAULT_SNAPSHOT_SLOTS, NativeSteps, create_engine, load_weights, resolve_weights
        from lampo.models.checkpoint import Checkpoint

        self.native = native
        self.vram_limit = vram_limit
        mtp = bool(w.spec and w.spec.mtp)
        ck = Checkpoint.open(model_dir, include_mtp=mtp) if model_dir is not None else None
        if mtp and ck is not None and not ck.has_mtp:
            raise ValueError(f"--mtp: {model_dir} has no MTP weights (mtp.*)")
        self.stored_format = checkpoint_format(ck)
        # a speculative workload's engine holds the snapshot slots `lampo chat` holds (its own need two)
        slots = max(SLOTS, DEFAULT_SNAPSHOT_SLOTS) if w.spec else 0
        sizes = dict(context_max=w.context_max, prefill_chunk=w.chunk, snapshot_slots=slots,
                     verify_rows=w.spec.rows if w.spec else 0, mtp=mtp)
        self.weight_format, bits = resolve_weights(native, cfg, weights, ck.lq if ck else None, vram_limit=vram_limit,
                                                   **sizes)
        self.engine = create_engine(native, cfg, weights=self.weight_format, tensor_bits=bits, vram_limit=vram_limit,
                                    **sizes)
        t0 = time.perf_counter()
        if ck is not None:
            with ck:
                n = load_weights(self.engine, ck)
            source, load = f"checkpoint {model_dir}", {"bytes": n, "seconds": time.perf_counter() - t0}
        else:
            self.engine.random_weights(seed)
            source = "random weights filled in VRAM (no checkpoint file)"
            load = {"bytes": self.engine.weight_bytes, "seconds": time.perf_counter() - t0}
            t0 = time.perf_counter()  # the NaN/Inf census a checkpoint load ends with, timed alone
            found = self.engine.nonfinite_census()
            load["census"] = {"seconds": time.perf_counter() - t0, "tensors_with_nonfinite": len(found)}
        super().__init__(cfg, NativeSteps(self.engine, native, replace(GREEDY, seed=seed)), source, load)

    def fill_depth(self, depth: int, seed: int) -> None:
        self.engine.fill_state_random(depth, seed)
        self.position = depth

    def draft(self, k: int) -> list[int]:
        return [int(t) for t in self.engine.mtp_draft(self.next_token, k)]

    @property
    def draft_vocab(self) -> int:
        return self.engine.draft_vocab

    @draft_vocab.setter
    def draft_vocab(self, n: int) -> None:
        self.engine.draft_vocab = n

    def _verify(self, ids: list[int]) -> list[int]:
        return [int(t) for t in self.engine.verify(np.asarray(ids, np.int32))]

    def _accept(self, keep: int, ids: list[int]) -> None:
        self.engine.accept(keep)

    def settle(self) -> None:
        self.engine.settle()

    def device(self) -> dict:
        info = self.native.device_info()
        vram = self.vram()
        n = probe_bytes(self.vram_limit, vram["engine_allocated"])
        info.update(vram, copy_bandwidth=self.native.measure_copy_bandwidth(n, 20) if n else None)
        return info

    def vram(self) -> dict:
        free, total = self.native.mem_info()
        return dict(vram_used=total - free, vram_total=total, engine_allocated=self.native.engine_allocated())

    def launches(self) -> dict:
        return dict(self.engine.decode_graph_info())

    def profile(self, steps: int) -> dict[str, float]:
        return dict(self.engine.profile_decode(steps))

    def profile_verify(self, ids: list[int], steps: int) -> dict[str, float]:
        return dict(self.engine.profile_verify(np.asarray(ids, np.int32), steps))


class ReferenceTarget(Target):
    """The numpy reference model (CPU)."""

    kind = "reference"

    def __init__(self, cfg: ModelConfig, model_dir: Path | None, seed: int, chunk: int, mtp: bool = False):
        """`mtp`: random weights include the MTP module (--mtp); a checkpoint's is read when it has one."""
        from lampo.engine.reference import ReferenceSteps
        from lampo.models.reference.model import ReferenceModel

        t0 = time.perf_counter()
        if model_dir is not None:
            from lampo.models.checkpoint import Checkpoint

            ck = Checkpoint.open(model_dir)
            self.stored_format = checkpoint_format(ck)
            model = ReferenceModel.from_checkpoint(ck)
            source = f"checkpoint {model_dir}"
        else:
            from lampo.models.synthetic import synthetic_tensor
            from lampo.models.tensor_specs import expected_tensors

            specs = expected_tensors(cfg, include_mtp=mtp)
            model = ReferenceModel(cfg, {n: synthetic_tensor(n, s, seed) for n, s in specs.items()})
            source = "random weights generated in memory (no checkpoint file)"
        steps = ReferenceSteps(model, {}, replace(GREEDY, seed=seed), chunk)
        super().__init__(cfg, steps, source, {"bytes": 0, "seconds": time.perf_counter() - t0})
        self.model = model
        self._before = None  # the state before the last verify

    def draft(self, k: int) -> list[int]:
        """The MTP chain from the last hidden row. The reference's plain steps run no MTP rows, so
        the chain starts where its MTP cache ends: the cost is right, the drafts are not."""
        model, drafts = self.model, []
        start = model.state.kv[-1].length  # the MTP layer's cache
        logits = model.mtp_step(model.hiddens[-1], self.next_token, start)
        for i in range(k):
            drafts.append(int(np.argmax(logits[:self.draft_vocab or None])))
            if i + 1 < k:
                logits = model.mtp_step(model.mtp_hidden_last, drafts[-1], start + 1 + i)
        return drafts

    def _verify(self, ids: list[int]) -> list[int]:
        self._before = self.model.snapshot()
        return [int(t) for t in np.argmax(self.model.prefill(ids), axis=-1)]  # padding ids are -inf

    def _accept(self, keep: int, ids: list[int]) -> None:
        self.model.restore(self._before)
        self.model.advance(ids[:keep])


# ---- measurements ---------------------------------------------------------------------------
def peak_rss_mib() -> float:
    """The process's peak resident set so far (ru_maxrss: KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class AnonPeak:
    """The largest anonymous resident set (RssAnon of /proc/self/status, MiB) seen while in the
    `with` block, sampled every 10 ms by a thread; `mib` stays None where there is no /proc."""

    def __init__(self):
        self.mib: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            try:
                with open("/proc/self/status", encoding="ascii") as f:
                    kib = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
            except (OSError, StopIteration, ValueError):
                return
            self.mib = max(self.mib or 0.0, kib / 1024)
            if self._stop.wait(0.01):
                return

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def bytes_per_token(cfg: ModelConfig, depth: int, weights: str = "bf16") -> dict[str, int]:
    """Bytes one decode step reads (and, for the GDN state, writes) at `depth` tokens of context,
    with the weights in a WEIGHT_FORMATS format."""
    recurrent, conv = gdn_state_bytes(cfg)
    parts = {
        "weights": active_weight_bytes(cfg, weights),
        "kv_cache": len(cfg.full_layer_ids) * kv_bytes_per_token_per_layer(cfg, "int8") * depth,
        "gdn_state": 2 * (recurrent + conv),
    }
    parts["total"] = sum(parts.values())
    return parts


def random_ids(cfg: ModelConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, cfg.real_vocab_size, size=n, dtype=np.int32)


def measure_prefill(target, length: int, w: Workload, rng) -> dict:
    ids = random_ids(target.cfg, length, rng)
    target.reset()
    t0 = time.perf_counter()
    target.prefill(ids)
    seconds = time.perf_counter() - t0
    return {"tokens": length, "seconds": seconds, "tokens_per_second": length / seconds,
            "ttft_ms": seconds * 1000.0}


def reach_depth(target, depth: int, w: Workload, rng, seed: int) -> str:
    """Bring the state to `depth` tokens (at least 1: decoding needs a last token)."""
    if w.fast_depth and depth > 0:
        target.reset()
        target.fill_depth(depth - 1, seed)
        target.prefill(random_ids(target.cfg, 1, rng))
        return "random fill"
    if target.position > max(depth - 1, 0) or depth == 0:
        target.reset()
    todo = max(depth, 1) - target.position
    if todo > 0:
        target.prefill(random_ids(target.cfg, todo, rng))
    return "prefill"


def measure_decode(target, depth: int, w: Workload, rng, bandwidth: float | None, seed: int) -> dict:
    how = reach_depth(target, depth, w, rng, seed)
    start = target.position
    target.decode(WARMUP_STEPS)
    t0 = time.perf_counter()
    target.decode(w.decode_tokens)
    seconds = time.perf_counter() - t0
    tok_s = w.decode_tokens / seconds
    bytes_tok = bytes_per_token(target.cfg, start, target.weight_format)
    out = {"depth": start, "reached_by": how, "tokens": w.decode_tokens, "seconds": seconds,
           "tokens_per_second": tok_s, "ms_per_token": 1000.0 / tok_s, "bytes_per_token": bytes_tok}
    if bandwidth:
        out["roofline_tokens_per_second"] = bandwidth / bytes_tok["total"]
        out["roofline_fraction"] = tok_s * bytes_tok["total"] / bandwidth
    if w.profile_steps:
        out["profile_ms"] = target.profile(w.profile_steps)
    return out


# ---- reporting ------------------------------------------------------------------------------
def git_commit() -> str:
    if os.environ.get("LAMPO_COMMIT"):
        return os.environ["LAMPO_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def format_report(r: dict) -> str:
    lines = [f"model: {r['model']} ({r['layers']} layers, {r['backend']} backend) - {r['weights']}, "
             f"{r.get('weight_format', 'bf16')}",
             f"device: {r['device'].get('name', '?')}"]
    dev = r["device"]
    if dev.get("copy_bandwidth"):
        lines[-1] += f", copy bandwidth {dev['copy_bandwidth'] / 1e12:.2f} TB/s (read + written)"
    if dev.get("vram_total"):
        lines.append(f"VRAM used: {_gib(dev['vram_used'])} of {_gib(dev['vram_total'])}")
        end = dev.get("vram_end") or {}
        if end:
            lines[-1] += (f" after loading, {_gib(end['vram_used'])} at the end (the engine's blocks "
                          f"{_gib(end['engine_allocated'])}" +
                          (f", limit {_gib(r['vram_limit'])})" if r.get("vram_limit") else ")"))
    host = r.get("host_memory")
    if host:
        anon = host.get("load_peak_anon_mib")
        lines.append(f"host memory: peak RSS {host['peak_rss_after_load_mib']:,.0f} MiB after loading "
                     f"({r['load']['seconds']:,.1f} s from {r['weights_from']}"
                     + (f"; anonymous at most {anon:,.0f} MiB while loading" if anon is not None else "")
                     + f"), {host['peak_rss_end_mib']:,.0f} MiB at the end")
    census = r["load"].get("census")
    if census:
        lines.append(f"NaN/Inf census of the weights in VRAM: {census['seconds'] * 1e3:,.1f} ms "
                     f"({_gib(r['load']['bytes'])}; {census['tensors_with_nonfinite']} tensors with any)")
    if r.get("launches_per_token"):
        lines.append(f"launches per decode step: {r['launches_per_token']['kernels']} kernels "
                     f"({r['launches_per_token']['nodes']} graph nodes)")
    lines.append(f"context {r['context_max']:,}, prefill chunk {r['chunk']:,}")
    lines += [f"note: {n}" for n in r["notes"]]
    lines.append("")
    lines.append(f"{'prefill tokens':>15} {'tok/s':>10} {'TTFT ms':>10}")
    for p in r["prefill"]:
        lines.append(f"{p['tokens']:>15,} {p['tokens_per_second']:>10,.1f} {p['ttft_ms']:>10,.1f}")
    lines.append("")
    lines.append(f"{'decode depth':>15} {'reached by':>12} {'tok/s':>10} {'ms/token':>9} "
                 f"{'GB/token':>9} {'roofline':>9}")
    for d in r["decode"]:
        frac = f"{100 * d['roofline_fraction']:.1f}%" if "roofline_fraction" in d else "-"
        lines.append(f"{d['depth']:>15,} {d['reached_by']:>12} {d['tokens_per_second']:>10,.1f} "
                     f"{d['ms_per_token']:>9.3f} {d['bytes_per_token']['total'] / 1e9:>9.3f} {frac:>9}")
    if r.get("speculative"):
        lines += format_speculative(r["speculative"])
    for d in r["decode"]:
        if d.get("profile_ms"):
            lines += format_profile(f"per-op ms per decode step at depth {d['depth']:,}", d["profile_ms"])
    for row in r.get("speculative") or []:
        for d in row["draft_counts"]:
            if d.get("profile_ms"):
                lines += format_profile(f"per-op ms per verify window of {d['k'] + 1} tokens at depth "
                                        f"{row['depth']:,}", d["profile_ms"])
    return "\n".join(lines)


def format_profile(title: str, profile_ms: dict[str, float]) -> list[str]:
    """An un-graphed per-op profile, largest family first."""
    lines = ["", f"{title} (un-graphed, events):"]
    for k, v in sorted(((k, v) for k, v in profile_ms.items() if v > 0), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<16} {v:8.3f}")
    return lines


def resolve_model(args) -> tuple[ModelConfig, Path | None]:
    from lampo.models.config import load_config
    from lampo.models.presets import get_preset

    if args.model is not None:
        cfg = load_config(args.model)
        model_dir = args.model
    else:
        if args.preset is not None and not args.random_weights:
            raise ValueError("a preset has no weights: add --random-weights, or write a checkpoint with "
                             "`python -m lampo.models.synthetic PRESET DIR` and pass --model DIR")
        cfg = get_preset(args.preset or DEFAULT_PRESET)
        model_dir = None
    if args.layers is not None:
        if not 1 <= args.layers <= cfg.num_hidden_layers:
            raise ValueError(f"--layers must be in 1..{cfg.num_hidden_layers} (got {args.layers})")
        if model_dir is not None:
            raise ValueError("--layers applies to --preset only (a checkpoint has its own layer count)")
        cfg = cfg.with_layers(args.layers)
    return cfg, model_dir


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    cfg, model_dir = resolve_model(args)
    native = native_for(args.backend)
    w = plan_workload(args, cfg, cuda=native is not None)
    if native is None and (args.weights not in ("auto", "bf16") or args.vram_limit):
        w.notes.append("--weights and --vram-limit apply to the CUDA engine; the reference runs the weights as stored")
    with AnonPeak() as anon:
        target = (CudaTarget(native, cfg, w, model_dir, args.seed, args.weights, args.vram_limit) if native is not None
                  else ReferenceTarget(cfg, model_dir, args.seed, w.chunk, mtp=bool(w.spec and w.spec.mtp)))
    host = {"peak_rss_after_load_mib": peak_rss_mib()}
    if anon.mib is not None:
        host["load_peak_anon_mib"] = anon.mib
    device = target.device()
    rng = np.random.default_rng(args.seed)
    target.prefill(random_ids(cfg, min(w.chunk, max(w.prompts)), rng))  # warm-up
    prefill = [measure_prefill(target, p, w, rng) for p in w.prompts]
    decode, speculative = [], []
    for d in w.depths:
        decode.append(measure_decode(target, d, w, rng, device.get("copy_bandwidth"), args.seed))
        if w.spec:
            speculative.append(measure_speculative(target, decode[-1], w.spec, w.decode_tokens, rng, w.profile_steps))
    device["vram_end"] = target.vram()  # after the deepest context: the run's VRAM as measured
    host["peak_rss_end_mib"] = peak_rss_mib()
    return {
        "model": cfg.name or (model_dir.name if model_dir else "?"),
        "layers": cfg.num_hidden_layers,
        "backend": target.kind,
        "weights": target.source,
        "weights_from": "files" if target.stored_format else "random",
        "stored_format": target.stored_format,
        "weight_format": target.weight_format,
        "vram_limit": args.vram_limit,
        "load": target.load,
        "host_memory": host,  # MiB
        "device": device,
        "launches_per_token": target.launches(),
        "context_max": w.context_max,
        "chunk": w.chunk,
        "fast_depth": w.fast_depth,
        "notes": w.notes,
        "prefill": prefill,
        "decode": decode,
        **({"speculative": speculative} if w.spec else {}),
        "commit": git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["lampo", "bench", *argv]),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        result = run(args, argv)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"lampo bench: {e}", file=sys.stderr)
        return 2
    print(format_report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
