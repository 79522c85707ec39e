"""Speculative decoding on the numpy reference: the algorithm the CUDA engine must reproduce.

A step drafts k tokens cheaply, then the target model runs the last accepted token and the k
drafts in one forward (k + 1 positions) and keeps the longest prefix of drafts it agrees with,
plus one token of its own, so every step emits between 1 and k + 1 tokens and the output is
distributed exactly as plain decoding's:

- greedy (temperature 0): draft i is kept while it equals the target's argmax at its position;
  the emitted token after the kept drafts is the target's argmax there. The output equals plain
  greedy decoding token for token.
- sampled: the standard rule (Leviathan et al. 2023; Chen et al. 2023): draft d_i, drawn from the
  drafter's distribution q_i, is kept with probability min(1, p_i(d_i) / q_i(d_i)); at the first
  rejection the emitted token is drawn from normalise(max(0, p_i - q_i)); if all k are kept, one
  more is drawn from p_k. p and q are the *filtered* distributions of `sampling.filtered_probs`
  (temperature, top-k, top-p, min-p, presence penalty with the tokens emitted so far), so the
  output has the distribution plain sampling with the same settings has.

Drafters: `mtp_drafts` chains the checkpoint's MTP layer (each draft feeds the next step its own
hidden state); `ngram_drafts` looks the context's last n tokens up earlier in the context (prompt
lookup) and proposes what followed them there, for answers that quote a document.
`SpeculativeReference` runs generation on a `ReferenceModel` with either drafter, or with
drafter "auto": each step's drafter and number of drafts chosen by a `draft_policy.DraftPolicy`
from the acceptance measured so far (a plain step where no choice is expected to pay), and counts
the drafted and accepted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np

from lampo.models.draft_policy import DraftPolicy
from lampo.models.sampling import filtered_probs
from lampo.models.sampling_params import SamplingParams

Drafter = Literal["mtp", "ngram", "auto"]
NGRAM_MAX, NGRAM_MIN = 4, 2  # the longest and shortest context suffix looked up


def accept_greedy(drafts: Sequence[int], target_logits: np.ndarray) -> tuple[int, int]:
    """(number of drafts kept, the token emitted after them) for greedy decoding; target_logits
    [k + 1, V] are the target's logits at the drafts' positions and the one after."""
    targets = np.argmax(target_logits, axis=-1)
    kept = 0
    while kept < len(drafts) and drafts[kept] == targets[kept]:
        kept += 1
    return kept, int(targets[kept])


def accept_sampled(drafts: Sequence[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """(number of drafts kept, the token emitted after them) by the speculative sampling rule;
    q [k, V] the drafter's distributions the drafts were drawn from, p [k + 1, V] the target's."""
    for i, d in enumerate(drafts):
        if rng.random() * q[i, d] < p[i, d]:  # u < p / q without dividing by a zero q
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        return i, _draw(residual / total if total > 0 else p[i], rng)
    return len(drafts), _draw(p[len(drafts)], rng)


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse CDF over the ids in ascending order (as `sampling.sample` draws)."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(probs) - 1))


def ngram_drafts(context: Sequence[int], k: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the context's last n
    tokens (n from NGRAM_MAX down to NGRAM_MIN); [] when no suffix occurs earlier."""
    ctx = list(context)
    for n in range(min(NGRAM_MAX, len(ctx) - 1), NGRAM_MIN - 1, -1):
        suffix = ctx[-n:]
        for start in range(len(ctx) - n - 1, -1, -1):
            if ctx[start:start + n] == suffix:
                return ctx[start + n:start + n + k]
    return []


@dataclass
class SpeculativeStats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # per draft position: how often it was kept

    def record(self, drafted: int, kept: int) -> None:
        self.steps += 1
        self.drafted += drafted
        self.accepted += kept
        while len(self.accepted_at) < drafted:
            self.accepted_at.append(0)
        for i in range(kept):
            self.accepted_at[i] += 1


class SpeculativeReference:
    """Generation on a `ReferenceModel` with up to k drafts per step. Between steps the trunk has
    run the context but its last token, and (when MTP drafts may be used) the MTP layer has a row
    for every trunk position, the last one's logits being the next step's first draft (`_first`).
    With drafter "auto", `policy` (default: a DraftPolicy with k_max = k) picks each step's drafter
    and draft count."""

    def __init__(self, model, params: SamplingParams, k: int, drafter: Drafter, seed: int = 0,
                 policy: DraftPolicy | None = None):
        if k < 1:
            raise ValueError(f"speculative decoding needs k >= 1 drafts, got {k}")
        if drafter == "mtp" and not model.has_mtp:
            raise ValueError("MTP drafts need a checkpoint with an MTP layer")
        self.model, self.params, self.k, self.drafter = model, params, k, drafter
        self.policy = (policy or DraftPolicy(k_max=k)) if drafter == "auto" else None
        self.rng = np.random.default_rng(seed)
        self.stats = SpeculativeStats()
        self._first: np.ndarray | None = None
        self._uses_mtp = drafter == "mtp" or (drafter == "auto" and model.has_mtp)

    def generate(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        model, prompt = self.model, list(prompt)
        model.reset()
        self._first = None
        if len(prompt) > 1:
            model.prefill(prompt[:-1])
            if self._uses_mtp:
                self._first = model.mtp_prefill(model.hiddens, prompt[1:], 0, last_only=True)
        out: list[int] = []
        while len(out) < max_tokens:
            out += self._step(prompt + out, out)
        return out[:max_tokens]

    def _step(self, context: list[int], out: list[int]) -> list[int]:
        model = self.model
        snap, start = model.snapshot(), model.position  # `start`: the position of context[-1]
        ngram = ngram_drafts(context, self.k) if self.drafter in ("ngram", "auto") else []  # one lookup a step
        drafter, k = self._choose(len(ngram))
        drafts, q = self._drafts(drafter, k, ngram, out) if drafter else ([], None)
        logits = model.prefill([context[-1], *drafts])  # k + 1 positions in one forward
        if self.params.temperature == 0:
            kept, nxt = accept_greedy(drafts, logits)
        else:
            p = np.stack([filtered_probs(logits[i], self.params, seen_ids=out + drafts[:i])
                          for i in range(len(drafts) + 1)])
            kept, nxt = accept_sampled(drafts, q, p, self.rng)
        self.stats.record(len(drafts), kept)
        if self.policy is not None and drafts:
            self.policy.record(drafter, len(drafts), kept)
        model.restore(snap)  # back to before the step (the MTP's draft rows too); run what was kept
        model.prefill([context[-1], *drafts[:kept]])
        if self._uses_mtp:
            self._first = model.mtp_prefill(model.hiddens, [*drafts[:kept], nxt], start, last_only=True)
        return [*drafts[:kept], nxt]

    def _choose(self, ngram_available: int) -> tuple[str | None, int]:
        """The step's drafter and number of drafts (None, 0: a plain step); `ngram_available`: how
        many n-gram drafts the context offers."""
        if self.policy is None:
            return self.drafter, self.k
        available = {"ngram": ngram_available, "mtp": self.k if self._uses_mtp and self._first is not None else 0}
        return self.policy.choose(available)

    def _drafts(self, drafter: str, k: int, ngram: list[int], out: list[int]) -> tuple[list[int], np.ndarray | None]:
        """The step's drafts (`ngram`: the context's n-gram drafts, up to self.k) and, when sampling
        with drafts, the distributions q they were drawn from (None otherwise: neither greedy
        acceptance nor an empty draft reads q)."""
        greedy = self.params.temperature == 0
        if drafter == "ngram":
            drafts = ngram[:k]
            if greedy:
                return drafts, None
            q = np.zeros((len(drafts), self.model.cfg.vocab_size))  # a deterministic drafter: one-hot
            q[np.arange(len(drafts)), drafts] = 1.0
            return drafts, q
        if self._first is None:  # a one-token prompt: nothing ran yet to draft from
            return [], None
        drafts, qs, logits = [], [], self._first
        position = self.model.position  # the MTP row after the one that gave `_first`
        for i in range(k):
            if greedy:
                drafts.append(int(np.argmax(logits)))
            else:
                qs.append(filtered_probs(logits, self.params, seen_ids=out + drafts))
                drafts.append(_draw(qs[-1], self.rng))
            if i + 1 < k:  # chain: the MTP's own hidden row and the draft it just made
                logits = self.model.mtp_step(self.model.mtp_hidden_last, drafts[-1], position + i)
        return drafts, (np.stack(qs) if qs else None)
