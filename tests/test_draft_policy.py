"""The draft policy (models/draft_policy.py): drafts where they are expected to pay, more of them
as acceptance grows, none where a plain step is faster (with a probe now and then), and the
forced settings obeyed."""

from __future__ import annotations

import pytest

from lampo.models.draft_policy import PLAIN_EVERY, PRIOR, PROBE_EVERY, PROBE_EVERY_MAX, DraftPolicy

BOTH = {"mtp": 4, "ngram": 4}


def test_expected_tokens_follow_the_conditional_acceptance():
    p = DraftPolicy(k_max=3)
    p.accept["mtp"] = [0.8, 0.5, 0.5]
    assert p.expected_tokens("mtp", 0) == 1.0
    assert p.expected_tokens("mtp", 3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    assert p.speedup("mtp", 2) == pytest.approx(2.2 / (1 + 2 * (0.1 + 0.05)))


def test_a_new_policy_drafts_on_its_prior():
    p = DraftPolicy()
    assert p.accept["mtp"] == [PRIOR] * 4
    drafter, k = p.choose(BOTH)
    assert drafter == "ngram" and k >= 1  # free drafts at the same prior acceptance


def test_good_acceptance_draws_more_drafts_and_bad_turns_speculation_off():
    p = DraftPolicy()
    for _ in range(60):
        p.record("mtp", 4, 4)
        p.record("ngram", 4, 0)
    assert p.choose(BOTH) == ("mtp", 4)
    for _ in range(60):
        p.record("mtp", 4, 0)
    choices = [p.choose(BOTH) for _ in range(PROBE_EVERY)]
    assert choices[:-1] == [(None, 0)] * (PROBE_EVERY - 1) and choices[-1][1] == 1  # the probe


def test_probes_that_keep_nothing_come_ever_later_and_a_kept_draft_brings_them_back():
    p = DraftPolicy()
    for _ in range(60):
        p.record("mtp", 4, 0)

    def steps_to_probe() -> int:
        for n in range(1, PROBE_EVERY_MAX + 1):
            drafter, k = p.choose({"mtp": 4})
            if drafter:
                return n
        raise AssertionError("no probe")

    waits = []
    for _ in range(6):
        waits.append(steps_to_probe())
        p.record("mtp", 1, 0)  # the probe keeps nothing
    assert waits == [PROBE_EVERY, 2 * PROBE_EVERY, 4 * PROBE_EVERY, 8 * PROBE_EVERY, PROBE_EVERY_MAX,
                     PROBE_EVERY_MAX]
    steps_to_probe()
    p.record("mtp", 1, 1)  # kept: probes come as often as at first
    assert steps_to_probe() == PROBE_EVERY


def test_an_expensive_verify_step_turns_speculation_off():
    p = DraftPolicy(verify_cost=0.6)  # e.g. an MoE at long context, whose verify loads many experts
    assert p.choose({"mtp": 4}) == (None, 0)
    assert DraftPolicy(verify_cost=0.02).choose({"mtp": 4})[0] == "mtp"


def test_ngram_drafts_only_as_far_as_the_context_repeats():
    p = DraftPolicy()
    for _ in range(60):
        p.record("ngram", 4, 4)
    assert p.choose({"mtp": 4, "ngram": 2}) == ("ngram", 2)
    assert p.choose({"mtp": 4, "ngram": 0})[0] == "mtp"
    assert p.choose({}) == (None, 0)


def test_forced_settings():
    assert DraftPolicy(mode="off").choose(BOTH) == (None, 0)
    assert DraftPolicy(mode="mtp").choose(BOTH)[0] == "mtp"
    assert DraftPolicy(mode="ngram").choose({"mtp": 4}) == (None, 0)
    p = DraftPolicy(fixed_k=3)
    for _ in range(60):
        p.record("mtp", 3, 0)
        p.record("ngram", 3, 0)
    assert p.choose(BOTH)[1] == 3  # forced on, whatever it measures
    assert p.choose({"ngram": 2}) == ("ngram", 2)


def test_record_counts_only_the_positions_the_round_reached():
    p = DraftPolicy()
    p.record("mtp", 4, 1)  # position 1 kept, 2 rejected, 3 and 4 never judged
    assert p.accept["mtp"][0] > PRIOR > p.accept["mtp"][1]
    assert p.accept["mtp"][2:] == [PRIOR, PRIOR]


def test_bad_settings():
    with pytest.raises(ValueError, match="one of auto, off, mtp, ngram"):
        DraftPolicy(mode="always")
    with pytest.raises(ValueError, match="fixed k"):
        DraftPolicy(k_max=4, fixed_k=5)


def test_measured_step_times_replace_the_cost_model():
    p = DraftPolicy()
    for _ in range(60):
        p.record("mtp", 4, 4)  # every draft kept: E(k) = k + 1
    assert p.cost("mtp", 2) == pytest.approx(1 + 2 * (0.1 + 0.05))  # nothing measured: the model
    for drafter, k in ((None, 0), ("mtp", 1), ("mtp", 2), ("mtp", 3), ("mtp", 4)):
        p.record_time(drafter, k, 1.0)  # the first of each kind is a warm-up, not counted
    assert not p.seconds
    p.record_time(None, 0, 0.010)
    p.record_time("mtp", 4, 0.060)  # 6 plain steps for 5 tokens: slower than plain
    p.record_time("mtp", 2, 0.020)  # 2 plain steps for 3 tokens
    assert p.cost("mtp", 4) == pytest.approx(6.0) and p.cost("mtp", 2) == pytest.approx(2.0)
    assert p.choose({"mtp": 4}) == ("mtp", 3)  # unmeasured k = 3 still on the model: 4 / 1.45
    p.record_time("mtp", 3, 0.050)
    p.record_time("mtp", 1, 0.016)
    assert p.choose({"mtp": 4}) == ("mtp", 2)  # the most tokens per second as measured: 3 / 2
    for k in (1, 2, 3):
        p.record_time("mtp", k, 0.100)
    for _ in range(30):  # the newest times weigh most: now every round is slower than plain
        for k in (1, 2, 3):
            p.record_time("mtp", k, 0.100)
    assert p.choose({"mtp": 4}) == (None, 0)  # speculation off by itself


def test_a_plain_step_keeps_the_measured_plain_time_current():
    p = DraftPolicy()
    for _ in range(60):
        p.record("ngram", 4, 4)
    for _ in range(2):  # the first of each kind is a warm-up
        p.record_time(None, 0, 0.010)
        p.record_time("ngram", 4, 0.012)
    choices = [p.choose({"ngram": 4}) for _ in range(PLAIN_EVERY + 1)]
    assert choices[:-1] == [("ngram", 4)] * PLAIN_EVERY and choices[-1] == (None, 0)
    assert DraftPolicy(fixed_k=2).choose({"ngram": 4}) == ("ngram", 2)  # a forced count is never skipped
