"""The engine's MTP module (Engine.mtp_draft, engine_mtp.cu; mtp_forward in model_forward.cu)
against the numpy reference's MTP layer (models/reference/mtp.py), and MTP rounds through the
CUDA backend.

The engine runs the MTP rows of every prefill chunk, verify window and decode step and keeps the
held trunk row;
mtp_draft(token, j) feeds the sampled token with that row, then chains j - 1 times, and leaves the
last step's draft logits where engine.logits() reads them. Each step's logits must match the
reference's MTP row for the same inputs (the reference chained on the engine's own drafts) within
test_engine.py's engine-vs-reference tolerances (MoE: the median row and a loose bound, since a
router near-tie may pick another expert).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers import TagTokenizer
from helpers.logit_rows import REAL_VOCAB, assert_rows_agree, prefill, rel_l2
from lampo.engine.cuda import CudaBackend, load_weights
from lampo.engine.protocol import GenerationRequest, TokenEvent
from lampo.engine.speculation import Speculation, parse_speculation
from lampo.models.checkpoint import Checkpoint
from lampo.models.presets import get_preset
from lampo.models.reference.model import ReferenceModel
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.models.synthetic import write_checkpoint
from lampo.models.tensor_specs import engine_tensor_names

_native = pytest.importorskip("lampo._native")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device"),
]

CHUNK = 64
DENSE_TOL = 4e-2  # engine vs reference (test_engine.py)


@pytest.fixture(scope="module", params=["tiny-dense", "tiny-moe"])
def tiny(request, tmp_path_factory):
    """(model directory, engine with the MTP module and verify rows, reference, whether MoE)."""
    d = write_checkpoint(tmp_path_factory.mktemp(request.param), get_preset(request.param), seed=1, with_mtp=True)
    ck = Checkpoint.open(d)
    assert ck.has_mtp
    engine = _native.Engine(ck.config, engine_tensor_names(ck.config, mtp=True), context_max=1024,
                            prefill_chunk=CHUNK, snapshot_slots=2, verify_rows=5)
    load_weights(engine, ck)
    assert engine.has_mtp
    return d, engine, ReferenceModel.from_checkpoint(ck), ck.config.is_moe


def start(engine, prompt) -> int:
    engine.reset()
    engine.set_sampling(0.0, 0, 1.0, 0.0, 0.0, 0)
    engine.begin_generation()
    return prefill(engine, prompt)


def engine_chain(engine, token: int, k: int) -> tuple[list[int], list[np.ndarray]]:
    """The k drafts from `token` and each chain step's logits (mtp_draft(token, j), j = 1..k: the
    same MTP rows rewritten each time)."""
    logits = []
    for j in range(1, k + 1):
        drafts = [int(t) for t in engine.mtp_draft(token, j)]
        logits.append(np.asarray(engine.logits()))
    return drafts, logits


def reference_chain(ref, trunk_ids, token: int, drafts: list[int]) -> list[np.ndarray]:
    """The reference's draft logits after the trunk ran `trunk_ids` (ReferenceModel.mtp_chain)."""
    return ref.mtp_chain(trunk_ids, token, drafts)


def test_mtp_drafts_after_a_chunked_prefill_match_the_reference(tiny):
    _d, engine, ref, moe = tiny
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, REAL_VOCAB, 2 * CHUNK + 9)]
    first = start(engine, prompt)
    drafts, logits = engine_chain(engine, first, 4)
    assert drafts == [int(np.argmax(l[:REAL_VOCAB])) for l in logits]  # each draft is its step's argmax
    assert_rows_agree(logits, reference_chain(ref, prompt, first, drafts), moe, "MTP chain after prefill", DENSE_TOL)


def test_drafts_among_a_prefix_of_the_vocabulary(tiny):
    """With a draft vocabulary (Engine.draft_vocab) the chain reads the LM head's first rows only:
    each draft is the argmax of those logits, which match the reference's, and the draft graphs of
    either vocabulary give their own drafts when the setting goes back and forth."""
    _d, engine, ref, moe = tiny
    n = 4096
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, REAL_VOCAB, 50)]
    first = start(engine, prompt)
    every, _ = engine_chain(engine, first, 3)
    engine.draft_vocab = n
    try:
        drafts, logits = engine_chain(engine, first, 3)
        engine.draft_vocab = 0
        assert engine_chain(engine, first, 3)[0] == every
        engine.draft_vocab = n
        assert engine_chain(engine, first, 3)[0] == drafts
    finally:
        engine.draft_vocab = 0
    assert drafts == [int(np.argmax(l[:n])) for l in logits] and max(drafts) < n and max(every) >= n
    want = reference_chain(ref, prompt, first, drafts)
    assert_rows_agree([l[:n] for l in logits], [w[:n] for w in want], moe, "MTP chain over a prefix", DENSE_TOL)
    for bad in (100, 8, REAL_VOCAB + 16):
        with pytest.raises(ValueError, match="draft vocabulary"):
            engine.draft_vocab = bad


@pytest.mark.parametrize("keeps", [(3,), (5,), (1,), (4, 2)])  # (4, 2): take two drafts back
def test_the_mtp_rows_follow_the_kept_rows_of_a_verify_window(tiny, keeps):
    _d, engine, ref, moe = tiny
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, REAL_VOCAB, 40)]
    first = start(engine, prompt)
    drafts = [int(t) for t in np.random.default_rng(2).integers(0, REAL_VOCAB, 4)]
    window = [first, *drafts]
    targets = engine.verify(np.asarray(window, np.int32))
    for keep in keeps:
        engine.accept(keep)
    keep = keeps[-1]
    nxt = int(targets[keep - 1])
    chain, logits = engine_chain(engine, nxt, 2)
    want = reference_chain(ref, prompt + window[:keep], nxt, chain)
    assert_rows_agree(logits, want, moe, f"MTP chain after accept{keeps}", DENSE_TOL)


def test_plain_decode_steps_run_their_mtp_rows(tiny):
    """The decode graph runs the MTP row of its fed token before the trunk (queued steps too)."""
    _d, engine, ref, moe = tiny
    prompt = [int(t) for t in np.random.default_rng(7).integers(0, REAL_VOCAB, 33)]
    first = start(engine, prompt)
    engine.decode_submit(first)
    engine.decode_submit(-1)
    t1 = engine.decode_collect()
    t2 = engine.decode_collect()
    t3 = engine.decode(-1)  # fed: prompt, first, t1, t2
    chain, logits = engine_chain(engine, t3, 2)
    want = reference_chain(ref, prompt + [first, t1, t2], t3, chain)
    assert_rows_agree(logits, want, moe, "MTP chain after plain decode steps", DENSE_TOL)


def test_a_snapshot_keeps_the_held_row(tiny):
    _d, engine, _ref, _moe = tiny
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, REAL_VOCAB, 30)]
    first = start(engine, prompt)
    engine.snapshot(0)
    drafts, logits = engine_chain(engine, first, 2)
    engine.verify(np.asarray([first, *drafts], np.int32))  # the held row and the MTP rows move on
    engine.accept(3)
    engine.restore(0)
    again, logits_again = engine_chain(engine, first, 2)
    assert again == drafts
    for got, want in zip(logits_again, logits):
        assert rel_l2(got, want) <= 1e-3


def test_misuse_is_refused(tiny, tmp_path):
    _d, engine, _ref, _moe = tiny
    engine.reset()
    with pytest.raises(RuntimeError, match="no trunk row has run since the reset"):
        engine.mtp_draft(5, 1)
    start(engine, [1, 2, 3])
    with pytest.raises(ValueError, match="9 drafts; the chain makes 1..8"):
        engine.mtp_draft(5, 9)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.mtp_draft(-1, 1)
    plain = _native.Engine(get_preset("tiny-dense"), engine_tensor_names(get_preset("tiny-dense")), context_max=64,
                           prefill_chunk=16, snapshot_slots=1)
    assert not plain.has_mtp
    with pytest.raises(RuntimeError, match="MTP module is not loaded"):
        plain.mtp_draft(5, 1)


def backend_replies(d, speculation: Speculation, sampling: SamplingParams, prompt, seeds) -> list[tuple[int, ...]]:
    b = CudaBackend(d, context_max=1024, tokenizer=TagTokenizer(), speculation=speculation)
    replies = []
    for seed in seeds:
        params = SamplingParams(**{**sampling.to_dict(), "seed": seed})
        events = b.generate(GenerationRequest(prompt, params), threading.Event())
        replies.append(tuple(i for e in events if isinstance(e, TokenEvent) for i in e.ids))
    b.close()
    return replies


@pytest.mark.parametrize("setting", ["mtp:1", "mtp:2", "mtp:3", "mtp:4", "auto"])
def test_greedy_mtp_rounds_through_the_backend_give_the_plain_reply(tiny, setting):
    """256 tokens of greedy speculative decoding equal plain greedy decoding on the same engine
    paths' numbers (auto: rounds of either drafter and plain steps, as its policy picks); the MoE
    may legitimately part at a router near-tie (verify rows and the decode step round
    differently), so there the reply must agree for most of its length."""
    d, _engine, _ref, moe = tiny
    prompt = tuple(int(t) for t in np.random.default_rng(4).integers(0, REAL_VOCAB, 50))
    sampling = SamplingParams(**{**GREEDY.to_dict(), "max_tokens": 256})
    (plain,), (speculative,) = (backend_replies(d, s, sampling, prompt, [0])
                                for s in (Speculation("off"), parse_speculation(setting)))
    agree = next((i for i, (a, b) in enumerate(zip(plain, speculative)) if a != b), min(len(plain), len(speculative)))
    if moe:
        assert agree >= 64, f"the replies part at token {agree}"
    else:
        assert speculative == plain, f"the replies part at token {agree}"


def test_greedy_rounds_with_a_presence_penalty_give_the_plain_reply(tiny):
    """Verify rows draw with the engine's sampler, so the penalty of row i counts the rows before it."""
    d, _engine, _ref, moe = tiny
    if moe:
        pytest.skip("a router near-tie may part the MoE's replies (see the greedy test above)")
    prompt = tuple(int(t) for t in np.random.default_rng(5).integers(0, REAL_VOCAB, 30))
    sampling = SamplingParams(**{**GREEDY.to_dict(), "presence_penalty": 1.5, "max_tokens": 128})
    plain = backend_replies(d, Speculation("off"), sampling, prompt, [0])
    assert backend_replies(d, Speculation("mtp", 3), sampling, prompt, [0]) == plain


def test_sampled_rounds_draw_from_the_plain_distribution(tiny):
    """The first three tokens of 600 seeded replies (temperature 1, top-k 3), plain and with three
    MTP drafts a round, must come from one distribution: the total variation distance of two samples
    of 600 from one distribution over 27 outcomes is about 0.1; keeping drafts the target did not
    draw, or reusing a row's random number, moves it far past the bound."""
    from collections import Counter

    d, _engine, _ref, _moe = tiny
    prompt = tuple(int(t) for t in np.random.default_rng(6).integers(0, REAL_VOCAB, 20))
    sampling = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, max_tokens=3)
    plain = Counter(backend_replies(d, Speculation("off"), sampling, prompt, range(600)))
    spec = Counter(backend_replies(d, Speculation("mtp", 3), sampling, prompt, range(10_000, 10_600)))
    tv = 0.5 * sum(abs(plain[k] - spec[k]) for k in set(plain) | set(spec)) / 600
    assert tv < 0.2, f"total variation {tv:.3f} between plain and speculative replies"


def test_sampled_drafts_are_judged_only_as_the_chains_own(tiny):
    """With a temperature the chain draws its drafts from q and keeps q for one verify of exactly
    those drafts (mtp_drafts=True); other ids, or a second window, are refused before anything
    runs. Greedy settings take the flag as a no-op."""
    _d, engine, _ref, _moe = tiny
    prompt = [int(t) for t in np.random.default_rng(9).integers(0, REAL_VOCAB, 30)]
    first = start(engine, prompt)
    engine.set_sampling(1.0, 3, 1.0, 0.0, 0.0, 7)
    drafts = [int(t) for t in engine.mtp_draft(first, 3)]
    position = engine.position
    with pytest.raises(Exception, match="sampled drafts"):
        engine.verify(np.asarray([first, drafts[0], drafts[1] ^ 1, drafts[2]], np.int32), True)
    assert engine.position == position
    targets = engine.verify(np.asarray([first, *drafts], np.int32), True)
    engine.accept(1)
    with pytest.raises(Exception, match="sampled drafts"):  # q was used up by that window
        engine.verify(np.asarray([int(targets[0]), *drafts], np.int32), True)
    engine.set_sampling(0.0, 0, 1.0, 0.0, 0.0, 0)
    greedy = [int(t) for t in engine.mtp_draft(int(targets[0]), 2)]
    engine.verify(np.asarray([int(targets[0]), *greedy], np.int32), True)


def test_the_captured_chain_and_windows_equal_the_eager_launches(tiny, tmp_path):
    """Draft chains and verify windows as captured graphs (the default) against an engine that
    launches them eagerly, over rounds back to back: the same kernels, so the same numbers."""
    d, engine, _ref, _moe = tiny
    ck = Checkpoint.open(d)
    eager = _native.Engine(ck.config, engine_tensor_names(ck.config, mtp=True), context_max=1024,
                           prefill_chunk=CHUNK, snapshot_slots=2, verify_rows=5, speculative_graphs=False)
    load_weights(eager, ck)
    prompt = [int(t) for t in np.random.default_rng(8).integers(0, REAL_VOCAB, 25)]
    seen = {}
    for name, e in (("graph", engine), ("eager", eager)):
        fed, seen[name] = start(e, prompt), []
        for k in (3, 1, 3):
            drafts = [int(t) for t in e.mtp_draft(fed, k)]
            seen[name].append((drafts, np.asarray(e.logits())))
            targets = e.verify(np.asarray([fed, *drafts], np.int32))
            seen[name].append((list(targets), e.verify_logits()))
            e.accept(2)
            fed = int(targets[1])
    for (ids, got), (want_ids, want) in zip(seen["graph"], seen["eager"]):
        assert ids == want_ids
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
