"""The reference backend with speculative decoding (engine/reference.py's SpeculativeSteps) on the
tiny synthetic MoE checkpoint: greedy replies equal plain decoding's event for event whatever the
drafter and draft count; a stop id, the length limit, the context end or a cancel inside a round
emit exactly what plain decoding does and leave the state the next turn resumes from; Stats count
the rounds as they go; a seeded sampled reply repeats; mode mtp without MTP weights falls back.

The tiny checkpoints' random MTP layer drafts tokens the target rejects, and their random replies
never repeat, so the tests of kept drafts replace the n-gram lookup with an oracle: the plain
greedy reply itself, wrong at every fifth position of the reply."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from helpers import real_tokenizer

from lampo.engine.protocol import Done, GenerationRequest, Stats, TokenEvent
from lampo.engine.reference import ReferenceBackend
from lampo.engine.speculation import Speculation, parse_speculation
from lampo.models import speculative
from lampo.models.presets import get_preset
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.models.synthetic import write_checkpoint

PROMPT = tuple(range(1000, 1024))
NEXT_TURN = (5000, 5001, 5002)
REPLY = 16  # tokens of the oracle's reply
WRONG_EVERY = 5  # the oracle's draft for reply position i is wrong when i % WRONG_EVERY == WRONG_EVERY - 1


@pytest.fixture(scope="module")
def backends(tiny_moe_dir):
    """backends(spelling) -> a ReferenceBackend with that speculation (one per spelling, reset)."""
    made: dict[str, ReferenceBackend] = {}

    def get(spelling: str) -> ReferenceBackend:
        if spelling not in made:
            made[spelling] = ReferenceBackend(tiny_moe_dir, context_max=4096, prefill_chunk=16,
                                              tokenizer=real_tokenizer(), speculation=parse_speculation(spelling))
        made[spelling].reset()
        return made[spelling]

    yield get
    for b in made.values():
        b.close()


def run(backend, prompt, max_tokens=REPLY, stop_ids=(), cancel_after=None, sampling=GREEDY, snapshot_at=()):
    """A generate call's events; `cancel_after`: the cancel flag is set once that many ids streamed."""
    request = GenerationRequest(tuple(prompt), replace(sampling, max_tokens=max_tokens), stop_ids=tuple(stop_ids),
                                snapshot_at=snapshot_at)
    cancel, events = threading.Event(), []
    for event in backend.generate(request, cancel):
        events.append(event)
        if cancel_after is not None and len(ids_of(events)) >= cancel_after:
            cancel.set()
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1
    return events


def ids_of(events):
    return [i for e in events if isinstance(e, TokenEvent) for i in e.ids]


def token_events(events):
    return [e for e in events if isinstance(e, TokenEvent)]


@pytest.fixture(scope="module")
def plain_reply(backends):
    return ids_of(run(backends("off"), PROMPT, max_tokens=REPLY + 8))


def quote(monkeypatch, reply):
    """Make n-gram drafts quote `reply`, a plain reply to PROMPT (wrong every WRONG_EVERY-th
    position), so that the target keeps most of them."""

    def drafts(context, k):
        if tuple(context[:len(PROMPT)]) != PROMPT:
            return []
        at = len(context) - len(PROMPT)
        return [t if (at + i) % WRONG_EVERY != WRONG_EVERY - 1 else (t + 1) % 200_000
                for i, t in enumerate(reply[at:at + k])]

    monkeypatch.setattr(speculative, "ngram_drafts", drafts)


@pytest.fixture
def oracle(monkeypatch, plain_reply):
    quote(monkeypatch, plain_reply)


def assert_same_reply(spec, plain):
    assert token_events(spec) == token_events(plain)  # the same text and ids, event for event
    assert spec[-1].reason == plain[-1].reason
    a, b = spec[-1].stats, plain[-1].stats
    assert (a.prompt_n, a.cached_n, a.predicted_n, a.context_used) == (b.prompt_n, b.cached_n, b.predicted_n,
                                                                       b.context_used)


@pytest.mark.parametrize("spelling", ["auto", "mtp", "ngram", "mtp:1", "mtp:2", "mtp:3", "mtp:4", "auto:3"])
def test_greedy_replies_equal_plain_decoding(backends, spelling):
    spec = run(backends(spelling), PROMPT, max_tokens=10)
    assert_same_reply(spec, run(backends("off"), PROMPT, max_tokens=10))
    s = spec[-1].stats
    assert backends(spelling).info.speculative and not backends("off").info.speculative
    assert s.draft_n_accepted <= s.draft_n and s.draft_rounds <= s.predicted_n
    if spelling.startswith("mtp:"):  # forced: every step drafts k, as far as the reply has room
        k = int(spelling[4:])
        room = [10 - n - 1 for n in range(1, 10)]  # after the n-th token: all but the step's own
        assert s.draft_rounds == sum(r > 0 for r in room) and s.draft_n == sum(min(k, r) for r in room)


@pytest.mark.parametrize("spelling", ["ngram:1", "ngram:2", "ngram:3", "ngram:4", "ngram", "auto"])
def test_kept_drafts_stream_as_plain_decoding_and_stats_count_them(backends, oracle, spelling):
    events = run(backends(spelling), PROMPT)
    assert_same_reply(events, run(backends("off"), PROMPT))
    stats = [e for e in events if isinstance(e, Stats)]
    counts = [(s.draft_n, s.draft_n_accepted, s.draft_rounds) for s in stats]
    assert counts == sorted(counts) and len(set(counts)) > 2  # live: they grow round by round
    final = stats[-1]
    assert 0 < final.draft_n_accepted < final.draft_n  # kept most, not the wrong ones
    assert final.draft_rounds < REPLY - 1  # fewer steps than plain decoding's
    assert final.acceptance == final.draft_n_accepted / final.draft_n


def test_greedy_with_a_presence_penalty_equals_plain_decoding(backends, monkeypatch):
    """Greedy picks count the penalty (-2 makes this reply repeat itself): drafts are judged by it."""
    params = replace(GREEDY, presence_penalty=-2.0)
    plain = run(backends("off"), PROMPT, sampling=params)
    quote(monkeypatch, ids_of(plain))
    for spelling in ("ngram:4", "mtp:3"):
        spec = run(backends(spelling), PROMPT, sampling=params)
        assert_same_reply(spec, plain)
    assert spec[-1].stats.draft_rounds > 0


def two_turns(backend, **first):
    """(first reply's events, the next turn's events): the next turn's prompt continues the first
    reply's streamed tokens, so it resumes from the state the first left."""
    first_events = run(backend, PROMPT, **first)
    second = run(backend, PROMPT + tuple(ids_of(first_events)) + NEXT_TURN, max_tokens=4)
    return first_events, second


@pytest.mark.parametrize("stop_at", [2, 3, 6, 9])  # reply positions inside rounds (kept drafts) and at their end
def test_a_stop_inside_a_round(backends, oracle, plain_reply, stop_at):
    stop = plain_reply[stop_at]
    assert stop not in plain_reply[:stop_at]
    spec = two_turns(backends("ngram:4"), stop_ids=(stop,))
    plain = two_turns(backends("off"), stop_ids=(stop,))
    assert ids_of(spec[0]) == plain_reply[:stop_at] and spec[0][-1].reason == "stop"
    for a, b in zip(spec, plain):
        assert_same_reply(a, b)
    assert spec[1][-1].stats.cached_n == len(PROMPT) + stop_at  # the stop id was never fed


@pytest.mark.parametrize("cancel_after", [2, 3, 7])
def test_a_cancel_inside_a_round(backends, oracle, plain_reply, cancel_after):
    spec = two_turns(backends("ngram:4"), cancel_after=cancel_after)
    plain = two_turns(backends("off"), cancel_after=cancel_after)
    assert spec[0][-1].reason == "cancelled" and ids_of(spec[0]) == plain_reply[:len(ids_of(spec[0]))]
    for a, b in zip(spec, plain):
        assert_same_reply(a, b)
    assert spec[1][-1].stats.cached_n == len(PROMPT) + len(ids_of(spec[0]))


def test_a_stream_closed_inside_a_round_keeps_the_streamed_tokens(backends, oracle, plain_reply):
    backend = backends("ngram:4")
    stream = backend.generate(GenerationRequest(PROMPT, replace(GREEDY, max_tokens=REPLY), stop_ids=()),
                              threading.Event())
    shown = []
    for event in stream:
        shown += event.ids if isinstance(event, TokenEvent) else []
        if len(shown) >= 2:  # the first round's kept drafts are not all streamed yet
            break
    stream.close()
    second = run(backend, PROMPT + tuple(shown) + NEXT_TURN, max_tokens=4)
    plain = run(backends("off"), PROMPT + tuple(shown) + NEXT_TURN, max_tokens=4)
    assert second[-1].stats.cached_n == len(PROMPT) + len(shown)
    assert ids_of(second) == ids_of(plain)


def test_the_length_limit_and_the_context_end(backends, oracle, monkeypatch):
    for first in (dict(max_tokens=7), dict(max_tokens=1)):
        spec, plain = two_turns(backends("ngram:4"), **first), two_turns(backends("off"), **first)
        for a, b in zip(spec, plain):
            assert_same_reply(a, b)
    for spelling in ("ngram:4", "off"):
        backend = backends(spelling)
        monkeypatch.setattr(backend, "_info", replace(backend.info, context_max=len(PROMPT) + 6))
    spec, plain = run(backends("ngram:4"), PROMPT), run(backends("off"), PROMPT)
    assert spec[-1].reason == "context" and len(ids_of(spec)) == 6
    assert_same_reply(spec, plain)


def test_a_seeded_sampled_reply_repeats(backends):
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=5)
    for spelling in ("auto", "mtp:2"):  # the policy starts afresh each reply
        a = run(backends(spelling), PROMPT, max_tokens=6, sampling=params)
        b = run(backends(spelling), PROMPT, max_tokens=6, sampling=params)
        assert ids_of(a) == ids_of(b) and len(ids_of(a)) == 6
        assert a[-1].stats.draft_n_accepted <= a[-1].stats.draft_n
    assert (a[-1].stats.draft_rounds, a[-1].stats.draft_n) == (4, 2 + 2 + 2 + 1)  # mtp:2 with room 4, 3, 2, 1


def test_mtp_without_mtp_weights_falls_back_to_ngram_drafts_saying_so(tmp_path):
    ckpt = write_checkpoint(tmp_path / "no-mtp", get_preset("tiny-dense"), with_mtp=False)
    said = []
    backend = ReferenceBackend(ckpt, tokenizer=real_tokenizer(), speculation=Speculation("mtp", 3), say=said.append)
    assert backend.speculation == Speculation("ngram", 3) and backend.info.speculative
    assert len(said) == 1 and "no MTP weights" in said[0] and "n-gram drafts (ngram:3)" in said[0]
    events = run(backend, PROMPT, max_tokens=3)
    assert len(ids_of(events)) == 3 and events[-1].stats.draft_n == 0  # a random reply offers no n-grams
    said.clear()
    assert ReferenceBackend(ckpt, tokenizer=real_tokenizer(), say=said.append).speculation == Speculation()
    assert said == []


def test_a_snapshot_after_rejected_drafts_serves_a_regenerate(backends, plain_reply):
    """A turn boundary saved right after a reply whose last round was rolled back (the random MTP's
    three drafts are rejected) is restored by the next regenerate, as plain decoding's is."""
    regenerated = {}
    for spelling in ("mtp:3", "off"):
        backend = backends(spelling)
        first = ids_of(run(backend, PROMPT, stop_ids=(plain_reply[4],)))
        held = len(PROMPT) + len(first)  # the stop id was not fed
        turn = PROMPT + tuple(first) + NEXT_TURN
        a = run(backend, turn, max_tokens=3, snapshot_at=(held,))
        b = run(backend, turn, max_tokens=3)  # regenerate: resumes from the snapshot
        assert b[-1].reason == "length" and b[-1].stats.cached_n == held and ids_of(a) == ids_of(b)
        regenerated[spelling] = ids_of(b)
    assert regenerated["mtp:3"] == regenerated["off"]
