"""Feed-forward blocks, fp32.

- `swiglu(h, w_gate, w_up, w_down)`: (silu(h Wg^T) * (h Wu^T)) Wd^T; weights [I,H], [I,H], [H,I].
- `moe_router(h [T,H], w_router [E,H], k, ids=None) -> (ids [T,k] int64, weights [T,k] float32)`:
  softmax over ALL E experts in fp32, top-k by probability (exact ties -> lower expert id first),
  or the given `ids`; the k weights renormalised to sum to 1.
- `moe_block(..., routing=None)`: sum_e w_e * SwiGLU_e(h) over the routed experts (gate_up [E,2I,H]:
  rows 0..I-1 gate, I..2I-1 up; down [E,H,I]) + sigmoid(h . w_shared_gate) * shared SwiGLU(h).
- `Routing`: the experts of every MoE layer of a forward call, recorded, or replayed from another
  engine's choices so that a comparison with it is exact even where the router's top-k is a near
  tie (a quantized model flips more of those).
"""

from __future__ import annotations

import numpy as np

from .activations import sigmoid, silu


def swiglu(h: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    h = np.asarray(h, dtype=np.float32)
    return (silu(h @ w_gate.T) * (h @ w_up.T)) @ w_down.T


def moe_router(h: np.ndarray, w_router: np.ndarray, k: int, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(h, dtype=np.float32)
    E = w_router.shape[0]
    if not 0 < k <= E:
        raise ValueError(f"moe_router: top-k {k} must be in 1..{E}")
    logits = h @ np.asarray(w_router, dtype=np.float32).T
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    if ids is None:
        ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # stable: equal probs keep the lower id first
    else:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape != (len(h), k) or ids.min(initial=0) < 0 or ids.max(initial=0) >= E:
            raise ValueError(f"moe_router: replayed ids must be [{len(h)}, {k}] in [0, {E}), got shape {ids.shape}")
    top = np.take_along_axis(probs, ids, axis=-1)
    return ids.astype(np.int64), (top / top.sum(axis=-1, keepdims=True)).astype(np.float32)


class Routing:
    """The experts each MoE layer of one forward call sends its tokens to, in layer order: with
    `replay` (ids [layers, T, k]) layer i uses replay[i] instead of the router's top-k (the weights
    stay the router's probabilities of those experts, renormalised); `chosen` records every
    layer's ids either way."""

    def __init__(self, replay: np.ndarray | None = None):
        self.replay = None if replay is None else np.asarray(replay, dtype=np.int64)
        self.chosen: list[np.ndarray] = []

    def route(self, h: np.ndarray, w_router: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        layer = len(self.chosen)
        if self.replay is not None and layer >= len(self.replay):
            raise ValueError(f"routing: {len(self.replay)} layers replayed, the model has more MoE layers")
        ids, weights = moe_router(h, w_router, k, None if self.replay is None else self.replay[layer])
        self.chosen.append(ids)
        return ids, weights


def moe_block(
    h: np.ndarray,
    w_router: np.ndarray,
    gate_up: np.ndarray,
    down: np.ndarray,
    w_shared_gate: np.ndarray,
    shared_gate_proj: np.ndarray,
    shared_up_proj: np.ndarray,
    shared_down_proj: np.ndarray,
    k: int,
    routing: Routing | None = None,
) -> np.ndarray:
    h = np.asarray(h, dtype=np.float32)
    E, two_i, H = gate_up.shape
    inter = two_i // 2
    if down.shape != (E, H, inter) or h.shape[-1] != H:
        raise ValueError(f"moe_block: bad shapes h {h.shape}, gate_up {gate_up.shape}, down {down.shape}")
    ids, weights = (routing.route if routing is not None else moe_router)(h, w_router, k)
    routed = np.zeros_like(h)
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)
        gu = np.asarray(gate_up[e], dtype=np.float32)
        y = swiglu(h[tok], gu[:inter], gu[inter:], np.asarray(down[e], dtype=np.float32))
        routed[tok] += weights[tok, slot, None] * y  # a token picks each expert at most once
    gate = sigmoid(h @ np.asarray(w_shared_gate, dtype=np.float32).reshape(H))
    shared = swiglu(h, shared_gate_proj, shared_up_proj, shared_down_proj)
    return routed + gate[:, None] * shared
