"""Which token prefixes an engine can resume from: engine-agnostic bookkeeping of cached states.

A hybrid model (Gated DeltaNet + attention) cannot roll its recurrent state back, so an engine
keeps (1) its *current* state and (2) a few *snapshots* of the recurrent state taken at requested
prompt positions (turn boundaries). KV rows are position-indexed and may be shared rather than
copied: a snapshot of length L is a prefix of the current state and stays valid while no row
below L is rewritten. Rewinding to a resume point r (restoring a shorter snapshot, or starting
fresh) therefore drops every snapshot longer than r, even if the same tokens are written again
(matching `lampo.models.reference.state`, which refuses such snapshots as stale). In chat use
this loses nothing: the longest usable state is always chosen, so a longer snapshot that is
dropped could not have been used for the new prompt.

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

PREFIX_CHUNK = 4096  # ids compared at once when matching a prompt against the held state


@dataclass(frozen=True)
class Resume:
    source: Literal["fresh", "current", "snapshot"]
    reused: int  # prompt tokens covered by the restored state (0 when fresh)
    slot: int | None = None  # the snapshot slot to restore (source "snapshot")


class PrefixCache:
    def __init__(self, slots: int = 4):
        if slots < 1:
            raise ValueError(f"PrefixCache needs at least 1 snapshot slot (got {slots})")
        self._ids: list[int] = []  # token ids of the current state
        self._slots: list[int | None] = [None] * slots  # snapshot lengths (prefixes of _ids)
        self._last_use = [0] * slots
        self._clock = 0

    # ---- queries ----------------------------------------------------------------------------
    @property
    def current(self) -> tuple[int, ...]:
        """Token ids of the current state."""
        return tuple(self._ids)

    @property
    def current_len(self) -> int:
        return len(self._ids)

    def snapshots(self) -> dict[int, int]:
        """slot -> length of every valid snapshot."""
        return {i: n for i, n in enumerate(self._slots) if n is not None}

    def best_resume(self, prompt_ids: Sequence[int]) -> Resume:
        """The longest held state whose ids are a strict prefix of `prompt_ids`; the current
        state wins ties (no copy needed)."""
        limit = min(self._common_prefix(prompt_ids), len(prompt_ids) - 1)
        best = Resume("fresh", 0)
        if 0 < len(self._ids) <= limit:
            best = Resume("current", len(self._ids))
        for slot, n in self.snapshots().items():
            if 0 < n <= limit and n > best.reused:
                best = Resume("snapshot", n, slot)
        return best

    def snapshot_positions(self, prompt_ids: Sequence[int], start: int,
                           snapshot_at: Iterable[int]) -> list[int]:
        """Sorted positions in `snapshot_at` within (0, len(prompt)] and >= `start` where the
        engine must save a state while prefilling `prompt_ids` from `start` (positions already
        held as a snapshot of this same prefix are skipped)."""
        held = set(self.snapshots().values())
        common = self._common_prefix(prompt_ids)
        return sorted({p for p in snapshot_at
                       if max(start, 1) <= p <= len(prompt_ids) and not (p in held and p <= common)})

    # ---- updates ----------------------------------------------------------------------------
    def restore(self, resume: Resume) -> None:
        """Make the state chosen by `best_resume` current (snapshots beyond it are dropped)."""
        if resume.source == "snapshot":
            if resume.slot is None or self._slots[resume.slot] != resume.reused:
                raise ValueError(f"snapshot slot {resume.slot} no longer holds {resume.reused} tokens")
            self._touch(resume.slot)
        elif resume.source == "current" and resume.reused != len(self._ids):
            raise ValueError(f"current state holds {len(self._ids)} tokens, not {resume.reused}")
        del self._ids[resume.reused:]
        self._slots = [n if n is None or n <= resume.reused else None for n in self._slots]

    def append(self, ids: Iterable[int]) -> None:
        """The current state advanced over `ids`."""
        self._ids.extend(ids)

    def save(self) -> int:
        """Record a snapshot of the current state; returns the slot the engine must write it to
        (the slot already holding this prefix, else a free one, else the least recently used)."""
        for slot, n in self.snapshots().items():
            if n == len(self._ids):
                self._touch(slot)
                return slot
        free = [i for i, n in enumerate(self._slots) if n is None]
        slot = free[0] if free else min(range(len(self._slots)), key=self._last_use.__getitem__)
        self._slots[slot] = len(self._ids)
        self._touch(slot)
        return slot

    def reset(self) -> None:
        """Forget every state (new chat)."""
        self._ids.clear()
        self._slots = [None] * len(self._slots)

    # ---- internals ----------------------------------------------------------------------------
    def _touch(self, slot: int) -> None:
        self._clock += 1
        self._last_use[slot] = self._clock

    def _common_prefix(self, ids: Sequence[int]) -> int:
        n = min(len(ids), len(self._ids))
        i = 0
        while i < n:  # whole chunks compared as lists (a 250,000-id prompt in milliseconds) ...
            end = min(i + PREFIX_CHUNK, n)
            if list(ids[i:end]) != self._ids[i:end]:
                break
            i = end
        while i < n and ids[i] == self._ids[i]:  # ... then the differing chunk id by id
            i += 1
        return i
