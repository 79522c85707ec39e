"""GenerationLoop on a fake engine whose "model" is a fixed function of the token history: what
both backends share (validation, snapshots, stop ids, text streaming, Stats pacing, errors)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from lampo.engine.protocol import ContextOverflow, Done, GenerationRequest, PrefillProgress, Stats, TokenEvent
from lampo.engine import loop as loop_module
from lampo.engine.loop import Decoded, GenerationLoop, SyncDecode, chunk_ends
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.engine.prefix_cache import PrefixCache

STOP = 99


def next_token(history: list[int]) -> int:
    return 1000 + sum((i + 1) * t for i, t in enumerate(history)) % 997


class FakeSteps(SyncDecode):
    def __init__(self, chunk=4, stop_at=None, fail_at_decode=None):
        self.chunk, self.stop_at, self.fail_at_decode = chunk, stop_at, fail_at_decode
        self.history: list[int] = []
        self.slots: dict[int, list[int]] = {}
        self.calls: list[tuple] = []
        self.vram_queries = 0

    def begin(self):
        self.calls.append(("begin",))

    def reset(self):
        self.calls.append(("reset",))
        self.history = []

    def restore(self, slot):
        self.calls.append(("restore", slot))
        self.history = list(self.slots[slot])

    def snapshot(self, slot):
        self.calls.append(("snapshot", slot, len(self.history)))
        self.slots[slot] = list(self.history)

    def prefill(self, ids, last):
        self.calls.append(("prefill", len(ids), last))
        self.history += ids
        return self._sample() if last else None

    def decode(self, fed, max_drafts):
        if self.fail_at_decode is not None and len(self.history) >= self.fail_at_decode:
            raise RuntimeError("decode failed")
        self.history.append(fed)
        return Decoded((self._sample(),))

    def vram(self):
        self.vram_queries += 1
        return 7, 10

    def _sample(self):
        return STOP if self.stop_at is not None and len(self.history) >= self.stop_at else next_token(self.history)


class SilentEvenTokenizer:
    """Odd ids have no text of their own yet: they are shown with the next even id. No stop ids."""

    stop_ids = ()

    class Decoder:
        def __init__(self):
            self.held = []

        def push(self, token):
            self.held.append(token)
            if token % 2:
                return ""
            text, self.held = "".join(f"<{t}>" for t in self.held), []
            return text

        def flush(self):
            text, self.held = "".join(f"[{t}]" for t in self.held), []
            return text

    def stream_decoder(self):
        return self.Decoder()


def make_loop(**kw):
    forgotten, recovered = [], []
    loop = GenerationLoop(SilentEvenTokenizer(), PrefixCache(2), label="fake",
                          forget=lambda: forgotten.append(1), recover=lambda: recovered.append(1), **kw)
    return loop, forgotten, recovered


def run(loop, steps, prompt, max_tokens=5, snapshot_at=(), context_max=64, stop_ids=(STOP,)):
    request = GenerationRequest(tuple(prompt), SamplingParams(**{**GREEDY.to_dict(), "max_tokens": max_tokens}),
                                snapshot_at=snapshot_at, stop_ids=stop_ids)
    events = list(loop.start(request, threading.Event(), steps, context_max))
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1
    return events


def token_ids(events):
    return [i for e in events if isinstance(e, TokenEvent) for i in e.ids]


@pytest.mark.parametrize("start,end,chunk,cuts,want", [
    (0, 10, 4, (), [4, 8, 10]),
    (0, 10, 4, (6,), [4, 6, 10]),
    (3, 10, 4, (3, 5, 10, 12), [5, 9, 10]),
    (0, 3, 8, (), [3]),
])
def test_chunk_ends(start, end, chunk, cuts, want):
    assert chunk_ends(start, end, chunk, cuts) == want


def test_requests_are_checked_before_any_work():
    loop, _, _ = make_loop()
    steps = FakeSteps()
    with pytest.raises(ValueError, match="prompt is empty"):
        loop.start(GenerationRequest(()), threading.Event(), steps, 64)
    with pytest.raises(ContextOverflow):
        loop.start(GenerationRequest(tuple(range(65))), threading.Event(), steps, 64)
    with pytest.raises(ValueError):
        loop.start(GenerationRequest((1, 2), SamplingParams(temperature=-1.0)), threading.Event(), steps, 64)
    assert steps.calls == []
    stream = loop.start(GenerationRequest((1, 2, 3)), threading.Event(), steps, 64)
    next(stream)
    with pytest.raises(RuntimeError, match="the fake backend is already generating"):
        loop.start(GenerationRequest((1, 2)), threading.Event(), FakeSteps(), 64)
    stream.close()  # an abandoned stream releases the backend
    assert run(loop, FakeSteps(), [1, 2], max_tokens=1)[-1].reason == "length"


def test_without_stop_ids_in_the_request_the_tokenizers_end_the_reply():
    loop, _, _ = make_loop()
    loop._tokenizer.stop_ids = (STOP,)  # the model's own end-of-turn ids, not the caller's
    events = run(loop, FakeSteps(stop_at=14), list(range(1, 11)), max_tokens=50, stop_ids=None)
    assert events[-1].reason == "stop" and STOP not in token_ids(events)
    assert run(loop, FakeSteps(stop_at=14), list(range(1, 11)), max_tokens=8, stop_ids=())[-1].reason == "length"


def test_text_streams_with_its_ids_and_the_stop_id_is_never_fed():
    loop, _, _ = make_loop()
    steps = FakeSteps(stop_at=14)
    prompt = list(range(1, 11))
    events = run(loop, steps, prompt, max_tokens=50)
    ids = token_ids(events)
    assert events[-1].reason == "stop" and len(ids) == 4 and STOP not in ids
    for e in events:
        if isinstance(e, TokenEvent) and e.text.startswith("<"):
            assert e.text == "".join(f"<{i}>" for i in e.ids)
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)).replace("[", "<").replace("]", ">") \
        == "".join(f"<{i}>" for i in ids)
    assert loop.cache.current == tuple(prompt + ids)  # every reply token fed, the stop id not
    s = events[-1].stats
    assert (s.prompt_n, s.predicted_n, s.context_used, s.vram_used, s.vram_total) == (10, 4, 14, 7, 10)


def test_a_stream_closed_while_a_step_runs_keeps_the_cache_equal_to_the_state():
    loop, _, _ = make_loop()
    steps = FakeSteps()
    prompt = list(range(1, 11))
    stream = loop.start(GenerationRequest(tuple(prompt), SamplingParams(**{**GREEDY.to_dict(), "max_tokens": 50})),
                        threading.Event(), steps, 64)
    shown = next(e for e in stream if isinstance(e, TokenEvent))  # the step feeding its last id is queued
    stream.close()
    assert loop.cache.current == tuple(steps.history) == tuple(prompt) + shown.ids
    assert run(loop, steps, prompt + list(shown.ids) + [5, 6], max_tokens=1)[-1].stats.cached_n == len(prompt) + \
        len(shown.ids)


def test_a_snapshot_requested_at_the_resume_point_is_saved_before_prefill():
    loop, _, _ = make_loop()
    steps = FakeSteps()
    first = run(loop, steps, list(range(1, 11)), max_tokens=3)
    held = loop.cache.current_len  # 12: the last reply token was never fed
    steps.calls.clear()
    prompt = list(loop.cache.current) + [5, 6]
    events = run(loop, steps, prompt, max_tokens=1, snapshot_at=(held,))
    assert first[-1].reason == "length" and events[-1].stats.cached_n == held
    assert steps.calls[:3] == [("begin",), ("snapshot", 0, held), ("prefill", 2, True)]
    assert loop.cache.snapshots() == {0: held}


def test_stats_are_paced_while_decoding():
    for interval, expected in ((0.0, 1 + 5 + 1), (3600.0, 1 + 1)):
        loop, _, _ = make_loop(stats_interval_s=interval)
        events = run(loop, FakeSteps(), list(range(1, 11)), max_tokens=6)
        assert sum(isinstance(e, Stats) for e in events) == expected  # after prefill, per step, final
        assert [e.done for e in events if isinstance(e, PrefillProgress)] == [4, 8, 10]


def test_prefill_progress_gives_the_time_left_of_calls_that_cost_more_at_later_positions(monkeypatch):
    """A token at position p costing a + b * p (the attention reads every earlier key): from the
    second call on, the events' time left is the remaining positions' cost, where the rate so far
    would promise an earlier end."""
    clock = [100.0]
    monkeypatch.setattr(loop_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def cost(pos):
        return 0.001 + 0.0005 * pos

    class TimedSteps(FakeSteps):
        def prefill(self, ids, last):
            start = len(self.history)
            clock[0] += sum(cost(p) for p in range(start, start + len(ids)))
            return super().prefill(ids, last)

    loop, _, _ = make_loop()
    progress = [e for e in run(loop, TimedSteps(), list(range(1, 15)), max_tokens=1) if isinstance(e, PrefillProgress)]
    assert [e.done for e in progress] == [4, 8, 12, 14]
    assert progress[0].seconds_left == pytest.approx((14 - 4) / progress[0].tokens_per_second)  # one call: its rate
    for e in progress[1:]:
        assert e.seconds_left == pytest.approx(sum(cost(p) for p in range(e.done, 14)))
    assert progress[-1].seconds_left == 0.0
    e = progress[1]
    assert (e.total - e.done) / e.tokens_per_second < 0.8 * e.seconds_left


def test_a_failure_forgets_every_state_and_recovers():
    loop, forgotten, recovered = make_loop()
    steps = FakeSteps(fail_at_decode=12)
    events = run(loop, steps, list(range(1, 11)), max_tokens=10, snapshot_at=(6,))
    done = events[-1]
    assert done.reason == "error" and done.error == "RuntimeError: decode failed"
    assert done.stats.predicted_n == 3 and done.stats.context_used == 12 and done.stats.vram_used == 7
    assert loop.cache.current_len == 0 and loop.cache.snapshots() == {}
    assert recovered == [1] and forgotten == []
    queries = steps.vram_queries
    steps.fail_at_decode = None
    events = run(loop, steps, list(range(1, 11)), max_tokens=2)
    assert events[-1].reason == "length" and events[-1].stats.cached_n == 0 and steps.vram_queries > queries
    loop.reset()
    assert forgotten == [1]


# ---- steps that keep drafts (speculative decoding) ---------------------------------------------
class DraftingSteps(FakeSteps):
    """A speculative engine on the same "model": each step drafts min(4, max_drafts) tokens and
    keeps the next `pattern` number of them (cycling; the kept ones are the true tokens), so the
    stream must equal FakeSteps' whatever the pattern. `log`: (drafted, kept) per step."""

    def __init__(self, pattern, context_max, **kw):
        super().__init__(**kw)
        self.pattern, self.context_max = list(pattern), context_max
        self.log: list[tuple[int, int]] = []

    def decode(self, fed, max_drafts):
        self.history.append(fed)
        drafted = min(4, max_drafts)
        kept = min(self.pattern[len(self.log) % len(self.pattern)], drafted)
        self.log.append((drafted, kept))
        tokens = []
        for _ in range(kept):
            tokens.append(self._sample())
            self.history.append(tokens[-1])
        assert len(self.history) <= self.context_max  # the loop leaves drafts no room past the context
        return Decoded((*tokens, self._sample()), drafted)

    def rewind(self, n):
        assert 0 < n <= self.log[-1][1]
        del self.history[-n:]


def run_with(steps, prompt, max_tokens, context_max, cancel_after=None):
    """(events, loop) of one request; `cancel_after`: the cancel flag is set once that many ids
    were streamed."""
    loop, _, _ = make_loop()
    request = GenerationRequest(tuple(prompt), SamplingParams(**{**GREEDY.to_dict(), "max_tokens": max_tokens}),
                                stop_ids=(STOP,))
    cancel, events = threading.Event(), []
    for event in loop.start(request, cancel, steps, context_max):
        events.append(event)
        if cancel_after is not None and len(token_ids(events)) >= cancel_after:
            cancel.set()
    return events, loop


@pytest.mark.parametrize("pattern", [(0,), (4,), (3, 0, 2, 4, 1)])
@pytest.mark.parametrize("max_tokens", [1, 2, 6, 30])
@pytest.mark.parametrize("stop_at", [None, 13, 16])
@pytest.mark.parametrize("context_max", [64, 19])
def test_kept_drafts_stream_as_plain_decoding_would(pattern, max_tokens, stop_at, context_max):
    prompt = list(range(1, 11))
    plain_steps, steps = FakeSteps(stop_at=stop_at), DraftingSteps(pattern, context_max, stop_at=stop_at)
    plain, _ = run_with(plain_steps, prompt, max_tokens, context_max)
    spec, loop = run_with(steps, prompt, max_tokens, context_max)
    assert token_ids(spec) == token_ids(plain) and spec[-1].reason == plain[-1].reason
    assert [e.text for e in spec if isinstance(e, TokenEvent)] == [e.text for e in plain if isinstance(e, TokenEvent)]
    # kept drafts a stop left unstreamed were taken back: the state is plain decoding's
    assert loop.cache.current == tuple(steps.history) == tuple(plain_steps.history)
    a, b = spec[-1].stats, plain[-1].stats
    assert (a.predicted_n, a.context_used, a.prompt_n) == (b.predicted_n, b.context_used, b.prompt_n)
    drafting = [(d, k) for d, k in steps.log if d]
    assert (a.draft_n, a.draft_n_accepted, a.draft_rounds) == (sum(d for d, _ in drafting), sum(k for _, k in drafting),
                                                               len(drafting))
    assert (b.draft_n, b.draft_rounds) == (0, 0)


@pytest.mark.parametrize("cancel_after", [1, 2, 3, 4, 5, 7])
def test_cancel_inside_a_round_keeps_exactly_the_streamed_tokens(cancel_after):
    prompt = list(range(1, 11))
    steps = DraftingSteps((4,), 64)
    events, loop = run_with(steps, prompt, 30, 64, cancel_after=cancel_after)
    plain_steps = FakeSteps()
    plain, _ = run_with(plain_steps, prompt, 30, 64, cancel_after=cancel_after)
    ids = token_ids(events)
    assert events[-1].reason == "cancelled" and ids == token_ids(plain) and len(ids) < 30
    assert loop.cache.current == tuple(steps.history) == tuple(prompt + ids) == tuple(plain_steps.history)


def test_a_stream_closed_inside_a_round_takes_the_unstreamed_drafts_back():
    prompt = list(range(1, 11))
    steps = DraftingSteps((4,), 64)
    loop, _, _ = make_loop()
    stream = loop.start(GenerationRequest(tuple(prompt), SamplingParams(**{**GREEDY.to_dict(), "max_tokens": 50})),
                        threading.Event(), steps, 64)
    shown = []
    for event in stream:
        shown += event.ids if isinstance(event, TokenEvent) else []
        if len(shown) >= 3:  # the first round kept 4 drafts: some are still unstreamed
            break
    stream.close()
    assert loop.cache.current == tuple(steps.history) == tuple(prompt + shown)  # as plain decoding leaves it


def test_drafts_are_asked_only_where_the_reply_has_room():
    steps = DraftingSteps((4,), 64)
    events, _ = run_with(steps, list(range(1, 11)), 7, 64)
    assert len(token_ids(events)) == 7 and [d for d, _ in steps.log] == [4, 0]  # 1 + 4 kept + 1, then a plain step
    steps = DraftingSteps((0,), 14)
    events, _ = run_with(steps, list(range(1, 11)), 30, 14)
    assert events[-1].reason == "context" and [d for d, _ in steps.log] == [3, 2, 1, 0]
