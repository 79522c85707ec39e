"""tests/gpu/spec_acceptance.py: the engine measurement (`engine_rows`) on the fake native module of
test_engine_cuda_cpu.py with the Markov model of test_engine_cuda_speculative.py (one row per
setting and prompt, each reply compared with the plain one, the draft counts taken from the
reply's last Stats), and the teacher-forced MTP agreement on the numpy reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import test_engine_cuda_cpu as fake
import test_engine_cuda_speculative as markov_model
from helpers import TagTokenizer

from lampo.engine import cuda
from lampo.models.checkpoint import Checkpoint
from lampo.models.draft_vocab import PREFIXES
from lampo.models.presets import get_preset
from lampo.models.reference.model import ReferenceModel
from lampo.models.sampling import filtered_probs
from lampo.models.sampling_params import SamplingParams
from lampo.models.synthetic import write_checkpoint


def test_engine_rows_measure_every_setting_against_the_plain_reply(gpu_script, tiny_dense_dir, monkeypatch):
    spec_acceptance = gpu_script("spec_acceptance")
    native = fake.FakeNative(get_preset("tiny-dense"))
    monkeypatch.setattr(cuda, "load_native", lambda: native)
    monkeypatch.setattr(fake, "next_token", markov_model.markov)
    prompts = {"chat": list(markov_model.PROMPT), "document": list(markov_model.PROMPT[3:])}
    rows = spec_acceptance.engine_rows(tiny_dense_dir, prompts, 24, TagTokenizer())
    settings = ["off"] + [f"{d}:{k}" for d in ("mtp", "ngram") for k in (1, 2, 3, 4)] + ["auto"]
    sampled = ["off"] + [f"mtp:{k}" for k in (1, 2, 3, 4)]
    assert [(r["setting"], r["prompt"], r["sampling"]) for r in rows] == (
        [(s, p, "greedy") for s in settings for p in prompts]
        + [("mtp:1", "document", "greedy"), ("mtp:1", "chat", "greedy")]
        + [(s, p, "chat") for s in sampled for p in prompts])
    greedy, chat = rows[:-len(sampled) * 2], rows[-len(sampled) * 2:]
    assert [r["reply"] for r in greedy[:2]] == [list(markov_model.chain(markov_model.markov(p), 24))
                                                for p in prompts.values()]
    assert all("reply" not in r for r in greedy[2:] + chat)
    assert all(r["differs_at"] is None for r in greedy) and all(r["tokens"] == 24 for r in rows)
    assert all(r["drafted"] == 0 for r in greedy[:2] + chat[:2]) and all(r["drafted"] > 0 for r in greedy[2:] + chat[2:])
    assert all(0 < r["acceptance_pct"] <= 100 and r["decode_tok_s"] > 0 for r in greedy[2:] + chat[2:])
    assert all(0 < r["kept_at_pct_of_rounds"][0] <= 100 for r in greedy[2:] + chat[2:])


def test_mtp_agreement_counts_the_drafts_of_each_reply_position(gpu_script, tmp_path):
    spec_acceptance = gpu_script("spec_acceptance")
    d = write_checkpoint(tmp_path, get_preset("tiny-dense"), seed=3, with_mtp=True)
    model = ReferenceModel.from_checkpoint(Checkpoint.open(d, include_mtp=True))
    rng = np.random.default_rng(0)
    prompt, reply = [int(t) for t in rng.integers(0, 1000, 12)], [int(t) for t in rng.integers(0, 1000, 6)]
    seq = prompt + reply
    rows = []
    for t in range(len(prompt) + 1, len(seq)):  # the draft of seq[t] from (h_{t-2}, seq[t-1]), one row at a time
        model.reset()
        model.prefill(seq[:t - 1])
        model.mtp_advance(model.hiddens[:-1], seq[1:t - 1], 0)
        rows.append(model.mtp_step(model.hiddens[-1], seq[t - 1], t - 2))
    reply[-1] = int(np.argmax(rows[-1][:PREFIXES[0]]))  # surely drafted among the conversation's ids
    seq = prompt + reply
    want = seq[len(prompt) + 1:]
    every = [int(np.argmax(r)) == w for r, w in zip(rows, want)]
    prefix = [int(np.argmax(r[:PREFIXES[0]])) == w for r, w in zip(rows, want)]
    got = spec_acceptance.mtp_agreement(model, prompt, reply)
    kept = got.pop("chat_sampling_kept_pct")
    assert got == {"pct": 100 * np.mean(every), "draft_vocab": PREFIXES[0], "pct_draft_vocab": 100 * np.mean(prefix)}
    model.reset()
    model.prefill(seq)
    chat, n = SamplingParams(), PREFIXES[0]
    ps = [filtered_probs(model.logits(model.hiddens[t - 1]), chat) for t in range(len(prompt) + 1, len(seq))]
    qs = [filtered_probs(np.where(np.arange(len(r)) < n, r, -np.inf), chat) for r in rows]
    assert kept["sampled_drafts"] == pytest.approx(100 * np.mean([np.minimum(p, q).sum() for p, q in zip(ps, qs)]))
    assert kept["greedy_drafts"] == pytest.approx(100 * np.mean([p[int(np.argmax(r[:n]))] for p, r in zip(ps, rows)]))


def test_reference_rows_reproduce_plain_greedy_in_worker_processes(tiny_dense_dir, monkeypatch):
    """The reference's rounds run in spawned workers (the script imported by its own name, as the
    workers import it); each row must reproduce the plain reply, and a wrong plain reply is caught."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "gpu"))
    sys.modules.pop("spec_acceptance", None)
    import spec_acceptance

    model = ReferenceModel.from_checkpoint(Checkpoint.open(tiny_dense_dir, include_mtp=True))
    prompts = {"chat": [5, 9, 5, 9, 5, 9, 5], "document": [17, 3, 17, 3, 17]}
    plain = {kind: spec_acceptance.plain_greedy(model, ids, 6) for kind, ids in prompts.items()}
    rows = spec_acceptance.reference_rows(tiny_dense_dir, prompts, plain, 6, workers=2)
    assert [(r["prompt"], r["drafter"], r["k"]) for r in rows] == [
        (kind, d, k) for kind in prompts for d in ("mtp", "ngram") for k in (1, 2, 3, 4)]
    assert all(r["steps"] <= 6 and len(r["accepted_at_pct"]) <= r["k"] for r in rows)
    plain["chat"] = [t + 1 for t in plain["chat"]]
    with pytest.raises(AssertionError, match="chat mtp k=1: speculative output differs"):
        spec_acceptance.reference_rows(tiny_dense_dir, prompts, plain, 6, workers=1)
