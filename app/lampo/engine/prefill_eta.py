"""The time a chunked prefill has left, from the calls done so far.

A prompt token at position p costs about a + b * p: the matrix products are the same for every
token, while the attention reads all p earlier keys. On a long prompt the last chunks therefore
cost several times the first (at 262,000 tokens the attention is most of the time to first token:
docs/design/prefill.md), and a rate averaged over the chunks done so far would promise far too
early an end. `PrefillEta` fits a and b (both >= 0) to the calls' own durations by least squares and sums
the fitted cost of the positions still to come. With a single call, or calls that cannot tell the
two terms apart, it falls back to the average rate.
"""

from __future__ import annotations


def _position_sum(start: int, end: int) -> float:
    """start + (start + 1) + ... + (end - 1)."""
    return (end - start) * (start + end - 1) / 2.0


class PrefillEta:
    def __init__(self, start: int):
        """`start`: the position of the first token this prefill computes (after a reused prefix)."""
        self._pos = start
        self._calls: list[tuple[float, float, float]] = []  # (tokens, sum of positions, seconds)

    def add(self, end: int, seconds: float) -> None:
        """A call computed the positions up to `end` (exclusive) in `seconds`."""
        if end <= self._pos:
            raise ValueError(f"a prefill call must end after position {self._pos}, got {end}")
        self._calls.append((float(end - self._pos), _position_sum(self._pos, end), max(seconds, 0.0)))
        self._pos = end

    def _fit(self) -> tuple[float, float]:
        """(a, b): seconds per token and per token per position, both >= 0."""
        n = [c[0] for c in self._calls]
        s = [c[1] for c in self._calls]
        t = [c[2] for c in self._calls]
        nn = sum(x * x for x in n)
        ns = sum(x * y for x, y in zip(n, s))
        ss = sum(y * y for y in s)
        nt = sum(x * y for x, y in zip(n, t))
        st = sum(y * y2 for y, y2 in zip(s, t))
        det = nn * ss - ns * ns
        if len(self._calls) >= 2 and det > 1e-9 * nn * ss:
            a = (nt * ss - st * ns) / det
            b = (st * nn - nt * ns) / det
            if a >= 0.0 and b >= 0.0:
                return a, b
            if b < 0.0:  # the later calls were no slower: a constant cost per token
                return nt / nn, 0.0
            return 0.0, st / ss  # cost in proportion to the position alone
        return sum(t) / sum(n), 0.0  # one call's (or the calls') average rate

    def seconds_left(self, end: int) -> float:
        """The fitted time of positions [done, end); -1.0 before any call."""
        if not self._calls:
            return -1.0
        if end <= self._pos:
            return 0.0
        a, b = self._fit()
        return a * (end - self._pos) + b * _position_sum(self._pos, end)
