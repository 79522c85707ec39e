"""Speculative decode steps on the CUDA engine: rounds of MTP or n-gram drafts.

`NativeSpeculativeSteps` is `NativeSteps` whose decode step drafts: "ngram" looks the prompt and
the reply so far up for a repeat of their last tokens (`models.prompt_lookup.PromptLookup`, held
across the rounds, so a lookup costs no copy of the context), "mtp"
chains the engine's MTP layer from the fed token (`Engine.mtp_draft`, its greedy continuation
among the conversation's draft vocabulary, `models.draft_vocab`),
"auto" offers both (MTP where the engine holds the module) and lets each round take one. A
`DraftPolicy` (the measured acceptance per drafter and draft position, and the measured step
times) chooses the drafter and how many drafts to try; the step runs the fed token and those
drafts as one verify window (`Engine.verify`: each row's token drawn by the engine's sampler with
the request's settings) and keeps the drafts up to the first that differs from its row's token,
plus that row's token (`Engine.accept`). N-gram drafts are deterministic given the context, so
for them this is speculative sampling with one-hot draft distributions: a draft is kept with the
probability its row gives it, and where it is not, the row's token is a draw from the row's
distribution without the draft. MTP drafts of a sampled reply are drawn from the MTP layer's own
filtered distribution q, and the verify rows judge them by it (`verify(..., mtp_drafts=True)`:
kept with probability min(1, p / q), else a draw from max(0, p - q)). Either way every reply -
greedy or sampled, with or without a presence penalty - follows the plain decoding's distribution
exactly (greedy: token for token).
With no drafts worth trying the step is a plain decode step. `rewind` takes kept drafts back
(accept with a smaller keep). The engine must have been made with verify rows for at least
`k_max + 1` tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from lampo.engine.loop import Decoded
from lampo.models.draft_policy import DRAFTERS, DraftPolicy
from lampo.models.draft_vocab import DraftVocab
from lampo.models.prompt_lookup import PromptLookup
from lampo.models.speculative import accept_greedy


def round_policy(mode: str, k_max: int, fixed_k: int | None) -> DraftPolicy:
    """The policy of a backend's rounds (kept across its requests: the acceptance and the step
    times it measured carry over); `mode`: a drafter, or "auto" for either."""
    if mode not in ("auto", *DRAFTERS):
        raise ValueError(f"speculation {mode!r}: one of auto, {', '.join(DRAFTERS)}")
    return DraftPolicy(k_max=k_max, mode=mode, fixed_k=fixed_k)


class NativeSpeculativeSteps:
    """Wraps a `NativeSteps` (`plain`), replacing its decode step by verify rounds of the drafters
    `policy.mode` allows (MTP only where the engine holds the module). Each step's wall time goes
    to the policy (`DraftPolicy.record_time`): a plain step from its submit to its collect (the GPU
    runs it while the loop streams the previous token), a round as its drafting, verify and accept
    calls."""

    def __init__(self, plain, engine, prompt: Sequence[int], policy: DraftPolicy, clock=time.perf_counter):
        self._plain, self._engine, self._policy, self._clock = plain, engine, policy, clock
        self._mtp = policy.mode in ("auto", "mtp") and engine.has_mtp
        self._ngram = policy.mode in ("auto", "ngram")
        self._context = PromptLookup(prompt)  # the prompt, then every token fed or kept
        self._vocab = DraftVocab(engine.real_vocab_size, self._context.ids) if self._mtp else None
        self._round: tuple[str, int, list[int]] | None = None  # (drafter, fed, drafts) of the submitted round
        self._started = 0.0  # when the submitted step began
        self._draft_s = 0.0  # the submitted round's drafting time
        self._kept = 0  # drafts the last round kept and that are still in the state

    def __getattr__(self, name):  # the protocol's other steps (begin, prefill, snapshot...) are the plain ones
        return getattr(self._plain, name)

    def decode_submit(self, fed: int, max_drafts: int) -> None:
        self._grow([fed])
        cap = min(self._policy.k_max, max_drafts)
        self._started = self._clock()
        ngram = self._context.drafts(cap) if self._ngram and cap > 0 else []
        drafter, k = self._policy.choose({"ngram": len(ngram), "mtp": cap if self._mtp else 0})
        if drafter is None:
            self._round = None
            self._plain.decode_submit(fed, 0)
            return
        if drafter == "mtp" and self._engine.draft_vocab != self._vocab.size:
            self._engine.draft_vocab = self._vocab.size
        drafts = [int(t) for t in self._engine.mtp_draft(fed, k)] if drafter == "mtp" else ngram[:k]
        self._round = (drafter, fed, drafts)
        self._draft_s = self._clock() - self._started

    def decode_collect(self) -> Decoded:
        if self._round is None:
            self._kept = 0
            step = self._plain.decode_collect()
            self._policy.record_time(None, 0, self._clock() - self._started)
            return step
        drafter, fed, drafts = self._round
        started = self._clock()
        targets = self._engine.verify(np.asarray([fed, *drafts], np.int32), drafter == "mtp")
        kept, nxt = accept_greedy(drafts, lambda i: int(targets[i]))
        self._engine.accept(kept + 1)
        self._policy.record_time(drafter, len(drafts), self._draft_s + self._clock() - started)
        self._policy.record(drafter, len(drafts), kept)
        self._kept = kept
        self._grow(drafts[:kept])
        return Decoded((*drafts[:kept], nxt), len(drafts))

    def _grow(self, ids: list[int]) -> None:
        self._context.extend(ids)
        if self._vocab:
            self._vocab.add(ids)

    def rewind(self, n: int) -> None:
        if not 0 < n <= self._kept:
            raise ValueError(f"rewind: the last step kept {self._kept} drafts, cannot take back {n}")
        self._kept -= n
        self._engine.accept(self._kept + 1)
        if self._vocab:
            self._vocab.remove(self._context.ids[-n:])
        self._context.drop(n)
