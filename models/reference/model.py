"""The fp32 numpy reference forward of a Qwen3.5/3.6 text model: the oracle for the CUDA engine.

`ReferenceModel(cfg, weights)` holds one sequence's state (a KV cache per full-attention layer, conv
window + recurrent state per GDN layer, the MTP layer's own KV cache) and advances it:
- `prefill(ids)` runs tokens from the current `position` (multi-token calls use the chunked GDN form,
  single tokens the token loop, as HF does) and returns logits [T, V] (or [V] with last_only);
  `advance(ids)` runs them in one call without computing logits (`logits(hiddens)` on demand);
- `decode(id)` one token -> logits [V];
- `hiddens` / `hidden_last`: final-normed hidden rows of the last prefill/decode call (MTP input);
- `snapshot()` / `restore(s)`: roll the sequence back to a saved point;
- `mtp_prefill(hiddens, next_ids, start)` / `mtp_step(hidden, next_id, position)`: draft logits;
  `mtp_advance(hiddens, next_ids, start)` the same rows without logits.
Logits of padding ids (>= cfg.real_vocab_size) are -inf.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from lampo.models.bf16 import from_bf16
from lampo.models.config import FULL, ModelConfig
from lampo.models.tensor_specs import EMBED, FINAL_NORM, LM_HEAD, MTP_PREFIX, expected_tensors, layer_prefix

from . import layers, mtp, norms
from .ffn import Routing
from .state import GdnState, KVCache, SequenceState, Snapshot

MTP_FC = MTP_PREFIX + "fc.weight"


class Float32Weights(Mapping):
    """Tensors by full name, converted to float32 on first use and kept (uint16 = bf16 bits)."""

    def __init__(self, load: Callable[[str], np.ndarray], names: list[str]):
        self._load = load
        self._names = names
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            raw = np.asarray(self._load(name))
            if raw.dtype == np.uint16:
                arr = from_bf16(raw)
            elif raw.dtype.kind == "f":
                arr = np.ascontiguousarray(raw, dtype=np.float32)
            else:
                raise TypeError(f"weight {name}: dtype {raw.dtype} is neither float nor bf16 bits (uint16)")
            self._cache[name] = arr
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def check_weights(cfg: ModelConfig, weights: Mapping[str, np.ndarray]) -> bool:
    """Raise ValueError naming missing or misshapen tensors; return whether the MTP module is present."""
    has_mtp = cfg.mtp_num_hidden_layers > 0 and MTP_FC in weights
    missing, wrong = [], []
    for name, spec in expected_tensors(cfg, include_mtp=has_mtp).items():
        if name not in weights:
            missing.append(name)
        elif tuple(np.shape(weights[name])) != spec.shape:
            wrong.append(f"{name} {tuple(np.shape(weights[name]))} (expected {spec.shape})")
    if missing or wrong:
        parts = ([f"missing {len(missing)}: {', '.join(missing[:5])}"] if missing else []) + (
            [f"misshapen: {'; '.join(wrong[:5])}"] if wrong else []
        )
        raise ValueError("reference model weights: " + " | ".join(parts))
    return has_mtp


@dataclass(frozen=True)
class ModelSnapshot:
    state: Snapshot
    hidden_last: np.ndarray | None


class ReferenceModel:
    def __init__(self, cfg: ModelConfig, weights: Mapping[str, np.ndarray]):
        has_mtp = check_weights(cfg, weights)
        self._setup(cfg, Float32Weights(weights.__getitem__, list(weights)), has_mtp)

    @classmethod
    def from_checkpoint(cls, ck) -> "ReferenceModel":
        """From a `lampo.models.checkpoint.Checkpoint` (already validated); tensors load lazily."""
        names = list(ck.names())
        model = cls.__new__(cls)
        has_mtp = ck.config.mtp_num_hidden_layers > 0 and MTP_FC in names
        model._setup(ck.config, Float32Weights(ck.tensor_f32, names), has_mtp)
        return model

    def _setup(self, cfg: ModelConfig, w: Float32Weights, has_mtp: bool) -> None:
        self.cfg = cfg
        self.w = w
        self.has_mtp = has_mtp
        self.reset()

    # ---- state -----------------------------------------------------------------------------
    def reset(self) -> None:
        cfg = self.cfg
        kv = [KVCache(cfg.num_key_value_heads, cfg.head_dim) for _ in cfg.full_layer_ids]
        if self.has_mtp:
            kv.append(KVCache(cfg.num_key_value_heads, cfg.head_dim))
        gdn = [
            GdnState.zeros(cfg.conv_dim, cfg.linear_conv_kernel_dim, cfg.linear_num_value_heads,
                           cfg.linear_key_head_dim, cfg.linear_value_head_dim)
            for _ in cfg.linear_layer_ids
        ]
        self.state = SequenceState(kv, gdn)
        self.hiddens = np.zeros((0, cfg.hidden_size), np.float32)
        self.mtp_hidden_last: np.ndarray | None = None

    @property
    def position(self) -> int:
        return self.state.position

    @property
    def hidden_last(self) -> np.ndarray:
        if not len(self.hiddens):
            raise ValueError("hidden_last: nothing has been run yet")
        return self.hiddens[-1]

    def snapshot(self) -> ModelSnapshot:
        return ModelSnapshot(self.state.snapshot(), self.hiddens[-1].copy() if len(self.hiddens) else None)

    def restore(self, snap: ModelSnapshot) -> None:
        self.state.restore(snap.state)
        h = snap.hidden_last
        self.hiddens = np.zeros((0, self.cfg.hidden_size), np.float32) if h is None else h[None].copy()

    # ---- trunk -----------------------------------------------------------------------------
    def _token_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not len(ids):
            raise ValueError("no token ids given")
        bad = ids[(ids < 0) | (ids >= self.cfg.vocab_size)]
        if len(bad):
            raise ValueError(f"token id {int(bad[0])} is outside the vocabulary (0..{self.cfg.vocab_size - 1})")
        return ids

    def _layer_states(self) -> list[KVCache | GdnState]:
        kv, gdn = iter(self.state.kv), iter(self.state.gdn)
        return [next(kv) if t == FULL else next(gdn) for t in self.cfg.layer_types]

    def _forward(self, ids: np.ndarray, routing: Routing | None = None) -> np.ndarray:
        """Run tokens at the next positions; returns the final-normed hidden rows [T, H]."""
        cfg, w = self.cfg, self.w
        positions = np.arange(self.position, self.position + len(ids))
        x = w[EMBED][ids]
        serial = len(ids) == 1
        for i, (kind, st) in enumerate(zip(cfg.layer_types, self._layer_states())):
            x = layers.decoder_layer(cfg, w, layer_prefix(i), kind, x, st, positions, serial, routing)
        self.state.position += len(ids)
        return norms.rmsnorm1p(x, w[FINAL_NORM], cfg.rms_norm_eps)

    def logits(self, hiddens: np.ndarray) -> np.ndarray:
        """hiddens [..., H] -> logits [..., V] with padding ids at -inf."""
        out = hiddens @ self.w[LM_HEAD].T
        out[..., self.cfg.real_vocab_size :] = -np.inf
        return out

    def prefill(self, ids, chunk_size: int | None = None, last_only: bool = False,
                routing: Routing | None = None) -> np.ndarray:
        """Run `ids` from the current position, in calls of at most `chunk_size` tokens (all at once
        by default). Returns logits for every row [T, V], or only the last row [V] if last_only.
        `routing` (ffn.Routing, one call: no chunks) records or replays the MoE experts."""
        ids = self._token_ids(ids)
        step = chunk_size or len(ids)
        if step < 1:
            raise ValueError(f"prefill: chunk_size must be >= 1 (got {chunk_size})")
        if routing is not None and step < len(ids):
            raise ValueError("prefill: routing is recorded or replayed for one call, not for chunks")
        hiddens = [self._forward(ids[s : s + step], routing) for s in range(0, len(ids), step)]
        self.hiddens = np.concatenate(hiddens)
        return self.logits(self.hiddens[-1]) if last_only else self.logits(self.hiddens)

    def advance(self, ids) -> None:
        """Run `ids` from the current position in one call, as `prefill` does, but compute no logits."""
        self.hiddens = self._forward(self._token_ids(ids))

    def decode(self, token_id: int, routing: Routing | None = None) -> np.ndarray:
        """One token at the current position -> logits [V] (`routing` as in prefill)."""
        self.hiddens = self._forward(self._token_ids([token_id]), routing)
        return self.logits(self.hiddens[-1])

    # ---- MTP -------------------------------------------------------------------------------
    def mtp_chain(self, trunk_ids, token: int, drafts) -> list[np.ndarray]:
        """The draft logits of an MTP chain, from a fresh state: the trunk runs `trunk_ids` (with
        every MTP row they complete), then the MTP row of the last trunk hidden and `token`, then
        one row per draft but the last, each on the MTP hidden before it."""
        self.reset()
        self.prefill(list(trunk_ids))
        n = len(trunk_ids)
        if n > 1:
            self.mtp_advance(self.hiddens[:-1], list(trunk_ids[1:]), 0)
        out = [self.mtp_step(self.hiddens[-1], token, n - 1)]
        for i, d in enumerate(drafts[:-1]):
            out.append(self.mtp_step(self.mtp_hidden_last, d, n + i))
        return out

    def mtp_prefill(self, hiddens: np.ndarray, next_ids, start: int, last_only: bool = False) -> np.ndarray:
        """MTP rows for (hiddens[t], next_ids[t]) at positions start.. ; rows of the MTP cache at or
        after `start` are replaced. For a prompt x_0..x_n: hiddens h_0..h_n (the prefill's
        `hiddens`), next_ids x_1..x_{n+1}, start 0. Returns draft logits [T, V] (or [V])."""
        d = self._mtp_rows(hiddens, next_ids, start)
        return self.logits(d[-1]) if last_only else self.logits(d)

    def mtp_advance(self, hiddens: np.ndarray, next_ids, start: int) -> None:
        """The MTP rows of `mtp_prefill` (and `mtp_hidden_last`) without their logits."""
        self._mtp_rows(hiddens, next_ids, start)

    def _mtp_rows(self, hiddens: np.ndarray, next_ids, start: int) -> np.ndarray:
        if not self.has_mtp:
            raise ValueError("this model has no MTP weights")
        ids = self._token_ids(next_ids)
        hiddens = np.asarray(hiddens, dtype=np.float32).reshape(-1, self.cfg.hidden_size)
        if len(hiddens) != len(ids):
            raise ValueError(f"mtp_prefill: {len(hiddens)} hidden rows but {len(ids)} next ids")
        cache = self.state.kv[-1]
        if not 0 <= start <= cache.length:
            raise ValueError(f"mtp_prefill: start {start} is beyond the MTP cache ({cache.length} rows)")
        cache.truncate(start)
        positions = np.arange(start, start + len(ids))
        d = mtp.mtp_layer(self.cfg, self.w, self.w[EMBED][ids], hiddens, cache, positions)
        self.mtp_hidden_last = d[-1]
        return d

    def mtp_step(self, hidden: np.ndarray, next_id: int, position: int) -> np.ndarray:
        """One MTP row (hidden: a trunk hidden, or `mtp_hidden_last` to chain drafts) -> logits [V]."""
        return self.mtp_prefill(np.asarray(hidden)[None], [next_id], position, last_only=True)
