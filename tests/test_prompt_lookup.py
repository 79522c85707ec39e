"""Prompt-lookup drafts (models/prompt_lookup.py): the vectorised lookup against a plain scan."""

from __future__ import annotations

import numpy as np
import pytest
from lampo.models.prompt_lookup import NGRAM_MAX, NGRAM_MIN, PromptLookup, ngram_drafts


def scanned_drafts(context: list[int], k: int) -> list[int]:
    """The definition, by brute force: for n from NGRAM_MAX down, the latest start of an earlier
    copy of the last n ids that leaves at least one id after it; the ids that follow it."""
    for n in range(min(NGRAM_MAX, len(context) - 1), NGRAM_MIN - 1, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == suffix:
                return context[start + n:start + n + k]
    return []


def test_drafts_quote_the_context():
    ctx = [1, 2, 3, 4, 5, 6, 9, 9, 2, 3, 4]
    assert ngram_drafts(ctx, 2) == [5, 6]  # "2 3 4" was followed by 5 6
    assert ngram_drafts([1, 2, 3, 7, 2, 3], 4) == [7, 2, 3]  # the run stops at the context's end
    assert ngram_drafts([1, 2, 3, 4], 3) == []
    assert ngram_drafts([5, 5, 5], 2) == [5]  # an occurrence overlapping the suffix counts
    assert ngram_drafts([7, 1, 2, 9, 1, 2, 8, 3, 1, 2], 1) == [8]  # the most recent of two
    assert ngram_drafts([1, 2, 3, 4, 0, 0, 2, 3, 4, 9, 3, 4], 3) == [9, 3, 4]  # "3 4": no longer match
    assert ngram_drafts([1, 2], 4) == [] and ngram_drafts([], 4) == [] and ngram_drafts([1, 2, 1, 2], 0) == []


@pytest.mark.parametrize("alphabet", [2, 3, 5, 40])
def test_drafts_equal_the_scan_on_random_contexts(alphabet):
    rng = np.random.default_rng(alphabet)
    for _ in range(300):
        ctx = [int(t) for t in rng.integers(0, alphabet, rng.integers(0, 40))]
        for k in (1, 3, 4):
            assert ngram_drafts(ctx, k) == scanned_drafts(ctx, k), (ctx, k)


def test_a_held_lookup_follows_a_growing_and_rewound_context():
    rng = np.random.default_rng(7)
    lookup, ctx = PromptLookup(), []
    for _ in range(2000):  # past the first buffer's 1,024 ids, and back
        if ctx and rng.random() < 0.3:
            n = int(rng.integers(1, min(len(ctx), 5) + 1))
            lookup.drop(n)
            del ctx[-n:]
        else:
            new = [int(t) for t in rng.integers(0, 6, rng.integers(1, 5))]
            lookup.extend(new)
            ctx += new
        assert len(lookup) == len(ctx) and lookup.ids.tolist() == ctx
        assert lookup.drafts(4) == scanned_drafts(ctx, 4)


def test_large_ids_and_bad_input():
    big = 248_319
    assert ngram_drafts([big, 2, big - 1, big, 2], 2) == [big - 1, big]
    lookup = PromptLookup([1, 2, 3])
    with pytest.raises(ValueError, match="token ids"):
        lookup.extend([-1])
    with pytest.raises(ValueError, match="drop 4 ids of a context of 3"):
        lookup.drop(4)
    assert lookup.ids.tolist() == [1, 2, 3]  # nothing taken in or out by the refused calls
    with pytest.raises(ValueError):
        lookup.ids[0] = 5  # the view is read-only
