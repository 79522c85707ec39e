"""Speculative decoding on the numpy reference: the algorithm the CUDA engine must reproduce.

A round drafts k tokens cheaply, then the target model runs the last accepted token and the k
drafts in one forward (k + 1 positions) and keeps the longest prefix of drafts it agrees with,
plus one token of its own, so every round emits between 1 and k + 1 tokens and the output is
distributed exactly as plain decoding's:

- greedy (temperature 0): draft i is kept while it equals the token plain greedy sampling
  (`sampling.sample`: argmax after the presence penalty) picks at its position; the emitted token
  after the kept drafts is that pick there. The output equals plain greedy decoding token for token.
- sampled: the standard rule (Leviathan et al. 2023; Chen et al. 2023): draft d_i, drawn from the
  drafter's distribution q_i, is kept with probability min(1, p_i(d_i) / q_i(d_i)); at the first
  rejection the emitted token is drawn from normalise(max(0, p_i - q_i)); if all k are kept, one
  more is drawn from p_k. p and q are the *filtered* distributions of `sampling.filtered_probs`
  (temperature, top-k, top-p, min-p, presence penalty with the tokens emitted so far), so the
  output has the distribution plain sampling with the same settings has.

Drafters: MTP drafts chain the checkpoint's MTP layer (each draft feeds the next step its own
hidden state), each chosen among the conversation's draft vocabulary (`draft_vocab`);
`prompt_lookup.ngram_drafts` looks the context's last n tokens up earlier in the context (prompt
lookup) and proposes what followed them there, for answers that quote a document.

`SpeculativeDecoder` is the one implementation of a round on a `ReferenceModel` (drafting,
verifying, accepting, rolling back; `rewind` undoes kept drafts a caller will not emit), with
either drafter or drafter "auto": each round's drafter and number of drafts chosen by a
`draft_policy.DraftPolicy` from the acceptance measured so far (a plain step where no choice is
expected to pay). `SpeculativeReference.generate` runs it over a prompt; the reference backend's
engine steps run it inside the chat's generation loop. Both count drafted and accepted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, NamedTuple, Sequence

import numpy as np

from lampo.models.draft_policy import DraftPolicy
from lampo.models.draft_vocab import DraftVocab
from lampo.models.prompt_lookup import ngram_drafts
from lampo.models.sampling import filtered_probs, sample
from lampo.models.sampling_params import SamplingParams

Drafter = Literal["mtp", "ngram", "auto"]


def accept_greedy(drafts: Sequence[int], target: Callable[[int], int]) -> tuple[int, int]:
    """(number of drafts kept, the token emitted after them) for greedy decoding; `target(i)` is the
    target's greedy pick at draft position i (i = k: the one after the drafts), asked for only as
    far as the drafts are kept."""
    for i, d in enumerate(drafts):
        pick = target(i)
        if pick != d:
            return i, pick
    return len(drafts), target(len(drafts))


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


class Round(NamedTuple):
    tokens: list[int]  # the drafts the target kept (fed to the model), then its own next token (not fed)
    drafted: int  # drafts verified (0: a plain step)


class SpeculativeDecoder:
    """Rounds of up to k drafts on a `ReferenceModel`; `rng` draws sampled drafts and tokens. With
    drafter "auto", `policy` (default: a DraftPolicy with k_max = k) picks each round's drafter
    and draft count; its mode decides whether MTP drafts are made at all (`uses_mtp`).

    State between calls: the trunk has run every token fed so far and `model.hiddens[-1]` is its
    last row; when `uses_mtp`, the MTP layer has a row for every trunk position but the last, whose
    next token (the one the next `advance` or `round` feeds) is not known yet."""

    def __init__(self, model, params: SamplingParams, k: int, drafter: Drafter, rng: np.random.Generator,
                 policy: DraftPolicy | None = None):
        if k < 1:
            raise ValueError(f"speculative decoding needs k >= 1 drafts, got {k}")
        if drafter == "mtp" and not model.has_mtp:
            raise ValueError("MTP drafts need a checkpoint with an MTP layer")
        self.model, self.params, self.k, self.drafter, self.rng = model, params, k, drafter, rng
        self.policy = (policy or DraftPolicy(k_max=k)) if drafter == "auto" else None
        self.stats = SpeculativeStats()
        self.uses_mtp = model.has_mtp and (drafter == "mtp"
                                           or (drafter == "auto" and self.policy.mode in ("auto", "mtp")))
        self._undo = None  # (state before the last round's verify, the ids that round fed)
        self._context_counts: DraftVocab | None = None  # the draft vocabulary's counts of ...
        self._counted = 0  # ... the first `_counted` ids of the contexts rounds are given

    def forget_context(self) -> None:
        """Count the next round's context afresh (a new conversation on a reset model)."""
        self._context_counts = None

    def advance(self, ids: Sequence[int]) -> None:
        """Run `ids` (prompt tokens) through the trunk in one call, and the MTP rows they complete;
        the last row's logits are `model.logits(model.hidden_last)`."""
        model = self.model
        held = model.hiddens[-1:]  # the previous last row (none at position 0): its next id is ids[0]
        start = model.position - len(held)
        model.advance(ids)
        if self.uses_mtp:
            rows = np.concatenate([held, model.hiddens[:-1]])
            if len(rows):
                model.mtp_advance(rows, list(ids)[len(ids) - len(rows):], start)

    def round(self, context: Sequence[int], reply: Sequence[int], max_drafts: int | None = None) -> Round:
        """Feed context[-1] (sampled, not fed yet) and up to min(k, max_drafts) drafts in one verify
        forward. `reply`: the reply's ids so far, context[-1] included when it is one (presence
        penalty)."""
        model, token, reply = self.model, context[-1], list(reply)
        cap = self.k if max_drafts is None else min(self.k, max_drafts)
        mtp_ready = self._mtp_row(token)
        ngram = ngram_drafts(context, cap) if self.drafter in ("ngram", "auto") else []  # one lookup a round
        drafter, k = self._choose(len(ngram), mtp_ready, cap)
        snap = model.snapshot() if drafter else None  # before the MTP draft chain writes its rows
        drafts, q = self._drafts(drafter, k, ngram, reply, context) if drafter else ([], None)
        model.advance([token, *drafts])
        kept, nxt = self._accept(drafts, q, reply)
        self.stats.record(len(drafts), kept)
        if self.policy is not None and drafts:
            self.policy.record(drafter, len(drafts), kept)
        fed = [token, *drafts[:kept]]
        self._undo = (snap, fed)
        if kept < len(drafts):  # the GDN states cannot drop rows: back to before the verify, run what was kept
            model.restore(snap)
            model.advance(fed)
        self._mtp_rows(fed[1:])
        return Round([*drafts[:kept], nxt], len(drafts))

    def rewind(self, n: int) -> None:
        """Drop the last `n` drafts the last round kept from the state (a caller that stops before
        emitting them): as if that round had kept n fewer."""
        snap, fed = self._undo
        if not 0 < n < len(fed):
            raise ValueError(f"rewind: the last round kept {len(fed) - 1} drafts, cannot drop {n}")
        fed = fed[:-n]
        self.model.restore(snap)
        self.model.advance(fed)
        self._mtp_rows(fed[1:])
        self._undo = (snap, fed)

    # ---- internals ----------------------------------------------------------------------------
    def _mtp_row(self, token: int) -> bool:
        """Run the MTP row of the last trunk row and `token`, whose output (`model.mtp_hidden_last`)
        gives the first MTP draft; False when there is none (no MTP drafts, or nothing ran yet)."""
        model = self.model
        if not self.uses_mtp or not len(model.hiddens):
            return False
        model.mtp_advance(model.hiddens[-1:], [token], model.position - 1)
        return True

    def _mtp_rows(self, next_ids: list[int]) -> None:
        """After the trunk ran a round's fed ids: MTP rows for all its rows but the last (the first
        one's row was `_mtp_row`'s), replacing any rows the draft chain wrote there."""
        model = self.model
        if self.uses_mtp and next_ids:
            model.mtp_advance(model.hiddens[:-1], next_ids, model.position - len(model.hiddens))

    def _choose(self, ngram_available: int, mtp_ready: bool, cap: int) -> tuple[str | None, int]:
        """The round's drafter and number of drafts (None, 0: a plain step); `ngram_available`: how
        many n-gram drafts the context offers (at most `cap`)."""
        if self.policy is None:
            return (None, 0) if self.drafter == "mtp" and not mtp_ready else (self.drafter, cap)
        available = {"ngram": ngram_available, "mtp": cap if mtp_ready else 0}
        return self.policy.choose(available)

    def _drafts(self, drafter: str, k: int, ngram: list[int], reply: list[int],
                context: Sequence[int]) -> tuple[list[int], np.ndarray | None]:
        """The round's drafts (`ngram`: the context's n-gram drafts; MTP drafts start from the row
        `_mtp_row` ran, each chosen among the draft vocabulary of `context`) and, when sampling with
        drafts, the distributions q they were drawn from (None otherwise: neither greedy acceptance
        nor an empty draft reads q)."""
        greedy = self.params.greedy
        if drafter == "ngram":
            drafts = ngram[:k]
            if greedy:
                return drafts, None
            q = np.zeros((len(drafts), self.model.cfg.vocab_size))  # a deterministic drafter: one-hot
            q[np.arange(len(drafts)), drafts] = 1.0
            return drafts, q
        vocab = self._draft_vocab(context)

        def draft_logits(row: np.ndarray) -> np.ndarray:
            logits = self.model.logits(row)
            if vocab:
                logits[vocab:] = -np.inf
            return logits

        drafts, qs, logits = [], [], draft_logits(self.model.mtp_hidden_last)
        position = self.model.position  # the MTP row after `_mtp_row`'s
        for i in range(k):
            if greedy:
                drafts.append(int(np.argmax(logits)))
            else:
                qs.append(filtered_probs(logits, self.params, seen_ids=reply))  # as the engine's sample_draft
                drafts.append(_draw(qs[-1], self.rng))
            if i + 1 < k:  # chain: the MTP's own hidden row and the draft it just made
                self.model.mtp_advance(self.model.mtp_hidden_last[None], [drafts[-1]], position + i)
                logits = draft_logits(self.model.mtp_hidden_last)
        return drafts, (np.stack(qs) if qs else None)

    def _draft_vocab(self, context: Sequence[int]) -> int:
        """`DraftVocab(context).size`, counting only the ids added since the last call: a round's
        context extends the previous one's (its kept drafts and next token, fewer after a rewind);
        a shorter one, or the first, is counted whole."""
        if self._context_counts is None or len(context) < self._counted:
            self._context_counts, self._counted = DraftVocab(self.model.cfg.real_vocab_size), 0
        self._context_counts.add(context[self._counted:])
        self._counted = len(context)
        return self._context_counts.size

    def _accept(self, drafts: list[int], q: np.ndarray | None, reply: list[int]) -> tuple[int, int]:
        """(drafts kept, the token after them) from the verify forward's rows (`model.hiddens`, k + 1);
        greedy computes the logits of a row only when the drafts before it were kept."""
        model, params, rows = self.model, self.params, self.model.hiddens
        if params.greedy:
            return accept_greedy(drafts, lambda i: sample(model.logits(rows[i]), params, self.rng, reply + drafts[:i]))
        p = np.stack([filtered_probs(model.logits(rows[i]), params, seen_ids=reply + drafts[:i])
                      for i in range(len(drafts) + 1)])
        return accept_sampled(drafts, q, p, self.rng)


class SpeculativeReference:
    """Generation on a `ReferenceModel` with up to k drafts per round (`SpeculativeDecoder`'s rounds
    from the prompt's last token on)."""

    def __init__(self, model, params: SamplingParams, k: int, drafter: Drafter, seed: int = 0,
                 policy: DraftPolicy | None = None):
        self.model = model
        self.decoder = SpeculativeDecoder(model, params, k, drafter, np.random.default_rng(seed), policy)

    @property
    def stats(self) -> SpeculativeStats:
        return self.decoder.stats

    @property
    def policy(self) -> DraftPolicy | None:
        return self.decoder.policy

    def generate(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        prompt = list(prompt)
        self.model.reset()
        self.decoder.forget_context()
        if len(prompt) > 1:
            self.decoder.advance(prompt[:-1])
        out: list[int] = []
        while len(out) < max_tokens:
            out += self.decoder.round(prompt + out, out).tokens
        return out[:max_tokens]
