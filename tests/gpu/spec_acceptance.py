"""Draft acceptance of speculative decoding on the trained measurement model, with the numpy
reference's algorithm (lampo.models.speculative): for MTP and n-gram (prompt lookup) drafts and
k = 1..4, greedy, on a chat-style prompt and a document-quoting prompt taken from source files the
model was not trained on (tests/gpu/train_measure_model.py's held-out split). Every speculative run
must reproduce plain greedy decoding token for token (asserted); the JSON gives per run the
acceptance per draft position, the acceptance %, the mean tokens per target forward and the numpy
run's seconds (the runs spread over --workers processes). With --engine, the same prompts run on
the CUDA engine instead (CudaBackend, bf16 weights): plain, greedy rounds of MTP and n-gram drafts
for k = 1..4, and auto (the drafter, k or a plain step chosen each round from what it measured);
then sampled replies at the chat's default settings, plain and with MTP drafts for k = 1..4,
each with its acceptance, the share of rounds that kept each draft position, drafting rounds,
decode tok/s and where its reply first differs from the engine's plain reply (null: nowhere; the
verify window and the decode step round differently in bf16, so a near-tie may part them). The two
are separate runs so that the engine's timings are taken with the GPU to themselves while the numpy
run (CPU only) may overlap other GPU work.

With --engine-json (an --engine run's output), the reference run first compares the engine's
plain replies with its own: where they part, and the teacher-forced MTP agreement along each
(the MTP draft of every reply position from the true previous token), which tells a reply that
went elsewhere from drafts that are worse on the same text.

    python3 tests/gpu/spec_acceptance.py MODEL_DIR --json OUT [--tokens 256] [--workers N]
        [--engine | --engine-json E]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from lampo.models.chat_format import Message, render
from lampo.models.checkpoint import Checkpoint
from lampo.models.reference.model import ReferenceModel
from lampo.models.sampling import filtered_probs
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.models.draft_vocab import DraftVocab
from lampo.models.speculative import SpeculativeReference
from lampo.models.tokenizer import Tokenizer


def _training_script():
    path = Path(__file__).with_name("train_measure_model.py")
    spec = importlib.util.spec_from_file_location("lampo_train_measure_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def held_out_prompts(doc_chars: int = 2500) -> dict[str, str]:
    """A chat question about a documented function, and a file given whole with a request to quote
    part of it, both from the first held-out source file that has a documented function."""
    train = _training_script()
    for key, path in train.source_files():
        if train.stable_hash("split:" + key) % 50:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        chats = train.chat_samples(text, key, limit=1)
        if not chats or len(text) < doc_chars:
            continue
        question = chats[0].split("<|im_start|>assistant")[0] + "<|im_start|>assistant\n"
        doc = render([Message("user", f"{text[:doc_chars]}\n\nQuote the first twenty lines of this file exactly.")])
        return {"chat": question, "document": doc, "source": key}
    raise RuntimeError("no held-out source file with a documented function")


def plain_greedy(model: ReferenceModel, prompt: list[int], n: int) -> list[int]:
    model.reset()
    logits = model.prefill(prompt, last_only=True)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = model.decode(out[-1])
    return out


def first_difference(got: list[int], want: list[int]) -> int | None:
    """The first position where two replies differ (the shorter one's length when one is a prefix
    of the other), or None when they are equal."""
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                None if len(got) == len(want) else min(len(got), len(want)))


def engine_rows(model_dir: Path, prompts: dict[str, list[int]], tokens: int, tokenizer) -> list[dict]:
    """Plain and speculative greedy replies on the CUDA engine, one backend per setting."""
    import threading

    from lampo.engine.cuda import CudaBackend
    from lampo.engine.protocol import GenerationRequest, Stats, TokenEvent
    from lampo.engine.speculation import Speculation
    from lampo.models.sampling_params import SamplingParams

    rows = []
    greedy = SamplingParams(**{**GREEDY.to_dict(), "max_tokens": tokens})
    chat = SamplingParams(seed=1, max_tokens=tokens)  # the chat's default sampling settings, seeded
    settings = ([Speculation("off")] + [Speculation(d, k) for d in ("mtp", "ngram") for k in (1, 2, 3, 4)]
                + [Speculation("auto")])
    # the first MTP setting again with the prompts in the other order: a row that moves with the
    # order would be state carried from one request into the next; then sampled replies at the
    # chat's settings, plain and with MTP drafts drawn from their own distribution
    runs = ([(s, list(prompts), greedy) for s in settings] + [(settings[1], list(reversed(prompts)), greedy)]
            + [(s, list(prompts), chat) for s in [Speculation("off")] + [Speculation("mtp", k) for k in (1, 2, 3, 4)]])
    plain: dict[tuple[str, bool], list[int]] = {}
    for speculation, order, request in runs:
        backend = CudaBackend(model_dir, context_max=16_384, weights="bf16", speculation=speculation,
                              tokenizer=tokenizer)
        for kind in order:
            ids = prompts[kind]
            events = list(backend.generate(GenerationRequest(tuple(ids), request), threading.Event()))
            got = [i for e in events if isinstance(e, TokenEvent) for i in e.ids]
            stats = [e for e in events if isinstance(e, Stats)][-1]
            parts = first_difference(got, plain.setdefault((kind, request.greedy), got))
            rows.append({"prompt": kind, "setting": str(speculation), "order": order, "tokens": len(got),
                         "sampling": "greedy" if request.greedy else "chat", "differs_at": parts,
                         "drafted": stats.draft_n, "accepted": stats.draft_n_accepted, "rounds": stats.draft_rounds,
                         "acceptance_pct": 100 * (stats.acceptance or 0.0),
                         "kept_at_pct_of_rounds": [100 * n / stats.draft_rounds for n in stats.draft_kept_at],
                         "decode_tok_s": stats.predicted_per_second}
                        | ({"reply": got} if speculation.mode == "off" and request.greedy else {}))
            print(json.dumps(rows[-1]), flush=True)
        backend.close()
    return rows


def mtp_agreement(model: ReferenceModel, prompt: list[int], reply: list[int]) -> dict:
    """Teacher-forced MTP agreement along prompt + reply: the % of reply positions t >= 1 whose
    token the MTP row of (h_{t-1}, reply[t-1]) drafts (the rows a k = 1 round would check), with the
    drafts chosen among every id and among the conversation's draft vocabulary (its size too); and
    at the chat's default sampling settings (SamplingParams()), the mean chance that such a first
    draft is kept: sum(min(p, q)) when it is drawn from the MTP layer's distribution q, p(argmax q)
    when it is q's argmax (p: the trunk's distribution at that position)."""
    seq = list(prompt) + list(reply)
    model.reset()
    model.advance(seq)
    p = len(prompt)
    logits = model.mtp_prefill(model.hiddens[:-1], seq[1:], 0)[p - 1:-1]
    want = np.asarray(seq[p + 1:])
    vocab = DraftVocab(model.cfg.real_vocab_size, seq).size
    chat = SamplingParams()
    sampled, greedy = [], []
    for hidden, mtp_row in zip(model.hiddens[p:-1], logits):
        target = filtered_probs(model.logits(hidden), chat)
        row = mtp_row.copy()
        if vocab:
            row[vocab:] = -np.inf
        draft = filtered_probs(row, chat)
        sampled.append(np.minimum(target, draft).sum())
        greedy.append(target[int(np.argmax(row))])
    return {"pct": float(100 * np.mean(np.argmax(logits, axis=-1) == want)), "draft_vocab": vocab,
            "pct_draft_vocab": float(100 * np.mean(np.argmax(logits[:, :vocab or None], axis=-1) == want)),
            "chat_sampling_kept_pct": {"sampled_drafts": float(100 * np.mean(sampled)),
                                       "greedy_drafts": float(100 * np.mean(greedy))}}


def compare_replies(model: ReferenceModel, prompts: dict[str, list[int]], plain: dict[str, list[int]],
                    engine_json: Path) -> list[dict]:
    """The engine's plain replies (spec_acceptance.py --engine's JSON) against the reference's
    (`plain`): where they first differ, and the teacher-forced MTP agreement along each."""
    engine = {r["prompt"]: r["reply"] for r in json.loads(engine_json.read_text())["engine_rows"] if "reply" in r}
    rows = []
    for kind, ids in prompts.items():
        want, got = plain[kind], engine[kind]
        rows.append({"prompt": kind, "engine_differs_at": first_difference(got, want),
                     "mtp_agreement_reference_reply": mtp_agreement(model, ids, want),
                     "mtp_agreement_engine_reply": mtp_agreement(model, ids, got)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


_worker_model: ReferenceModel | None = None  # a reference_rows worker's own copy of the model


def _load_worker_model(model_dir: Path) -> None:
    global _worker_model
    _worker_model = ReferenceModel.from_checkpoint(Checkpoint.open(model_dir, include_mtp=True))


def _speculative_row(job: tuple[str, list[int], str, int, int]) -> tuple[dict, list[int]]:
    kind, ids, drafter, k, tokens = job
    spec = SpeculativeReference(_worker_model, GREEDY, k, drafter)
    t0 = time.monotonic()
    got = spec.generate(ids, tokens)
    s = spec.stats
    return {"prompt": kind, "prompt_tokens": len(ids), "drafter": drafter, "k": k,
            "steps": s.steps, "drafted": s.drafted, "accepted": s.accepted,
            "acceptance_pct": 100 * s.accepted / max(s.drafted, 1),
            "accepted_at_pct": [100 * a / s.steps for a in s.accepted_at],
            "tokens_per_forward": tokens / s.steps, "seconds": time.monotonic() - t0}, got


def reference_rows(model_dir: Path, prompts: dict[str, list[int]], plain: dict[str, list[int]], tokens: int,
                   workers: int) -> list[dict]:
    """The numpy reference's speculative rounds (MTP and n-gram drafts, k = 1..4, each prompt),
    each asserted to reproduce its plain greedy reply `plain`; the runs spread over `workers`
    processes, each with its own copy of the model and two BLAS threads."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(kind, ids, drafter, k, tokens) for kind, ids in prompts.items() for drafter in ("mtp", "ngram")
            for k in (1, 2, 3, 4)]
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "2"  # read by numpy in each spawned worker
    rows = []
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_load_worker_model, initargs=(model_dir,)) as pool:
        for row, got in pool.map(_speculative_row, jobs):
            if got != plain[row["prompt"]]:
                raise AssertionError(f"{row['prompt']} {row['drafter']} k={row['k']}: speculative output "
                                     "differs from plain greedy")
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--engine", action="store_true",
                   help="measure the CUDA engine's rounds (not the numpy reference's)")
    p.add_argument("--engine-json", type=Path, help="an --engine run's JSON: first compare its plain replies "
                   "with the reference's (where they part, teacher-forced MTP agreement along each)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="processes for the reference's runs (default: half the CPUs)")
    args = p.parse_args(argv)
    tok = Tokenizer.from_checkpoint(args.model)
    prompts = held_out_prompts()
    encoded = {kind: tok.encode(prompts[kind]) for kind in ("chat", "document")}
    doc = {"model": args.model.name, "tokens": args.tokens, "source_file": prompts["source"]}
    if args.engine:
        doc["engine_rows"] = engine_rows(args.model, encoded, args.tokens, tok)
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return 0
    model = ReferenceModel.from_checkpoint(Checkpoint.open(args.model, include_mtp=True))
    t0 = time.monotonic()
    plain = {kind: plain_greedy(model, ids, args.tokens) for kind, ids in encoded.items()}
    doc["plain_seconds"] = time.monotonic() - t0
    if args.engine_json:
        doc["replies"] = compare_replies(model, encoded, plain, args.engine_json)
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    rows = reference_rows(args.model, encoded, plain, args.tokens, args.workers)
    doc.update(equal_to_plain_greedy=True, rows=rows)
    args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
