"""ReferenceBackend on a tiny synthetic MoE checkpoint: prefix reuse across turns, snapshots for
regenerate, cancellation, overflow, context end, and greedy equality with the model itself."""

import threading
from dataclasses import replace

import numpy as np
import pytest
from helpers import real_tokenizer

from lampo.engine.protocol import Backend, ContextOverflow, Done, GenerationRequest, PrefillProgress, Stats, TokenEvent
from lampo.chat_session import ChatSession
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.engine.reference import ReferenceBackend
from lampo.store import Store

NO_STOP = ()
GREEDY4 = replace(GREEDY, max_tokens=4)  # no stop ids in these tests: keep replies short


@pytest.fixture(scope="module")
def backend(tiny_moe_dir):
    b = ReferenceBackend(tiny_moe_dir, context_max=4096, prefill_chunk=16, tokenizer=real_tokenizer())
    yield b
    b.close()


@pytest.fixture(autouse=True)
def fresh(backend):
    backend.reset()


def prompt_ids(n, start=1000):
    return tuple(range(start, start + n))


def run(backend, ids, sampling=GREEDY4, snapshot_at=(), stop_ids=NO_STOP, cancel=None, on_event=None):
    cancel = cancel or threading.Event()
    request = GenerationRequest(tuple(ids), sampling, snapshot_at=snapshot_at, stop_ids=stop_ids)
    events = []
    for event in backend.generate(request, cancel):
        events.append(event)
        if on_event:
            on_event(event, cancel)
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1
    return events


def generated(events):
    return [i for e in events if isinstance(e, TokenEvent) for i in e.ids]


def test_protocol_and_info(backend):
    assert isinstance(backend, Backend)
    info = backend.info
    assert (info.backend, info.context_max, info.is_demo) == ("reference", 4096, False)


def test_greedy_equals_direct_reference_decoding(backend):
    ids = prompt_ids(40)
    model = backend.model
    logits = model.prefill(ids, chunk_size=16, last_only=True)
    expected = []
    for _ in range(6):
        expected.append(int(np.argmax(logits)))
        logits = model.decode(expected[-1])
    backend.reset()
    events = run(backend, ids, replace(GREEDY, max_tokens=6))
    assert generated(events) == expected
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert text == real_tokenizer().decode(expected)
    done = events[-1]
    assert done.reason == "length"
    s = done.stats
    assert (s.prompt_n, s.cached_n, s.predicted_n, s.context_used, s.vram_used) == (40, 0, 6, 46, 0)
    assert s.prompt_ms > 0 and s.predicted_ms > 0 and s.ttft_ms >= s.prompt_ms
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert [p.done for p in progress] == [16, 32, 40] and {p.total for p in progress} == {40}


def test_next_turn_prefills_only_new_tokens(backend):
    first = run(backend, prompt_ids(30), SamplingParams(temperature=0.0, max_tokens=4))
    reply = generated(first)
    second = run(backend, prompt_ids(30) + tuple(reply) + prompt_ids(10, 5000),
                 SamplingParams(temperature=0.0, max_tokens=2))
    stats = second[-1].stats
    # the last reply token was never fed to the model (the length limit came first)
    assert stats.cached_n == 30 + len(reply) - 1 and stats.prompt_n == 11


def test_snapshot_serves_a_regenerate_and_a_diverging_history(backend):
    ids = prompt_ids(30)
    run(backend, ids + (7, 8, 9), snapshot_at=(30,))
    again = run(backend, ids + (7, 8, 9))  # regenerate: same prompt, state moved past it
    assert (again[-1].stats.cached_n, again[-1].stats.prompt_n) == (30, 3)
    other = run(backend, ids + (11, 12))  # history re-rendered differently after 30
    assert other[-1].stats.cached_n == 30


def test_cancel_mid_prefill_keeps_a_consistent_state(backend):
    def stop_after_first_chunk(event, cancel):
        if isinstance(event, PrefillProgress):
            cancel.set()

    events = run(backend, prompt_ids(100), on_event=stop_after_first_chunk)
    assert events[-1].reason == "cancelled" and not generated(events)
    assert [e.done for e in events if isinstance(e, PrefillProgress)] == [16]
    resumed = run(backend, prompt_ids(100), SamplingParams(temperature=0.0, max_tokens=1))
    assert (resumed[-1].stats.cached_n, resumed[-1].stats.prompt_n) == (16, 84)


def test_cancel_mid_decode_keeps_the_tokens_so_far(backend):
    seen = []

    def stop_after_two(event, cancel):
        if isinstance(event, TokenEvent):
            seen.extend(event.ids)
            if len(seen) >= 2:
                cancel.set()

    events = run(backend, prompt_ids(20), replace(GREEDY, max_tokens=50), on_event=stop_after_two)
    assert events[-1].reason == "cancelled" and len(generated(events)) == 2
    assert events[-1].stats.predicted_n == 2 and events[-1].stats.context_used == 22


def test_overflow_is_refused_before_any_work(backend):
    with pytest.raises(ContextOverflow) as e:
        backend.generate(GenerationRequest(prompt_ids(4097)), threading.Event())
    assert e.value.prompt_tokens == 4097 and e.value.context_max == 4096
    assert run(backend, prompt_ids(5), SamplingParams(temperature=0.0, max_tokens=1))[-1].reason == "length"


def test_stops_at_the_context_end_and_on_stop_ids(backend, monkeypatch):
    monkeypatch.setattr(backend, "_info", replace(backend.info, context_max=23))
    events = run(backend, prompt_ids(20), replace(GREEDY, max_tokens=50))
    assert events[-1].reason == "context" and len(generated(events)) == 3
    backend.reset()
    monkeypatch.undo()
    first = generated(run(backend, prompt_ids(20), SamplingParams(temperature=0.0, max_tokens=1)))
    backend.reset()
    stopped = run(backend, prompt_ids(20), stop_ids=tuple(first))
    assert stopped[-1].reason == "stop" and generated(stopped) == []


def test_seeded_sampling_is_reproducible_and_stats_stream(backend):
    params = SamplingParams(temperature=1.0, top_k=50, seed=11, max_tokens=5)
    a = run(backend, prompt_ids(12), params)
    backend.reset()
    b = run(backend, prompt_ids(12), params)
    assert generated(a) == generated(b) and len(generated(a)) == 5
    assert sum(isinstance(e, Stats) for e in a) >= 5


def test_chat_turns_reuse_the_snapshot_through_chat_session(backend, tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    session = ChatSession(backend, real_tokenizer(), store, sampling=SamplingParams(temperature=0.0, max_tokens=4))
    list(session.send("Hello there"))
    first_boundary = max(backend._cache.snapshots().values())
    list(session.send("And again"))
    assert session.last_stats.cached_n == first_boundary  # reasoning dropped: resumed at the snapshot
    list(session.regenerate())
    assert session.last_stats.cached_n == max(backend._cache.snapshots().values())
    assert session.last_stats.prompt_n < 10
    store.close()


def test_busy_backend_refuses_a_second_generation(backend):
    stream = backend.generate(GenerationRequest(prompt_ids(40), GREEDY4), threading.Event())
    next(stream)
    with pytest.raises(RuntimeError, match="already generating"):
        backend.generate(GenerationRequest(prompt_ids(5)), threading.Event())
    stream.close()
    assert run(backend, prompt_ids(5), SamplingParams(temperature=0.0, max_tokens=1))[-1].reason == "length"
