"""Which token prefixes an engine can resume from: engine-agnostic bookkeeping of cached states.

A hybrid model (Gated DeltaNet + attention) cannot roll its recurrent state back, so an engine
keeps (1) its *current* state and (2) a few *snapshots* of the recurrent state taken at requested
prompt positions (turn boundaries). KV rows are position-indexed and shared: the row at position
i depends only on tokens 0..i, so this class tracks the ids whose rows are written (`kv_ids`) and
treats a snapshot of length L as valid exactly while `kv_ids[:L]` is still the prefix it was taken
at. Writing a different token at position p drops every row (and snapshot) beyond p. An engine
that copies whole states loses nothing by following the same rule.

Engine loop, per request:
    r = cache.best_resume(prompt)           # longest held state that is a strict prefix
    cache.restore(r)                         # and restore snapshot r.slot / reset if r.fresh
    for chunk in prefill chunks (split at cache.snapshot_positions(prompt, r.reused, snapshot_at)):
        run the model; cache.append(chunk)
        at a snapshot position: slot = cache.save(); copy the state into that slot
    every decoded token: cache.append([token])

A resume point is always shorter than the prompt, so at least one prompt token is prefilled and
the engine has fresh logits to sample from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Sequence


@dataclass(frozen=True)
class Resume:
    source: Literal["fresh", "current", "snapshot"]
    reused: int  # prompt tokens covered by the restored state (0 when fresh)
    slot: int | None = None  # the snapshot slot to restore (source "snapshot")


class PrefixCache:
    def __init__(self, slots: int = 4):
        if slots < 1:
            raise ValueError(f"PrefixCache needs at least 1 snapshot slot (got {slots})")
        self._kv: list[int] = []  # ids whose KV rows are written, position by position
        self._current = 0  # the current state covers kv[:current]
        self._slots: list[int | None] = [None] * slots  # snapshot lengths
        self._last_use = [0] * slots
        self._clock = 0

    # ---- queries ----------------------------------------------------------------------------
    @property
    def current(self) -> tuple[int, ...]:
        """Token ids of the current state."""
        return tuple(self._kv[: self._current])

    @property
    def current_len(self) -> int:
        return self._current

    def snapshots(self) -> dict[int, int]:
        """slot -> length of every valid snapshot."""
        return {i: n for i, n in enumerate(self._slots) if n is not None}

    def best_resume(self, prompt_ids: Sequence[int]) -> Resume:
        """The longest held state whose ids are a strict prefix of `prompt_ids`; the current
        state wins ties (no copy needed)."""
        limit = min(self._common_prefix(prompt_ids), len(prompt_ids) - 1)
        best = Resume("fresh", 0)
        if 0 < self._current <= limit:
            best = Resume("current", self._current)
        for slot, n in self.snapshots().items():
            if 0 < n <= limit and n > best.reused:
                best = Resume("snapshot", n, slot)
        return best

    def snapshot_positions(self, prompt_ids: Sequence[int], start: int,
                           snapshot_at: Iterable[int]) -> list[int]:
        """Sorted positions in `snapshot_at` within (0, len(prompt)] and >= `start` where the
        engine must save a state while prefilling `prompt_ids` from `start` (held ones skipped,
        provided the prompt up to them matches what is written)."""
        held = set(self.snapshots().values())
        common = self._common_prefix(prompt_ids)
        return sorted({p for p in snapshot_at
                       if max(start, 1) <= p <= len(prompt_ids) and not (p in held and p <= common)})

    # ---- updates ----------------------------------------------------------------------------
    def restore(self, resume: Resume) -> None:
        """Make the state chosen by `best_resume` current."""
        if resume.source == "snapshot":
            if resume.slot is None or self._slots[resume.slot] != resume.reused:
                raise ValueError(f"snapshot slot {resume.slot} no longer holds {resume.reused} tokens")
            self._touch(resume.slot)
        elif resume.source == "current" and resume.reused != self._current:
            raise ValueError(f"current state holds {self._current} tokens, not {resume.reused}")
        self._current = resume.reused

    def append(self, ids: Iterable[int]) -> None:
        """The current state advanced over `ids` (their KV rows are now written)."""
        for token in ids:
            pos = self._current
            if pos < len(self._kv) and self._kv[pos] != token:
                del self._kv[pos:]
                self._slots = [n if n is None or n <= pos else None for n in self._slots]
            if pos == len(self._kv):
                self._kv.append(token)
            self._current = pos + 1

    def save(self) -> int:
        """Record a snapshot of the current state; returns the slot the engine must write it to
        (the slot already holding this prefix, else a free one, else the least recently used)."""
        for slot, n in self.snapshots().items():
            if n == self._current:
                self._touch(slot)
                return slot
        free = [i for i, n in enumerate(self._slots) if n is None]
        slot = free[0] if free else min(range(len(self._slots)), key=self._last_use.__getitem__)
        self._slots[slot] = self._current
        self._touch(slot)
        return slot

    def reset(self) -> None:
        """Forget every state (new chat)."""
        self._kv.clear()
        self._current = 0
        self._slots = [None] * len(self._slots)

    # ---- internals ----------------------------------------------------------------------------
    def _touch(self, slot: int) -> None:
        self._clock += 1
        self._last_use[slot] = self._clock

    def _common_prefix(self, ids: Sequence[int]) -> int:
        n = min(len(ids), len(self._kv))
        i = 0
        while i < n and ids[i] == self._kv[i]:
            i += 1
        return i
