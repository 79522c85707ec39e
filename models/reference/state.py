"""Per-sequence state of the reference model and its snapshots.

- `KVCache`: one full-attention layer's fp32 K (after k_norm + RoPE) and V rows; row i is position i.
  Grows by doubling; `truncate(n)` drops rows >= n (the next append rewrites them) and logs the
  rollback so that stale snapshots can be detected.
- `GdnState`: one GDN layer's conv window [conv_dim, K-1] (the last pre-conv columns) and recurrent
  state [Hv, dk, dv], both fp32.
- `SequenceState.snapshot()` copies every GDN state and records the KV lengths (KV rows are not
  copied); `restore()` truncates the caches back to those lengths. That is valid while no row below
  a recorded length was rewritten since the snapshot; `restore` refuses a snapshot that is stale.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np


class KVCache:
    def __init__(self, n_kv_heads: int, head_dim: int):
        self._k = np.zeros((16, n_kv_heads, head_dim), dtype=np.float32)
        self._v = np.zeros_like(self._k)
        self.length = 0
        self.rollbacks: list[int] = []  # every truncation target below the length at the time, in order

    @property
    def k(self) -> np.ndarray:
        return self._k[: self.length]

    @property
    def v(self) -> np.ndarray:
        return self._v[: self.length]

    def append(self, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        need = self.length + k_rows.shape[0]
        if need > self._k.shape[0]:
            grow = max(need, 2 * self._k.shape[0]) - self._k.shape[0]
            pad = [(0, grow), (0, 0), (0, 0)]
            self._k, self._v = np.pad(self._k, pad), np.pad(self._v, pad)
        self._k[self.length : need] = k_rows
        self._v[self.length : need] = v_rows
        self.length = need

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise ValueError(f"KV cache: cannot truncate {self.length} rows to {n}")
        if n < self.length:
            self.rollbacks.append(n)
        self.length = n

    def holds(self, length: int, rollback_mark: int) -> bool:
        """True if rows 0..length-1 are unchanged since the rollback log had `rollback_mark` entries."""
        return self.length >= length and all(n >= length for n in self.rollbacks[rollback_mark:])


@dataclass
class GdnState:
    conv: np.ndarray  # [conv_dim, K-1]
    recurrent: np.ndarray  # [Hv, dk, dv]

    @classmethod
    def zeros(cls, conv_dim: int, kernel: int, n_heads: int, dk: int, dv: int) -> "GdnState":
        return cls(np.zeros((conv_dim, kernel - 1), np.float32), np.zeros((n_heads, dk, dv), np.float32))


@dataclass(frozen=True)
class Snapshot:
    position: int
    gdn: tuple[GdnState, ...]
    kv_lengths: tuple[int, ...]
    rollback_marks: tuple[int, ...]


class SequenceState:
    """The caches of one sequence: KV caches (trunk attention layers, then the MTP layer if any),
    GDN states, and the trunk position."""

    def __init__(self, kv: list[KVCache], gdn: list[GdnState]):
        self.kv = kv
        self.gdn = gdn
        self.position = 0

    def snapshot(self) -> Snapshot:
        return Snapshot(
            position=self.position,
            gdn=tuple(copy.deepcopy(s) for s in self.gdn),
            kv_lengths=tuple(c.length for c in self.kv),
            rollback_marks=tuple(len(c.rollbacks) for c in self.kv),
        )

    def restore(self, snap: Snapshot) -> None:
        if len(snap.gdn) != len(self.gdn) or len(snap.kv_lengths) != len(self.kv):
            raise ValueError("restore: the snapshot belongs to a different model")
        if not all(c.holds(n, m) for c, n, m in zip(self.kv, snap.kv_lengths, snap.rollback_marks)):
            raise ValueError("restore: the snapshot is stale (KV rows it relies on were rolled back since)")
        for cache, n in zip(self.kv, snap.kv_lengths):
            cache.truncate(n)
        self.gdn[:] = [copy.deepcopy(s) for s in snap.gdn]
        self.position = snap.position
