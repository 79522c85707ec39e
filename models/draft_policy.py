"""Which drafter and how many drafts each speculative step uses, from the acceptance measured so far.

For each drafter and draft position i the policy keeps the conditional acceptance a_i = P(draft i
is kept | drafts 1..i-1 were), a moving average over the rounds that reached position i (it starts
at PRIOR). A round with k drafts then emits E(k) = 1 + sum_{i <= k} a_1 ... a_i tokens in
expectation and costs c(k) = 1 + (verify_cost + draft_cost) k plain decode steps: verify_cost is
what one more position adds to the target's forward (measured per model and engine: a dense model's
verify is nearly free, an MoE's loads more experts), draft_cost what producing one draft costs (an
MTP layer pass; an n-gram lookup is free). Each step takes the (drafter, k) with the largest
E(k) / c(k) over k <= k_max, where n-gram drafts exist only as far as the context repeats; when no
choice beats a plain step (ratio 1) the step is plain, and after PROBE_EVERY plain steps one
draft is tried anyway so that the estimates can recover; each probe that keeps nothing doubles
that wait (up to PROBE_EVERY_MAX: text that no drafter predicts, such as a random-weight model's,
costs a probe every few hundred steps), and a kept draft brings it back. `mode` forces a drafter
("mtp", "ngram") or turns speculation off ("off"); `fixed_k` forces the number of drafts.

Where the engine reports what its steps take (`record_time`: the wall seconds of a plain step and
of each round), c(k) is the measured time of a round of k drafts over the measured plain step
instead of the model above, so speculation turns itself off where it measures slower (an MoE at
long context, a slow verify) and the draft count follows what each count really costs; a plain
step is then taken every PLAIN_EVERY rounds to keep its time current.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DRAFTERS = ("mtp", "ngram")
PLAIN = ("plain", 0)  # the key of a plain step's measured time
MODES = ("auto", "off", *DRAFTERS)
PRIOR = 0.5  # conditional acceptance assumed before anything is measured
SMOOTHING = 0.1  # weight of the newest round in the moving averages
PROBE_EVERY = 16  # plain steps before a probe while speculation is off
PROBE_EVERY_MAX = 256  # the longest wait, after probes that kept nothing
PLAIN_EVERY = 32  # rounds between two plain steps once step times are measured
TIME_SMOOTHING = 0.2  # weight of the newest time in the measured step times


@dataclass
class DraftPolicy:
    k_max: int = 4
    verify_cost: float = 0.1
    draft_cost: dict[str, float] = field(default_factory=lambda: {"mtp": 0.05, "ngram": 0.0})
    mode: str = "auto"
    fixed_k: int | None = None
    accept: dict[str, list[float]] = field(init=False)
    seconds: dict[tuple[str, int], float] = field(init=False, default_factory=dict)  # measured step times
    _warmed: set[tuple[str, int]] = field(init=False, default_factory=set)
    _plain_steps: int = field(init=False, default=0)
    _probe_every: int = field(init=False, default=PROBE_EVERY)  # plain steps before the next probe
    _probing: bool = field(init=False, default=False)  # the last choice was a probe
    _rounds: int = field(init=False, default=0)  # rounds since the last plain step

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"speculative mode {self.mode!r}: one of {', '.join(MODES)}")
        if self.k_max < 1 or (self.fixed_k is not None and not 1 <= self.fixed_k <= self.k_max):
            raise ValueError(f"draft length: k_max >= 1 and 1 <= fixed k <= k_max (got {self.k_max}, {self.fixed_k})")
        self.accept = {d: [PRIOR] * self.k_max for d in DRAFTERS}

    def expected_tokens(self, drafter: str, k: int) -> float:
        """E(k): tokens a round of k drafts from `drafter` emits, by the current estimates."""
        total, reach = 1.0, 1.0
        for a in self.accept[drafter][:k]:
            reach *= a
            total += reach
        return total

    def cost(self, drafter: str, k: int) -> float:
        """c(k): a round of k drafts in plain steps, measured where both times are known."""
        plain, spent = self.seconds.get(PLAIN), self.seconds.get((drafter, k))
        if plain and spent is not None:
            return spent / plain
        return 1 + (self.verify_cost + self.draft_cost[drafter]) * k

    def speedup(self, drafter: str, k: int) -> float:
        return self.expected_tokens(drafter, k) / self.cost(drafter, k)

    def record_time(self, drafter: str | None, k: int, seconds: float) -> None:
        """The wall seconds of a plain step (drafter None) or of a round of k drafts. The first of
        each kind is dropped: it includes one-time work (a CUDA graph captured at its first use)."""
        key = PLAIN if drafter is None else (drafter, k)
        if key not in self._warmed:
            self._warmed.add(key)
            return
        old = self.seconds.get(key)
        self.seconds[key] = seconds if old is None else old + TIME_SMOOTHING * (seconds - old)

    def choose(self, available: dict[str, int]) -> tuple[str | None, int]:
        """(drafter, k) for the next step, or (None, 0) for a plain step; `available`: how many
        drafts each usable drafter can make now (MTP: k_max; n-gram: the repeat's length)."""
        options = [d for d in DRAFTERS if available.get(d, 0) > 0 and self.mode in ("auto", d)]
        if self.mode == "off" or not options:
            return None, 0
        if self.fixed_k is not None:
            drafter = max(options, key=lambda d: self.speedup(d, min(self.fixed_k, available[d])))
            return drafter, min(self.fixed_k, available[drafter])
        if self.seconds and self._rounds >= PLAIN_EVERY:  # keep the measured plain step current
            self._rounds = 0
            return None, 0
        best = max(((self.speedup(d, k), d, k) for d in options for k in range(1, min(self.k_max, available[d]) + 1)),
                   key=lambda t: t[0])
        if best[0] > 1.0:
            self._plain_steps = 0
            self._rounds += 1
            return best[1], best[2]
        self._plain_steps += 1
        if self._plain_steps >= self._probe_every:
            self._plain_steps = 0
            self._probing = True
            return best[1], 1
        return None, 0

    def record(self, drafter: str, drafted: int, kept: int) -> None:
        """One round's outcome: positions 1..kept were kept, position kept + 1 (if drafted) was not."""
        if kept:
            self._probe_every = PROBE_EVERY
        elif self._probing:
            self._probe_every = min(2 * self._probe_every, PROBE_EVERY_MAX)
        self._probing = False
        rates = self.accept[drafter]
        for i in range(min(drafted, kept + 1)):
            rates[i] += SMOOTHING * ((1.0 if i < kept else 0.0) - rates[i])
