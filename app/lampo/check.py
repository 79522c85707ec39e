"""`lampo check`: the CUDA engine on this GPU against the numpy reference.

Lampo's kernels are measured on an H200 (sm_90); other GPUs take other paths through them (no
programmatic dependent launch, thread block clusters or bulk-copy rings before sm_90, the portable
GEMM instead of the sm_90a one, their own shared-memory sizes and SM counts). This command writes
small random-weight checkpoints of both model kinds (dense like the 27B, MoE like the 35B-A3B, each
with its MTP layer and the real tokenizer) into a temporary folder, runs each on the GPU with bf16
weights and quantized to q5 while loading, and compares with the numpy reference on the same
weights (for q5 the numpy quantizer's, `models/quant/round_trip.py`; bounds in
`models/logit_agreement.py`):

- rows: the last row of a 150-token prefill and six one-token steps, each within ROW_REL_L2 of the
  reference's row and keeping TOP5_KEPT of its five best ids (the reference of an MoE model
  replays the experts the engine chose, so a router near-tie cannot move a row);
- graphed step: three graphed decode steps against the same tokens fed as one-token prefills
  (REPEAT_REL_L2);
- MTP drafts: a chain of DRAFTS drafts after a prefill, each draft's logits against the
  reference's MTP layer on the same tokens (an MoE's MTP experts are not replayed: MOE_MEDIAN and
  LOOSE);
- speculative: a greedy reply of REPLY tokens with MTP drafts (DRAFTS a round) equal to the plain
  greedy reply, both running to their full length; where they part, the plain path's two
  candidates must be a near-tie (NEAR_TIE: the verify rows and the decode step round differently).

Each line says what was compared and how close it came. Exit status: 0 all passed, 1 a check
failed, 2 the CUDA engine cannot run here (not built, no GPU, or built for other GPUs). `--json FILE`
writes the results with the GPU's name.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

CASES = (("tiny-dense", "bf16"), ("tiny-dense", "q5"), ("tiny-moe", "bf16"), ("tiny-moe", "q5"))
SEED = 1
PROMPT, STEPS, GRAPHED = 150, 6, 3
REPLY, DRAFTS = 64, 3
CONTEXT = 1024


@dataclass
class Result:
    case: str     # "tiny-dense q5"
    check: str    # "rows", "graphed step", "MTP drafts", "speculative"; "error" for a case that raised
    ok: bool
    detail: str   # what was compared and how close it came
    values: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.case:<16} {self.check:<13} {self.detail}"


# ---- one engine, raw: rows, the graphed step, MTP drafts -------------------------------------
def _fresh(engine) -> None:
    engine.reset()
    engine.set_sampling(0.0, 0, 1.0, 0.0, 0.0, 0)
    engine.begin_generation()


def _replay(engine, moe: bool):
    from lampo.models.reference.ffn import Routing

    return Routing(engine.routing()) if moe else None


def check_rows(case: str, engine, ref, cfg) -> Result:
    """A prefill's last row and STEPS one-token steps against the reference's rows."""
    from lampo.models.logit_agreement import ROW_REL_L2, TOP5_KEPT, rel_l2, top5_kept

    vocab, moe = cfg.real_vocab_size, cfg.is_moe
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, vocab, PROMPT).astype(np.int32)
    _fresh(engine)
    ref.reset()
    engine.prefill(ids, True)
    rows = [(engine.logits(), ref.prefill(ids, last_only=True, routing=_replay(engine, moe)))]
    for token in rng.integers(0, vocab, STEPS):
        engine.prefill(np.asarray([token], np.int32), True)
        rows.append((engine.logits(), ref.decode(int(token), routing=_replay(engine, moe))))
    errs = [rel_l2(got, want, vocab) for got, want in rows]
    kept = [top5_kept(got, want, vocab) for got, want in rows]
    ok = max(errs) <= ROW_REL_L2 and min(kept) >= TOP5_KEPT
    detail = (f"{len(rows)} rows: worst relative L2 error {max(errs):.1e} (at most {ROW_REL_L2:.0e}), "
              f"fewest of the reference's top 5 kept {min(kept)} (at least {TOP5_KEPT})")
    return Result(case, "rows", ok, detail, {"rel_l2": errs, "top5_kept": kept})


def check_graphed_step(case: str, engine, cfg) -> Result:
    """GRAPHED graphed decode steps against the same tokens fed as one-token prefills."""
    from lampo.models.logit_agreement import REPEAT_REL_L2, rel_l2

    rng = np.random.default_rng(SEED + 1)
    ids = rng.integers(0, cfg.real_vocab_size, 70).astype(np.int32)
    tokens = [int(t) for t in rng.integers(0, cfg.real_vocab_size, GRAPHED)]
    _fresh(engine)
    engine.prefill(ids, True)
    engine.snapshot(0)
    for token in tokens:
        engine.decode(token)
    graphed = np.asarray(engine.logits())
    engine.restore(0)
    for token in tokens:
        engine.prefill(np.asarray([token], np.int32), True)
    err = rel_l2(graphed, engine.logits(), cfg.real_vocab_size)
    detail = f"{GRAPHED} steps against one-token prefills: relative L2 error {err:.1e} (at most {REPEAT_REL_L2:.0e})"
    return Result(case, "graphed step", err <= REPEAT_REL_L2, detail, {"rel_l2": err})


def check_mtp_drafts(case: str, engine, ref, cfg) -> Result:
    """A chain of DRAFTS MTP drafts after a prefill against the reference's MTP layer."""
    from lampo.models.logit_agreement import LOOSE, MOE_MEDIAN, ROW_REL_L2, rel_l2

    vocab = cfg.real_vocab_size
    prompt = np.random.default_rng(SEED + 3).integers(0, vocab, 60).astype(np.int32)
    _fresh(engine)
    first = engine.prefill(prompt, True)
    rows = []
    for j in range(1, DRAFTS + 1):  # mtp_draft(token, j) rewrites the chain's rows and leaves step j's logits
        drafts = [int(t) for t in engine.mtp_draft(first, j)]
        rows.append(np.asarray(engine.logits()))
    errs = [rel_l2(got, want, vocab) for got, want in zip(rows, ref.mtp_chain(prompt, first, drafts))]
    if cfg.is_moe:
        ok = float(np.median(errs)) <= MOE_MEDIAN and max(errs) <= LOOSE
        bound = f"median at most {MOE_MEDIAN:.0e}, each at most {LOOSE} (the MTP layer's experts are not replayed)"
    else:
        ok, bound = max(errs) <= ROW_REL_L2, f"at most {ROW_REL_L2:.0e}"
    detail = f"{DRAFTS} chained drafts: relative L2 errors {', '.join(f'{e:.1e}' for e in errs)} ({bound})"
    return Result(case, "MTP drafts", ok, detail, {"rel_l2": errs})


# ---- the chat's own path: greedy replies through the backend ---------------------------------
def greedy_reply(native, model_dir: Path, weights: str, speculation, prompt: tuple[int, ...]):
    """The ids of a greedy reply of REPLY tokens through the chat's backend (no stop ids) and its
    Done event."""
    from lampo.engine.cuda import CudaBackend
    from lampo.engine.protocol import Done, GenerationRequest, TokenEvent
    from lampo.models.sampling_params import GREEDY, SamplingParams

    backend = CudaBackend(model_dir, context_max=CONTEXT, native=native, weights=weights, speculation=speculation)
    try:
        params = SamplingParams(**{**GREEDY.to_dict(), "max_tokens": REPLY})
        ids, done = [], None
        for event in backend.generate(GenerationRequest(prompt, params, stop_ids=()), threading.Event()):
            if isinstance(event, TokenEvent):
                ids.extend(event.ids)
            elif isinstance(event, Done):
                done = event
        return ids, done
    finally:
        backend.close()


def check_speculative(case: str, reply: Callable, tie_gap: Callable[[list[int], int, int], float]) -> Result:
    """`reply(speculation)`: (ids, Done) of the greedy reply under that setting; `tie_gap(prefix,
    a, b)`: how far apart (in standard deviations of the row) the plain path puts tokens a and b
    after the prompt and `prefix`. MTP rounds must give the plain reply, but where a near-tie
    parts them."""
    from lampo.engine.speculation import Speculation
    from lampo.models.logit_agreement import NEAR_TIE

    replies = {"plain": reply(Speculation("off")), f"mtp:{DRAFTS}": reply(Speculation("mtp", DRAFTS))}
    for label, (ids, done) in replies.items():
        if done is None or done.reason != "length" or len(ids) != REPLY:
            why = "no end" if done is None else done.reason + (f": {done.error}" if done.error else "")
            return Result(case, "speculative", False, f"the {label} reply stopped after {len(ids)} of {REPLY} "
                          f"tokens ({why})", {"tokens": len(ids)})
    (plain, _), (drafted, done) = replies.values()
    stats = done.stats
    rounds = (f"{stats.draft_rounds} rounds verified {stats.draft_n} drafts, kept {stats.draft_n_accepted}")
    if stats.draft_rounds == 0:
        return Result(case, "speculative", False, f"the mtp:{DRAFTS} reply verified no drafts ({rounds})", {"rounds": 0})
    agree = next((i for i, (a, b) in enumerate(zip(plain, drafted)) if a != b), REPLY)
    values = {"agree": agree, "rounds": stats.draft_rounds, "drafts": stats.draft_n, "kept": stats.draft_n_accepted}
    if agree == REPLY:
        return Result(case, "speculative", True, f"mtp:{DRAFTS} against plain greedy: all {REPLY} tokens equal "
                      f"({rounds})", values)
    gap = tie_gap(plain[:agree], plain[agree], drafted[agree])
    ok = gap < NEAR_TIE
    detail = (f"mtp:{DRAFTS} against plain greedy ({rounds}): the first {agree} of {REPLY} tokens equal, then "
              f"the plain path's two candidates lie {gap:.3f} standard deviations apart "
              f"({'a near-tie: under' if ok else 'not a near-tie: at least'} {NEAR_TIE})")
    return Result(case, "speculative", ok, detail, {**values, "gap": gap})


def plain_tie_gap(engine, cfg, prompt: tuple[int, ...]) -> Callable[[list[int], int, int], float]:
    """tie_gap for check_speculative on a raw engine: the prompt, the prefix as one-token
    prefills (the decode step's kernels), then the two tokens' distance in the row."""
    from lampo.models.logit_agreement import gap_in_stds

    def gap(prefix: list[int], a: int, b: int) -> float:
        _fresh(engine)
        engine.prefill(np.asarray(prompt, np.int32), True)
        for token in prefix:
            engine.prefill(np.asarray([token], np.int32), True)
        return gap_in_stds(engine.logits(), a, b, cfg.real_vocab_size)

    return gap


# ---- the whole run ---------------------------------------------------------------------------
def write_model(workdir: Path, preset: str) -> Path:
    from lampo import paths
    from lampo.models.presets import get_preset
    from lampo.models.synthetic import write_checkpoint

    return write_checkpoint(workdir / preset, get_preset(preset), seed=SEED, tokenizer=paths.tokenizer_file())


def run_case(native, model_dir: Path, weights: str) -> list[Result]:
    """The checks of one model directory with `weights` ("bf16" or a recipe name)."""
    from lampo.engine.cuda import load_weights
    from lampo.models.checkpoint import Checkpoint
    from lampo.models.quant.engine_formats import recipe_tensor_bits
    from lampo.models.quant.round_trip import quantized_weights
    from lampo.models.reference.model import ReferenceModel
    from lampo.models.tensor_specs import engine_tensor_names

    with Checkpoint.open(model_dir) as ck:
        cfg = ck.config
        bits = {} if weights == "bf16" else recipe_tensor_bits(cfg, weights, mtp=True)
        ref = ReferenceModel.from_checkpoint(ck) if not bits else ReferenceModel(cfg, quantized_weights(ck, bits))
        engine = native.Engine(cfg, engine_tensor_names(cfg, mtp=True), bits, context_max=CONTEXT,
                               prefill_chunk=256, snapshot_slots=2, verify_rows=DRAFTS + 1)
        load_weights(engine, ck)
    case = f"{model_dir.name} {weights}"
    engine.set_record_routing(cfg.is_moe)
    results = [check_rows(case, engine, ref, cfg)]
    engine.set_record_routing(False)
    results += [check_graphed_step(case, engine, cfg), check_mtp_drafts(case, engine, ref, cfg)]
    prompt = tuple(int(t) for t in np.random.default_rng(SEED + 2).integers(0, cfg.real_vocab_size, 50))
    results.append(check_speculative(
        case, lambda speculation: greedy_reply(native, model_dir, weights, speculation, prompt),
        plain_tie_gap(engine, cfg, prompt)))
    return results


def run_checks(native, workdir: Path, cases: Iterable[tuple[str, str]] = CASES,
               say: Callable[[str], None] = print) -> list[Result]:
    """Every case's checks, each line said as it ends; a case that raises is one failed line."""
    results: list[Result] = []
    models: dict[str, Path] = {}
    for preset, weights in cases:
        try:
            if preset not in models:
                models[preset] = write_model(workdir, preset)
            done = run_case(native, models[preset], weights)
        except Exception as e:  # noqa: BLE001 - a CUDA or shape error is this case's result, not the run's end
            done = [Result(f"{preset} {weights}", "error", False, f"{type(e).__name__}: {e}")]
        for r in done:
            say(r.line())
        results.extend(done)
    return results


def device_line(native) -> str:
    """The GPU, and what the engine's kernels were built for: a build for an older architecture
    runs from code the driver compiled for this GPU, without the sm_90 forms."""
    info = native.device_info()
    cc, code = info["compute_capability"], info.get("device_code", info["compute_capability"])
    line = (f"{info['name']}: compute capability {cc}, {info['sm_count']} SMs, {info['memory'] / (1 << 30):.1f} GiB; "
            f"engine built for {getattr(native, 'cuda_architectures', '?')}")
    if code != cc:
        line += (f"; its kernels run from code for {code}, compiled by the driver for this GPU "
                 f"(LAMPO_CUDA_ARCH={cc.replace('.', '')} at install builds for it)")
    return line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lampo check",
        description="Compare the CUDA engine on this GPU with Lampo's numpy reference: small random-weight "
        "models of both kinds (dense and MoE), with bf16 weights and quantized to q5 while loading; prefill "
        "and decode logits, the graphed decode step, the MTP layer's drafts, and greedy replies with and "
        "without speculative drafts. Exit status 0: every check passed; 1: a check failed; 2: no CUDA "
        "engine or GPU here, or a build this GPU cannot load.")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from lampo.engine.cuda import EngineUnavailable, load_native

    try:
        native = load_native()
    except EngineUnavailable as e:
        print(f"lampo check: {e}; nothing to check (the numpy reference engine is the oracle itself)",
              file=sys.stderr)
        return 2
    try:
        device = device_line(native)
    except RuntimeError as e:  # lampo._native.CudaError: a build this GPU cannot load names its fix
        print(f"lampo check: {e}", file=sys.stderr)
        return 2
    print(device)
    with tempfile.TemporaryDirectory(prefix="lampo-check-") as tmp:
        results = run_checks(native, Path(tmp))
    failed = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(failed)} of {len(results)} checks passed" +
          (": please report the failed lines with this GPU's name" if failed else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"device": device, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
