"""The engine's speculative verify window (Engine.verify / accept / verify_logits, engine_verify.cu).

A verify window runs the last sampled token and the drafts through the few-token forward, keeping
each row's Gated DeltaNet conv state and a record of its recurrent update; accept(keep) makes the
state the one after row keep - 1 (the recurrent state is rebuilt from the records when the next
forward or a snapshot settles the window). Checked
against the same tokens run one at a time through the engine (tolerances of test_engine.py's
engine-vs-engine comparisons: the two paths round differently in bf16, and an MoE row may pick
another expert where the router is near a tie), and the misuses refused with their numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.logit_rows import REAL_VOCAB, assert_rows_agree
from lampo.engine.cuda import load_weights
from lampo.models.checkpoint import Checkpoint
from lampo.models.presets import get_preset
from lampo.models.synthetic import write_checkpoint
from lampo.models.tensor_specs import engine_tensor_names

_native = pytest.importorskip("lampo._native")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device"),
]

ROWS = 5  # the last sampled token and four drafts
DENSE_TOL = 2e-2  # engine vs engine (test_engine.py)


@pytest.fixture(scope="module", params=["tiny-dense", "tiny-moe"])
def tiny(request, tmp_path_factory):
    """(engine with verify rows, whether the model is MoE)."""
    d = write_checkpoint(tmp_path_factory.mktemp(request.param), get_preset(request.param), seed=1,
                         with_mtp=False)
    ck = Checkpoint.open(d, include_mtp=False)
    engine = _native.Engine(ck.config, engine_tensor_names(ck.config), context_max=512, prefill_chunk=64,
                            snapshot_slots=1, verify_rows=ROWS)
    load_weights(engine, ck)
    return engine, ck.config.is_moe


def start(engine, prompt) -> int:
    engine.reset()
    engine.set_sampling(0.0, 0, 1.0, 0.0, 0.0, 0)
    engine.begin_generation()
    return engine.prefill(np.asarray(prompt, np.int32), True)


def one_at_a_time(engine, prompt, tokens) -> list[np.ndarray]:
    """Logits after each of `tokens`, fed one per call after `prompt`."""
    start(engine, prompt)
    rows = []
    for t in tokens:
        engine.prefill(np.asarray([t], np.int32), True)
        rows.append(np.asarray(engine.logits()))
    return rows


def window(engine, prompt, seed) -> list[int]:
    """The prompt's sampled token followed by ROWS - 1 random drafts."""
    first = start(engine, prompt)
    drafts = np.random.default_rng(seed).integers(0, REAL_VOCAB, ROWS - 1)
    return [first, *map(int, drafts)]


def test_each_verify_row_matches_the_tokens_run_one_at_a_time(tiny):
    engine, moe = tiny
    prompt = np.random.default_rng(0).integers(0, REAL_VOCAB, 24)
    ids = window(engine, prompt, seed=1)
    greedy = engine.verify(np.asarray(ids, np.int32))
    rows = engine.verify_logits()
    assert rows.shape == (ROWS, engine.vocab)
    assert engine.position == len(prompt) + ROWS
    np.testing.assert_array_equal(greedy, np.argmax(rows[:, :REAL_VOCAB], axis=1))
    assert_rows_agree(rows, one_at_a_time(engine, prompt, ids), moe, "verify rows", DENSE_TOL)


# (4, 2): take two drafts back; (): no accept at all, the window is kept whole
@pytest.mark.parametrize("keeps", [(3,), (ROWS,), (1,), (4, 2), ()])
@pytest.mark.parametrize("snapshot", [False, True])
def test_accept_continues_as_if_only_the_kept_rows_had_run(tiny, keeps, snapshot):
    """With `snapshot`, the state is saved after the accepts and restored over another prompt's
    before the rows that follow: a snapshot settles the window (the kept rows' recurrent states
    are rebuilt before it copies them), after which no accept is taken any more."""
    engine, moe = tiny
    prompt = np.random.default_rng(2).integers(0, REAL_VOCAB, 20)
    ids = window(engine, prompt, seed=3)
    engine.verify(np.asarray(ids, np.int32))
    for keep in keeps:
        engine.accept(keep)
    keep = keeps[-1] if keeps else ROWS
    assert engine.position == len(prompt) + keep
    if snapshot:
        engine.snapshot(0)
        with pytest.raises(ValueError, match="none held"):
            engine.accept(1)
        start(engine, prompt[:7])
        engine.restore(0)
    follow = [int(t) for t in np.random.default_rng(4).integers(0, REAL_VOCAB, 3)]
    got = []
    for t in follow:
        engine.prefill(np.asarray([t], np.int32), True)
        got.append(np.asarray(engine.logits()))
    want = one_at_a_time(engine, prompt, ids[:keep] + follow)[keep:]
    assert_rows_agree(got, want, moe, f"after accept{keeps}", DENSE_TOL)


def test_a_verify_after_an_accept_and_a_graphed_decode_step(tiny):
    """Rounds back to back, the way generation runs them, then a plain decode step."""
    engine, moe = tiny
    prompt = np.random.default_rng(5).integers(0, REAL_VOCAB, 16)
    first = start(engine, prompt)
    fed, kept_ids = first, []
    for seed in (6, 7):
        drafts = [int(t) for t in np.random.default_rng(seed).integers(0, REAL_VOCAB, ROWS - 1)]
        greedy = engine.verify(np.asarray([fed, *drafts], np.int32))
        engine.accept(2)  # the fed token and one draft
        kept_ids += [fed, drafts[0]]
        fed = int(greedy[1])
    token = engine.decode(fed)
    got = np.asarray(engine.logits())
    want = one_at_a_time(engine, prompt, kept_ids + [fed])[-1]
    assert_rows_agree([got], [want], moe, "decode after two rounds", DENSE_TOL)
    assert token == int(np.argmax(got[:REAL_VOCAB])) or moe


def test_a_profiled_window_is_the_window_and_moves_one_token(tiny):
    """profile_verify runs the window un-graphed with events and keeps its first row each time: the
    rows are the graphed window's, and the position moves one token per window."""
    engine, _ = tiny
    prompt = np.random.default_rng(9).integers(0, REAL_VOCAB, 12)
    ids = window(engine, prompt, seed=10)
    engine.snapshot(0)
    engine.verify(np.asarray(ids, np.int32))
    graphed = engine.verify_logits()
    engine.restore(0)
    profile = engine.profile_verify(np.asarray(ids, np.int32), 2)
    assert engine.position == len(prompt) + 2
    assert profile["step_total"] > 0 and profile["lm_head"] > 0 and profile["sampling"] > 0
    assert sum(v for k, v in profile.items() if k != "step_total") <= 1.5 * profile["step_total"]
    engine.restore(0)
    engine.profile_verify(np.asarray(ids, np.int32), 1)
    engine.restore(0)
    engine.verify(np.asarray(ids, np.int32))
    np.testing.assert_array_equal(engine.verify_logits(), graphed)


def test_misuse_is_refused_with_numbers(tiny):
    engine, _ = tiny
    prompt = np.random.default_rng(8).integers(0, REAL_VOCAB, 8)
    start(engine, prompt)
    with pytest.raises(ValueError, match="window of 1 tokens; this engine verifies 2..5"):
        engine.verify(np.asarray([1], np.int32))
    with pytest.raises(ValueError, match="window of 6 tokens"):
        engine.verify(np.arange(6, dtype=np.int32))
    with pytest.raises(ValueError, match="keep 1 of a verify window of 0 rows"):
        engine.accept(1)
    engine.verify(np.asarray([1, 2, 3], np.int32))
    with pytest.raises(ValueError, match="keep 4 of a verify window of 3 rows"):
        engine.accept(4)
    engine.prefill(np.asarray([5], np.int32), True)  # a forward since: the rows are gone
    with pytest.raises(ValueError, match="none held"):
        engine.accept(1)
    engine.verify(np.asarray([1, 2, 3], np.int32))
    engine.accept(2)
    engine.settle()  # the window ended here, as a forward would end it
    with pytest.raises(ValueError, match="none held"):
        engine.accept(1)
    assert engine.position == len(prompt) + 3 + 1 + 2  # the first window whole, the token, two rows


def test_the_captured_window_equals_the_eager_launches(tiny, tmp_path):
    """The verify graph of each window size (the default) against the same window launched eagerly,
    over rounds back to back: the same kernels, so the same numbers."""
    engine, moe = tiny
    d = write_checkpoint(tmp_path / "again", get_preset("tiny-moe" if moe else "tiny-dense"), seed=1, with_mtp=False)
    ck = Checkpoint.open(d, include_mtp=False)
    eager = _native.Engine(ck.config, engine_tensor_names(ck.config), context_max=512, prefill_chunk=64,
                           snapshot_slots=1, verify_rows=ROWS, speculative_graphs=False)
    load_weights(eager, ck)
    prompt = np.random.default_rng(9).integers(0, REAL_VOCAB, 12)
    rows = {}
    for name, e in (("graph", engine), ("eager", eager)):
        fed, rows[name] = start(e, prompt), []
        for n in (ROWS, 3, ROWS):  # a size again after another: the graph is replayed
            drafts = [int(t) for t in np.random.default_rng(n).integers(0, REAL_VOCAB, n - 1)]
            greedy = e.verify(np.asarray([fed, *drafts], np.int32))
            rows[name].append(e.verify_logits())
            e.accept(2)
            fed = int(greedy[1])
    for got, want in zip(rows["graph"], rows["eager"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
