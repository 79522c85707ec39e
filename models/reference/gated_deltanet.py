"""Gated DeltaNet (linear attention) pieces, fp32.

- `causal_conv1d_silu(x [T,C], w [C,K], state [C,K-1]) -> (y [T,C], new_state [C,K-1])`:
  depthwise causal conv over time with the K-1 previous pre-conv columns as left context, then SiLU;
  y[t,c] = silu(sum_j w[c,j] * xin[t+j, c]) with xin = state^T ‖ x; new_state = last K-1 columns of xin.
- `gdn_gates(a, b, A_log, dt_bias) -> (g, beta)`: g = -exp(A_log) * softplus(a + dt_bias) (<= 0),
  beta = sigmoid(b); a, b [T, Hv].
- `l2norm(x, eps)`: x * rsqrt(sum(x^2) + eps) over the last dim.
- `gated_delta_rule_recurrent` / `gated_delta_rule_chunked`: q, k [T,Hk,dk] (ALREADY l2-normed, q
  scaled by 1/sqrt(dk)), v [T,Hv,dv], g, beta [T,Hv], state [Hv,dk,dv] -> (o [T,Hv,dv], new_state).
  V head j uses QK head j // (Hv/Hk). Per token and V head, with S [dk, dv]:
      S = exp(g) S;  e = v - S^T k;  S = S + k ⊗ (beta e);  o = S^T q      (decay BEFORE the update)
  The chunked form (WY / UT transform, chunk 64, zero-padded tail) is algebraically identical.
"""

from __future__ import annotations

import numpy as np

from .activations import sigmoid, silu, softplus


def causal_conv1d_silu(x: np.ndarray, w: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float32)
    w = np.asarray(w, dtype=np.float32)
    state = np.asarray(state, dtype=np.float32)
    T, C = x.shape
    K = w.shape[1]
    if w.shape != (C, K) or state.shape != (C, K - 1):
        raise ValueError(f"causal_conv1d_silu: need w [{C}, K] and state [{C}, K-1] (got {w.shape}, {state.shape})")
    xin = np.concatenate([state.T, x], axis=0)  # [K-1+T, C]
    acc = np.zeros((T, C), dtype=np.float32)
    for j in range(K):
        acc += w[:, j] * xin[j : j + T]
    return silu(acc), xin[T:].T.copy()


def gdn_gates(a: np.ndarray, b: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float32)
    A_log = np.asarray(A_log, dtype=np.float32)
    dt_bias = np.asarray(dt_bias, dtype=np.float32)
    g = -np.exp(A_log) * softplus(a + dt_bias)
    return g, sigmoid(b)


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x * (np.float32(1) / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(eps)))


def _heads_first(q, k, v, g, beta, state):
    """Validate, expand q/k to the V heads (j -> j // r) and move heads first: [Hv, T, d]."""
    q, k, v, g, beta, state = (np.asarray(t, dtype=np.float32) for t in (q, k, v, g, beta, state))
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    if (
        k.shape != q.shape
        or v.shape[0] != T
        or Hv % Hk
        or g.shape != (T, Hv)
        or beta.shape != (T, Hv)
        or state.shape != (Hv, dk, dv)
    ):
        raise ValueError(
            f"gated delta rule: bad shapes q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, "
            f"beta {beta.shape}, state {state.shape}"
        )
    r = Hv // Hk
    qh = np.repeat(q, r, axis=1).transpose(1, 0, 2)
    kh = np.repeat(k, r, axis=1).transpose(1, 0, 2)
    return qh, kh, v.transpose(1, 0, 2), g.T, beta.T, state.copy()


def gated_delta_rule_recurrent(q, k, v, g, beta, state) -> tuple[np.ndarray, np.ndarray]:
    qh, kh, vh, gh, bh, S = _heads_first(q, k, v, g, beta, state)
    T = qh.shape[1]
    out = np.empty_like(vh)
    for t in range(T):
        S *= np.exp(gh[:, t])[:, None, None]
        err = vh[:, t] - np.einsum("hkv,hk->hv", S, kh[:, t])
        S += kh[:, t][:, :, None] * (bh[:, t][:, None] * err)[:, None, :]
        out[:, t] = np.einsum("hkv,hk->hv", S, qh[:, t])
    return out.transpose(1, 0, 2), S


def _unit_lower_solve(a_strict: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve (I + A) X = R by forward substitution; A strictly lower [..., C, C], R [..., C, n]."""
    x = np.empty_like(rhs)
    for i in range(rhs.shape[-2]):
        x[..., i, :] = rhs[..., i, :] - (a_strict[..., i : i + 1, :i] @ x[..., :i, :])[..., 0, :]
    return x


def gated_delta_rule_chunked(q, k, v, g, beta, state, chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    qh, kh, vh, gh, bh, S = _heads_first(q, k, v, g, beta, state)
    Hv, T, dk = qh.shape
    dv = vh.shape[2]
    pad = (-T) % chunk
    n = (T + pad) // chunk

    def chunks(x: np.ndarray) -> np.ndarray:  # [Hv, T, ...] -> [Hv, n, chunk, ...], zero tail
        x = np.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(Hv, n, chunk, *x.shape[2:])

    Q, K, V, G, B = chunks(qh), chunks(kh), chunks(vh), chunks(gh), chunks(bh)
    G = np.cumsum(G, axis=-1)  # cumulative log-decay inside each chunk
    lower = np.tril(np.ones((chunk, chunk), dtype=bool))
    gamma = np.exp(np.where(lower, G[..., :, None] - G[..., None, :], -np.inf))  # [Hv, n, C, C]
    KB = K * B[..., None]
    A = np.where(lower & ~np.eye(chunk, dtype=bool), (KB @ K.swapaxes(-1, -2)) * gamma, 0)
    solved = _unit_lower_solve(A, np.concatenate([V * B[..., None], KB * np.exp(G)[..., None]], axis=-1))
    U, W = solved[..., :dv], solved[..., dv:]
    Qd = Q * np.exp(G)[..., None]
    QK = (Q @ K.swapaxes(-1, -2)) * gamma
    Kd = K * np.exp(G[..., -1:] - G)[..., None]
    decay_all = np.exp(G[..., -1])  # [Hv, n]

    out = np.empty((Hv, n, chunk, dv), dtype=np.float32)
    for c in range(n):
        v_new = U[:, c] - W[:, c] @ S
        out[:, c] = Qd[:, c] @ S + QK[:, c] @ v_new
        S = S * decay_all[:, c, None, None] + Kd[:, c].swapaxes(-1, -2) @ v_new
    return out.reshape(Hv, n * chunk, dv)[:, :T].transpose(1, 0, 2), S
