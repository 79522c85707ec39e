"""Speculative decoding on the numpy reference (models/speculative.py): greedy output equals plain
greedy decoding whatever the drafts, the sampling rule keeps the target distribution, and the
drafters propose what they should."""

from __future__ import annotations

import numpy as np
import pytest

from lampo.models.checkpoint import Checkpoint
from lampo.models.draft_vocab import PREFIXES, DraftVocab
from lampo.models.reference.model import ReferenceModel
from lampo.models.sampling_params import SamplingParams
from lampo.models.speculative import (
    SpeculativeDecoder,
    SpeculativeReference,
    accept_greedy,
    accept_sampled,
)

GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0)
Z_ONE_IN_A_THOUSAND = 3.09  # one-sided normal quantile: the tests below fail by chance 1 time in 1,000
PROMPT = [5, 17, 99, 1024, 5, 17, 99, 3000, 42]
TOKENS = 40


@pytest.fixture(scope="module")
def models(tiny_dense_dir, tiny_moe_dir):
    return {name: ReferenceModel.from_checkpoint(Checkpoint.open(d))
            for name, d in (("dense", tiny_dense_dir), ("moe", tiny_moe_dir))}


def matches_distribution(counts: np.ndarray, probs: np.ndarray) -> bool:
    """Pearson's chi-square test of `counts` against `probs`, at the 1/1000 level (the critical
    value by the Wilson-Hilferty approximation of the chi-square distribution)."""
    expected = probs * counts.sum()
    statistic = float(((counts - expected) ** 2 / expected).sum())
    df = len(counts) - 1
    critical = df * (1 - 2 / (9 * df) + Z_ONE_IN_A_THOUSAND * np.sqrt(2 / (9 * df))) ** 3
    return statistic < critical


def plain_greedy(model, prompt, n) -> list[int]:
    model.reset()
    logits, out = model.prefill(prompt, last_only=True), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = model.decode(out[-1])
    return out


@pytest.mark.parametrize("name", ["dense", "moe"])
@pytest.mark.parametrize("drafter", ["mtp", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_speculation_equals_plain_greedy(models, name, drafter, k):
    model = models[name]
    want = plain_greedy(model, PROMPT, TOKENS)
    spec = SpeculativeReference(model, GREEDY, k, drafter)
    assert spec.generate(PROMPT, TOKENS) == want
    assert spec.stats.steps >= 1 and spec.stats.accepted <= spec.stats.drafted


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dense", "moe"])
@pytest.mark.parametrize("drafter", ["mtp", "ngram"])
def test_greedy_speculation_equals_plain_greedy_for_256_tokens(models, name, drafter):
    model = models[name]
    spec = SpeculativeReference(model, GREEDY, 4, drafter)
    assert spec.generate(PROMPT, 256) == plain_greedy(model, PROMPT, 256)


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("corrupt", [0.0, 0.3, 1.0])
def test_partly_right_drafts_are_kept_up_to_the_first_wrong_one(models, monkeypatch, k, corrupt):
    """Drafts made of the target's own greedy tokens, each replaced by a wrong one with probability
    `corrupt`: the output is still plain greedy's, and exactly the right prefix of each step's
    drafts is kept (so the rollback and re-run after a partial acceptance are exercised)."""
    model = models["moe"]
    want = plain_greedy(model, PROMPT, TOKENS + k + 1)
    rng = np.random.default_rng(int(corrupt * 10) + k)
    spec = SpeculativeReference(model, GREEDY, k, "ngram")
    expected_kept = []

    def drafts(drafter, n, ngram, reply, context):
        truth = want[len(reply):len(reply) + n]
        d = [t if rng.random() >= corrupt else (t + 1) % 1000 for t in truth]
        expected_kept.append(next((i for i, (a, b) in enumerate(zip(d, truth)) if a != b), len(d)))
        return d, None

    monkeypatch.setattr(spec.decoder, "_drafts", drafts)
    assert spec.generate(PROMPT, TOKENS) == want[:TOKENS]
    assert spec.stats.accepted == sum(expected_kept)
    if corrupt == 0.0:
        assert spec.stats.accepted == spec.stats.drafted and spec.stats.steps <= -(-TOKENS // (k + 1))


def test_accept_greedy():
    asked = []

    def target(i):  # the target's greedy picks: 3, 1, 4, then 0
        asked.append(i)
        return [3, 1, 4, 0][i]

    assert accept_greedy([3, 1, 4], target) == (3, 0) and asked == [0, 1, 2, 3]
    asked.clear()
    assert accept_greedy([3, 2, 4], target) == (1, 1) and asked == [0, 1]  # nothing after the first miss
    assert accept_greedy([], target) == (0, 3)


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_sampling_keeps_the_target_distribution(k):
    """The emitted token after a step's kept drafts, and the first emitted token, are distributed as
    the target says, for a drafter far from the target (chi-square, 40,000 trials)."""
    rng = np.random.default_rng(k)
    V, trials = 12, 40_000
    p = rng.dirichlet(np.ones(V), size=k + 1)
    q = rng.dirichlet(np.ones(V) * 0.3, size=k)
    first = np.zeros(V)
    for _ in range(trials):
        drafts = [int(rng.choice(V, p=q[i])) for i in range(k)]
        kept, nxt = accept_sampled(drafts, q, p, rng)
        first[drafts[0] if kept > 0 else nxt] += 1
    assert matches_distribution(first, p[0])
    # and a drafter that is the target itself keeps every draft
    assert all(accept_sampled([d], p[:1], p, rng)[0] == 1 for d in range(V) if p[0, d] > 0)


def test_speculative_sampling_with_a_deterministic_drafter():
    """A one-hot q (n-gram drafts): a draft is kept with probability p(draft), else the token is
    drawn from p with the draft removed: together exactly p."""
    rng = np.random.default_rng(7)
    V, trials = 8, 40_000
    p = rng.dirichlet(np.ones(V), size=2)
    q = np.zeros((1, V))
    q[0, 5] = 1.0
    first = np.zeros(V)
    for _ in range(trials):
        kept, nxt = accept_sampled([5], q, p, rng)
        first[5 if kept else nxt] += 1
    assert matches_distribution(first, p[0])


def test_sampled_speculation_runs_and_counts(models):
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=3)
    spec = SpeculativeReference(models["moe"], params, 3, "mtp", seed=3)
    out = spec.generate(PROMPT, 12)
    assert len(out) == 12 and spec.stats.drafted == 3 * spec.stats.steps
    assert len(spec.stats.accepted_at) == 3


def test_bad_arguments(models):
    with pytest.raises(ValueError, match="k >= 1"):
        SpeculativeReference(models["dense"], GREEDY, 0, "ngram")


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_auto_drafts_keep_the_greedy_output_and_choose_per_step(models, name):
    model = models[name]
    prompt = PROMPT * 3  # repeats: the n-gram drafter has something to propose
    want = plain_greedy(model, prompt, TOKENS)
    spec = SpeculativeReference(model, GREEDY, 4, "auto")
    assert spec.generate(prompt, TOKENS) == want
    assert spec.stats.steps >= 1 and spec.stats.accepted <= spec.stats.drafted
    assert spec.policy.accept["mtp"] != spec.policy.accept["ngram"]  # both measured on their own rounds


def test_auto_drafts_with_sampling(models):
    spec = SpeculativeReference(models["moe"], SamplingParams(temperature=0.8, top_p=0.95, seed=3), 3, "auto")
    out = spec.generate(PROMPT * 2, 24)
    assert len(out) == 24 and spec.stats.accepted <= spec.stats.drafted


def test_the_mtp_rows_follow_the_trunk_through_chunks_rounds_and_rewinds(models, monkeypatch):
    """After prefill chunks, rounds that keep all, some or none of their drafts, and a rewind, the
    MTP layer's next first draft is the one a fresh MTP pass over the whole context gives."""
    model = models["moe"]
    want = plain_greedy(model, PROMPT, 12)
    decoder = SpeculativeDecoder(model, GREEDY, 3, "mtp", np.random.default_rng(0))
    right = iter([3, 1, 0, 3])  # how many of each round's drafts are the target's own tokens
    chain = decoder._drafts  # the MTP's own drafts, so that the chain writes its rows too

    def drafts(drafter, k, ngram, reply, context):
        n = next(right)
        chain(drafter, k, ngram, reply, context)
        truth = want[len(reply):len(reply) + k]
        return truth[:n] + [(t + 1) % 1000 for t in truth[n:]], None

    monkeypatch.setattr(decoder, "_drafts", drafts)
    model.reset()
    decoder.advance(PROMPT[:4])
    decoder.advance(PROMPT[4:])
    first = int(np.argmax(model.logits(model.hidden_last)))
    reply = [first]
    for kept in (3, 1, 0, 3):
        step = decoder.round(PROMPT + reply, reply)
        assert step.tokens == want[len(reply):len(reply) + kept + 1] and step.drafted == 3
        assert model.state.kv[-1].length == model.position - 1  # no row of the draft chain is left
        reply += step.tokens
    decoder.rewind(2)
    assert model.state.kv[-1].length == model.position - 1
    fed = PROMPT + reply[:-3]  # the last round's first draft is still in; its next token is `token`
    token = reply[-3]
    decoder._mtp_row(token)
    got = model.logits(model.mtp_hidden_last)
    model.reset()
    model.prefill(fed)
    fresh = model.mtp_prefill(model.hiddens, fed[1:] + [token], 0, last_only=True)
    np.testing.assert_allclose(got, fresh, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("low, vocab", [(5, PREFIXES[0]), (150_000, PREFIXES[1])])
def test_mtp_drafts_come_from_the_conversations_draft_vocabulary(models, monkeypatch, low, vocab):
    """The tiny model's MTP layer, with random weights, would draft ids from the whole vocabulary;
    each round drafts among its conversation's draft vocabulary (here, a long prompt of ids below
    `vocab` makes it that prefix), and the reply is still the plain one."""
    model = models["dense"]
    prompt = [low + i % 97 for i in range(1500)]
    decoder = SpeculativeDecoder(model, GREEDY, 4, "mtp", np.random.default_rng(0))
    rounds, chain = [], decoder._drafts

    def drafts(drafter, k, ngram, reply, context):
        out = chain(drafter, k, ngram, reply, context)
        rounds.append((DraftVocab(model.cfg.real_vocab_size, context).size, out[0]))
        return out

    monkeypatch.setattr(decoder, "_drafts", drafts)
    model.reset()
    decoder.advance(prompt)
    reply = [int(np.argmax(model.logits(model.hidden_last)))]
    while len(reply) < 12:
        reply += decoder.round(prompt + reply, reply).tokens
    assert reply[:12] == plain_greedy(model, prompt, 12)
    assert rounds and all(size == vocab for size, _ in rounds)
    assert max(max(d) for _, d in rounds) < vocab


def test_the_draft_vocabulary_is_counted_as_the_context_grows(models):
    """Each round counts only the ids its context added since the last one, and gets the size a
    count of the whole context gives: through growth into the second prefix, a rewound (shorter)
    context, and a new conversation after `forget_context`."""
    model = models["dense"]
    decoder = SpeculativeDecoder(model, GREEDY, 4, "mtp", np.random.default_rng(0))
    rng = np.random.default_rng(5)
    context = [int(i) for i in rng.integers(0, 1000, 400)]
    for grow in ([200_000] * 3, list(range(100_000, 100_060)), [7] * 50):
        for i in range(0, len(grow), 7):  # a round's kept drafts and next token at a time
            context += grow[i:i + 7]
            assert decoder._draft_vocab(context) == DraftVocab(model.cfg.real_vocab_size, context).size
    shorter = context[:-30]
    assert decoder._draft_vocab(shorter) == DraftVocab(model.cfg.real_vocab_size, shorter).size
    decoder.forget_context()
    other = [150_000 + i for i in range(600)]
    assert decoder._draft_vocab(other) == DraftVocab(model.cfg.real_vocab_size, other).size == PREFIXES[1]


def test_a_second_generation_forgets_the_first_conversation(models, monkeypatch):
    """SpeculativeReference.generate starts each call on a reset model and a fresh count: a first
    conversation of ids above the second prefix (drafts over every id), then a longer one below
    the first prefix: every round of it counts its own conversation only."""
    model = models["dense"]
    ref = SpeculativeReference(model, GREEDY, 3, "mtp")
    sizes, count = [], ref.decoder._draft_vocab

    def recorded(context):
        sizes.append((count(context), DraftVocab(model.cfg.real_vocab_size, context).size))
        return sizes[-1][0]

    monkeypatch.setattr(ref.decoder, "_draft_vocab", recorded)
    ref.generate([200_000 + i % 97 for i in range(300)], 8)
    assert sizes and all(got == 0 for got, _ in sizes)
    sizes.clear()
    second = [5 + i % 89 for i in range(400)]
    assert ref.generate(second, 8) == plain_greedy(model, second, 8)
    assert sizes[0][1] == PREFIXES[0] and all(got == want for got, want in sizes)
