"""CudaBackend's verify rounds of MTP and n-gram drafts (engine/native_rounds.py) on the fake
native module of test_engine_cuda_cpu.py, whose model here is a Markov chain (the next token
depends on the last one only), so the conversation repeats itself and n-gram drafts are kept; its
MTP layer drafts the model's own tokens with one off at every fifth position. The reply must be
the plain greedy reply token for token, a stop inside a round must leave exactly the streamed
tokens in the engine, sampled replies must keep the plain distribution, and auto must use either
drafter and leave out an MTP module that is broken or does not fit."""

from __future__ import annotations

import threading

import pytest
import test_engine_cuda_cpu as fake
from helpers import TagTokenizer
from lampo.engine import cuda
from lampo.engine.cuda import CudaBackend, NativeSteps
from lampo.engine.native_rounds import NativeSpeculativeSteps, round_policy
from lampo.engine.protocol import Done, GenerationRequest, Stats, TokenEvent
from lampo.engine.speculation import Speculation, parse_speculation
from lampo.models.draft_vocab import PREFIXES
from lampo.models.presets import get_preset
from lampo.models.prompt_lookup import PromptLookup
from lampo.models.sampling_params import GREEDY, SamplingParams


def markov(history: list[int]) -> int:
    return 1000 + (history[-1] * 7 + 3) % 11  # a cycle of a few tokens: the reply repeats


def chain(first: int, n: int) -> tuple[int, ...]:
    out = [first]
    while len(out) < n:
        out.append(markov(out))
    return tuple(out)


PROMPT = chain(1001, 14)  # the cycle is in the prompt already: drafts from the first step


@pytest.fixture(autouse=True)
def markov_model(monkeypatch):
    monkeypatch.setattr(fake, "next_token", markov)


def make(tiny_dense_dir, speculation: Speculation, say=None):
    native = fake.FakeNative(get_preset("tiny-dense"))
    b = CudaBackend(tiny_dense_dir, context_max=128, prefill_chunk=4, snapshot_slots=2, native=native,
                    tokenizer=TagTokenizer(), speculation=speculation, say=say)
    return b, native.engines[-1]


def generate(b, max_tokens=30, sampling: SamplingParams = GREEDY):
    req = GenerationRequest(PROMPT, SamplingParams(**{**sampling.to_dict(), "max_tokens": max_tokens}))
    events = list(b.generate(req, threading.Event()))
    assert isinstance(events[-1], Done)
    ids = [i for e in events if isinstance(e, TokenEvent) for i in e.ids]
    return ids, [e for e in events if isinstance(e, Stats)][-1], events[-1]


def plain_reply(n):
    history, out = list(PROMPT), []
    for _ in range(n):
        out.append(markov(history))
        history.append(out[-1])
    return out


@pytest.mark.parametrize("setting", ["ngram", "ngram:1", "ngram:3", "mtp", "mtp:1", "mtp:2", "mtp:4"])
def test_greedy_rounds_reproduce_the_plain_reply_and_count_their_drafts(tiny_dense_dir, setting):
    speculation = parse_speculation(setting)
    b, engine = make(tiny_dense_dir, speculation)
    assert b.info.speculative and engine.verify_rows == 1 + (speculation.drafts or 4)
    assert engine.has_mtp == (speculation.mode == "mtp")  # the MTP module is loaded only to draft with it
    assert any(n.startswith("mtp.") for n in engine.loaded) == engine.has_mtp
    ids, stats, _done = generate(b)
    assert ids == plain_reply(30)
    calls = {c[0] for c in engine.calls}
    assert "verify" in calls and ("mtp_draft" in calls) == engine.has_mtp and stats.draft_n_accepted > 0
    assert 0 < stats.draft_rounds and stats.draft_n_accepted <= stats.draft_n
    kept_at = stats.draft_kept_at  # per draft position: rounds that kept it (and the ones before it)
    assert sum(kept_at) == stats.draft_n_accepted and stats.draft_rounds >= kept_at[0]
    # the conversation's ids are all low: MTP drafts among the shortest prefix (models/draft_vocab.py)
    assert engine.draft_vocab == (PREFIXES[0] if engine.has_mtp else 0)
    assert list(kept_at) == sorted(kept_at, reverse=True) and len(kept_at) <= (speculation.drafts or 4)
    if speculation.mode == "mtp" and speculation.drafts != 1:
        assert stats.draft_n_accepted < stats.draft_n  # the misses were rejected, and the reply is right
    assert engine.history == list(PROMPT) + ids[:-1]  # the last sample is not fed


@pytest.mark.parametrize("drafter", ["ngram", "mtp"])
def test_a_stop_inside_a_round_leaves_exactly_the_streamed_tokens(tiny_dense_dir, drafter):
    b, engine = make(tiny_dense_dir, Speculation(drafter, 4))
    for n in (9, 13, 17):  # stop ids at several points, most of them inside rounds
        engine.native.stop_at = len(PROMPT) + n
        ids, _stats, done = generate(b, max_tokens=40)
        assert done.reason == "stop"
        assert ids == plain_reply(n)
        assert engine.history == list(PROMPT) + ids  # drafts past the stop were taken back
    engine.native.stop_at = None
    ids, _stats, _done = generate(b, max_tokens=7)  # the length limit bounds the drafts too
    assert ids == plain_reply(7)


@pytest.mark.parametrize("n, drafter", [(10, "ngram"), (11, "ngram"), (13, "ngram"), (11, "mtp"), (13, "mtp")])
def test_a_cancel_inside_a_round_takes_the_unstreamed_drafts_back(tiny_dense_dir, n, drafter):
    b, engine = make(tiny_dense_dir, Speculation(drafter, 4))
    cancel, ids = threading.Event(), []
    req = GenerationRequest(PROMPT, SamplingParams(**{**GREEDY.to_dict(), "max_tokens": 40}))
    for e in b.generate(req, cancel):
        if isinstance(e, TokenEvent):
            ids += e.ids
            if len(ids) >= n:
                cancel.set()  # checked before the next token, also one a round already kept
    assert ids == plain_reply(len(ids)) and len(ids) == n
    assert any(c[0] == "accept" for c in engine.calls)
    assert engine.history == list(PROMPT) + ids[:-1] or engine.history == list(PROMPT) + ids


def test_sampled_requests_draft_too(tiny_dense_dir):
    b, engine = make(tiny_dense_dir, Speculation("mtp"))
    _ids, stats, _done = generate(b, sampling=SamplingParams(temperature=0.6, seed=1))
    assert "verify" in {c[0] for c in engine.calls} and stats.draft_n_accepted > 0


@pytest.mark.parametrize("setting", ["auto", "auto:2"])
def test_auto_drafts_with_the_mtp_module_and_the_conversation(tiny_dense_dir, monkeypatch, setting):
    """auto loads the MTP module and lets each round take either drafter: n-gram drafts where the
    context repeats (free to make, and right on this model), MTP drafts where it offers none."""
    speculation = parse_speculation(setting)
    b, engine = make(tiny_dense_dir, speculation)
    assert b.info.speculative and engine.has_mtp and engine.verify_rows == 1 + (speculation.drafts or 4)
    ids, stats, _done = generate(b)
    assert ids == plain_reply(30) and stats.draft_n_accepted > 0
    assert "verify" in {c[0] for c in engine.calls} and "mtp_draft" not in {c[0] for c in engine.calls}
    monkeypatch.setattr(PromptLookup, "drafts", lambda lookup, k: [])
    engine.calls.clear()
    ids, stats, _done = generate(b)
    assert ids == plain_reply(30) and stats.draft_n_accepted > 0
    assert {"mtp_draft", "verify"} <= {c[0] for c in engine.calls}
    assert engine.history == list(PROMPT) + ids[:-1]


def test_auto_leaves_out_an_mtp_module_that_does_not_fit_saying_what_it_lacks(tiny_dense_dir):
    cfg = get_preset("tiny-dense")
    sizes = dict(context_max=128, prefill_chunk=4, snapshot_slots=2, verify_rows=5)
    plain, with_mtp = (cuda._plan(cfg, "q5", mtp=m, **sizes).total_bytes for m in (False, True))
    said = []
    native = fake.FakeNative(cfg, free=(plain + with_mtp) // 2)
    b = CudaBackend(tiny_dense_dir, context_max=128, prefill_chunk=4, snapshot_slots=2, native=native,
                    tokenizer=TagTokenizer(), speculation=Speculation(), say=said.append, weights="q5")
    engine = native.engines[-1]
    assert not engine.has_mtp and not any(n.startswith("mtp.") for n in engine.loaded)
    assert len(said) == 1 and "the MTP module needs" in said[0] and "n-gram" in said[0]
    ids, stats, _done = generate(b)
    assert ids == plain_reply(30) and stats.draft_n_accepted > 0
    said.clear()
    make(tiny_dense_dir, Speculation(), say=said.append)  # room enough: nothing to say
    assert said == []


def test_the_backend_says_what_it_runs_of_the_setting(tiny_dense_dir):
    said = []
    for setting in (Speculation(), Speculation("auto", 2), Speculation("mtp", 3), Speculation("ngram")):
        make(tiny_dense_dir, setting, say=said.append)
    assert said == []  # each runs as asked


@pytest.mark.parametrize("verify_s_per_row, drafts_pay", [(0.25, True), (1.0, False)])
def test_rounds_turn_themselves_off_where_they_measure_slower(tiny_dense_dir, verify_s_per_row, drafts_pay):
    """A fake clock advanced by the engine's calls: a plain step takes 1 s, an MTP draft 0.05 s,
    a verify window `verify_s_per_row` per row. Cheap rows: rounds of drafts win and stay; rows as
    dear as plain steps (an MoE at long context): after measuring, almost every step is plain."""
    b, engine = make(tiny_dense_dir, Speculation("mtp"))
    now = [0.0]

    def costing(call, seconds):
        def timed(*args):
            now[0] += seconds(*args)
            return call(*args)
        return timed

    engine.decode_collect = costing(engine.decode_collect, lambda: 1.0)
    engine.mtp_draft = costing(engine.mtp_draft, lambda token, k: 0.05 * k)
    engine.verify = costing(engine.verify, lambda ids, mtp_drafts=False: verify_s_per_row * len(ids))
    steps = NativeSpeculativeSteps(NativeSteps(engine, engine.native, GREEDY), engine, PROMPT,
                                   round_policy("mtp", 4, None), clock=lambda: now[0])
    steps.begin()
    for start in range(0, len(PROMPT), steps.chunk):
        token = steps.prefill(PROMPT[start:start + steps.chunk], start + steps.chunk >= len(PROMPT))
    reply, drafted = [token], []
    while len(reply) < 400:
        steps.decode_submit(token, 4)
        step = steps.decode_collect()
        reply += step.tokens
        drafted.append(step.drafted)
        token = step.tokens[-1]
    assert reply[:300] == plain_reply(300)
    late = drafted[len(drafted) // 2:]  # once the times are measured
    share = sum(d > 0 for d in late) / len(late)
    assert share > 0.9 if drafts_pay else share < 0.1, f"{share:.0%} of the late steps drafted"


def test_sampled_rounds_draw_the_reply_from_the_plain_distribution(tiny_dense_dir):
    """The fake samples the model's token or one of the two after it (0.6 / 0.3 / 0.1) and drafts
    the model's token: the first three tokens of 1,500 seeded replies, plain and with three MTP
    drafts a round, must come from one distribution (total variation distance: 0.03 measured;
    keeping every draft instead gives 0.7)."""
    from collections import Counter

    def first_tokens(speculation):
        b, engine = make(tiny_dense_dir, speculation)
        replies = Counter(tuple(generate(b, max_tokens=3, sampling=SamplingParams(temperature=1.0, seed=seed))[0])
                          for seed in range(1500))
        return replies, engine

    plain, _ = first_tokens(Speculation("off"))
    spec, engine = first_tokens(Speculation("mtp", 3))
    assert any(c[0] == "verify" for c in engine.calls)
    tv = 0.5 * sum(abs(plain[k] - spec[k]) for k in set(plain) | set(spec)) / 1500
    assert tv < 0.08, f"total variation {tv:.3f} between plain and speculative replies"


def test_a_broken_mtp_module_stops_only_mtp_drafting(tmp_path):
    """The MTP tensors are checked and loaded only where the setting may draft with them: a
    checkpoint whose MTP module is incomplete still chats with n-gram drafts (auto says why), and
    `mtp` is refused naming the tensor."""
    from test_checkpoint import _rewrite

    from lampo.models.checkpoint import SINGLE_NAME, CheckpointError
    from lampo.models.synthetic import write_checkpoint

    d = write_checkpoint(tmp_path / "partial", get_preset("tiny-dense"), seed=0)
    _rewrite(d / SINGLE_NAME, lambda t: t.pop("mtp.fc.weight"))
    b, engine = make(d, Speculation("ngram"))
    assert not engine.has_mtp and generate(b)[0] == plain_reply(30)
    said = []
    b, engine = make(d, Speculation(), say=said.append)  # auto: n-gram drafts only, saying why
    assert not engine.has_mtp and generate(b)[0] == plain_reply(30)
    assert len(said) == 1 and "'mtp.fc.weight'" in said[0] and "n-gram" in said[0]
    with pytest.raises(CheckpointError, match="MTP module is incomplete.*'mtp.fc.weight'"):
        make(d, Speculation("mtp"))
