"""`lampo bench --speculate-accept A,A [--draft-k K,K]`: speculative decoding at a set acceptance.

At each decode depth, after the plain decode measurement, and for each draft count k:
- the verify cost: one window of k + 1 tokens (the fed token and k drafts) through `verify` and
  `accept`, timed from the host (median of VERIFY_REPEATS, the state restored after each), against
  the plain decode step of that depth;
- with --mtp, the draft cost: the MTP layer's chain of k drafts from the fed token (`mtp_draft`),
  timed the same way; the rounds below then run it too (its drafts are not used), so their time is
  that of MTP rounds at that acceptance. With --draft-vocab N the drafts are chosen among ids
  [0, N) (the LM head's first N rows) and the chain is timed over every id too;
- for each acceptance a, rounds whose k drafts are the target's own greedy tokens, each replaced
  by another token with probability 1 - a, until `decode_tokens` tokens are emitted: the time of a
  round, the acceptance measured (the share of the judged drafts that were kept: a round judges its
  drafts up to the first rejected one; a verify row's greedy pick can differ from a plain step's at
  a near-tie of the logits, which lowers it) and the tokens per round measured. The tok/s and the
  speedup over plain decoding are those at the set acceptance: the tokens a round emits on average
  when each draft is right with probability a, 1 + a + ... + a^k, over the measured time of a
  round (which does not depend on how many drafts it keeps: the window always runs k + 1 rows).
  A few dozen rounds draw the acceptance too coarsely to be the rate itself (a = 0.8 was measured
  0.73-0.86 for k = 1..4 with the bench's seed), so the measured rate's tok/s is given beside it.
The greedy tokens come from plain decode steps run ahead of the rounds (untimed, the state put
back from a snapshot); where a round's own token differs from them they are run again from there.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np

from lampo.models.speculative import accept_greedy

VERIFY_REPEATS = 8
BASE_SLOT, AHEAD_SLOT = 0, 1  # snapshot slots: the depth's state, the state before running ahead
SLOTS = 2


def accept_rates(text: str) -> list[float]:
    """--speculate-accept: comma-separated acceptance rates in (0, 1]."""
    try:
        rates = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates, got {text!r}") from None
    if not rates or any(not 0.0 < a <= 1.0 for a in rates):
        raise argparse.ArgumentTypeError(f"acceptance rates must be in (0, 1], got {text!r}")
    return rates


@dataclass(frozen=True)
class SpecWorkload:
    accepts: list[float]
    ks: list[int]
    mtp: bool = False  # the engine loads the MTP module and the rounds draft with it
    draft_vocab: int = 0  # MTP drafts among ids [0, draft_vocab) (0: every id)

    @property
    def rows(self) -> int:
        """Verify window rows the engine must keep."""
        return max(self.ks) + 1

    def room(self, decode_tokens: int) -> int:
        """Positions past a depth the measurement may use (rounds and greedy tokens run ahead)."""
        return decode_tokens + 2 * self.rows


def greedy_ahead(target, m: int) -> list[int]:
    """The next m tokens plain greedy decoding emits from the target's state (untimed; the state
    and the token to feed are put back)."""
    target.snapshot(AHEAD_SLOT)
    out = []
    for _ in range(m):
        target.decode(1)
        out.append(target.next_token)
    target.restore(AHEAD_SLOT)
    return out


def other_token(token: int, vocab: int, rng: np.random.Generator) -> int:
    t = int(rng.integers(0, vocab - 1))
    return t + 1 if t >= token else t


def rounds_at(target, k: int, a: float, n: int, rng: np.random.Generator, mtp: bool) -> dict:
    """Speculative rounds of k drafts at acceptance a from the target's state until n tokens (with
    `mtp`, each round also runs the MTP draft chain)."""
    vocab = target.cfg.real_vocab_size
    ahead, i = [], 0  # greedy tokens from the round's start; ahead[i] follows the token to feed
    emitted = judged = kept_total = rounds = 0
    seconds = 0.0
    while emitted < n:
        if len(ahead) - i < k + 1:
            ahead, i = greedy_ahead(target, n - emitted + k + 1), 0
        want = ahead[i:i + k]
        drafts = [t if rng.random() < a else other_token(t, vocab, rng) for t in want]
        t0 = time.perf_counter()
        if mtp:
            target.draft(k)
        own = target.verify([target.next_token, *drafts])
        kept, nxt = accept_greedy(drafts, own.__getitem__)
        target.accept(kept + 1, nxt)
        seconds += time.perf_counter() - t0
        emitted, kept_total, rounds = emitted + kept + 1, kept_total + kept, rounds + 1
        judged += kept + (kept < k)
        if [*drafts[:kept], nxt] == ahead[i:i + kept + 1]:
            i += kept + 1
        else:  # the round's own token is not the plain step's: the greedy tokens from here again
            ahead, i = [], 0
    per_round = expected_tokens_per_round(a, k)
    return {"a": a, "tokens": emitted, "rounds": rounds, "seconds": seconds, "ms_per_round": 1000.0 * seconds / rounds,
            "acceptance": kept_total / judged, "tokens_per_round": emitted / rounds,
            "tokens_per_second_measured": emitted / seconds,
            "expected_tokens_per_round": per_round, "tokens_per_second": per_round * rounds / seconds}


def expected_tokens_per_round(a: float, k: int) -> float:
    """Tokens a round of k drafts emits on average when each draft is right with probability a
    (independently; a round keeps drafts up to the first wrong one, then adds its own token)."""
    return sum(a ** i for i in range(k + 1))


def measure_speculative(target, decode_row: dict, spec: SpecWorkload, n: int, rng: np.random.Generator,
                        profile_steps: int = 0) -> dict:
    """The verify costs and set-acceptance runs at the depth the plain measurement left the
    target at (its row `decode_row`); with `profile_steps`, each window size's un-graphed per-op
    profile too."""
    plain_ms = decode_row["ms_per_token"]
    target.snapshot(BASE_SLOT)
    out = {"depth": decode_row["depth"], "plain_ms_per_token": plain_ms, "draft_counts": []}
    if spec.mtp:
        out["draft_vocab"] = spec.draft_vocab
    for k in spec.ks:
        def verify_once():
            own = target.verify([target.next_token, *(int(t) for t in rng.integers(0, target.cfg.real_vocab_size, k))])
            target.accept(k + 1, own[k])
            target.settle()

        row = {"k": k, "verify_ms": median_ms(target, verify_once)}
        row["verify_cost"] = row["verify_ms"] / plain_ms
        if profile_steps:
            ids = [target.next_token, *(int(t) for t in rng.integers(0, target.cfg.real_vocab_size, k))]
            row["profile_ms"] = target.profile_verify(ids, profile_steps)
            target.restore(BASE_SLOT)
        if spec.mtp:
            if spec.draft_vocab:
                target.draft_vocab = 0
                row["draft_ms_every_id"] = median_ms(target, lambda: target.draft(k))
            target.draft_vocab = spec.draft_vocab
            row["draft_ms"] = median_ms(target, lambda: target.draft(k))
            row["draft_cost"] = row["draft_ms"] / plain_ms
        row["runs"] = []
        for a in spec.accepts:
            run = rounds_at(target, k, a, n, rng, spec.mtp)
            run["speedup"] = run["tokens_per_second"] * plain_ms / 1000.0
            run["speedup_measured"] = run["tokens_per_second_measured"] * plain_ms / 1000.0
            row["runs"].append(run)
            target.restore(BASE_SLOT)
        out["draft_counts"].append(row)
    return out


def median_ms(target, call) -> float:
    """The median of VERIFY_REPEATS timed calls, the state put back (BASE_SLOT) after each."""
    times = []
    for _ in range(VERIFY_REPEATS):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        target.restore(BASE_SLOT)
    return 1000.0 * statistics.median(times)


def format_speculative(rows: list[dict]) -> list[str]:
    mtp = any("draft_ms" in d for r in rows for d in r["draft_counts"])
    every = any("draft_ms_every_id" in d for r in rows for d in r["draft_counts"])  # --draft-vocab
    header = (f"{'depth':>9} {'k':>2} {'verify ms':>10} {'x plain':>8}" + (f" {'draft ms':>9}" if mtp else "")
              + (f" {'all ids':>8}" if every else "")
              + f" {'ms/round':>9} {'set a':>6} {'measured':>9} {'tok/round':>9} {'tok/s':>9} {'speedup':>8}"
              + f" {'at measured':>12}")
    lines = ["", header]
    for r in rows:
        for d in r["draft_counts"]:
            draft = (f" {d['draft_ms']:>9.3f}" if mtp else "") + (f" {d['draft_ms_every_id']:>8.3f}" if every else "")
            for run in d["runs"]:
                lines.append(f"{r['depth']:>9,} {d['k']:>2} {d['verify_ms']:>10.3f} {d['verify_cost']:>8.2f}{draft} "
                             f"{run['ms_per_round']:>9.3f} {run['a']:>6.2f} {run['acceptance']:>9.2f} "
                             f"{run['tokens_per_round']:>9.2f} {run['tokens_per_second']:>9,.1f} "
                             f"{run['speedup']:>7.2f}x {run['speedup_measured']:>11.2f}x")
    return lines
