"""Gated full attention pieces, fp32.

- `split_q_gate`: q_proj output rows are interleaved PER HEAD as [query (D) | gate (D)];
  qg [T, nq*2*D] -> q [T, nq, D], gate [T, nq*D] (gate heads concatenated, for the sigmoid gate).
- `attention`: causal GQA softmax attention over a KV cache whose row i holds position i.
  q [T, nq, D], k/v [L, nkv, D], q_positions [T] -> o [T, nq*D]; the query at position p sees keys
  0..p; scale 1/sqrt(D); softmax in fp32; query head h reads kv head h // (nq/nkv).
"""

from __future__ import annotations

import numpy as np

QUERY_BLOCK = 256  # query rows per score block: bounds the [nq, rows, L] score matrix for long prompts


def split_q_gate(qg: np.ndarray, nq: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    qg = np.asarray(qg, dtype=np.float32)
    if qg.ndim != 2 or qg.shape[1] != nq * 2 * head_dim:
        raise ValueError(f"split_q_gate: need qg [T, {nq * 2 * head_dim}] (got {qg.shape})")
    per_head = qg.reshape(qg.shape[0], nq, 2 * head_dim)
    q = per_head[:, :, :head_dim].copy()
    gate = per_head[:, :, head_dim:].reshape(qg.shape[0], nq * head_dim).copy()
    return q, gate


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray) -> np.ndarray:
    q = np.asarray(q, dtype=np.float32)
    k = np.asarray(k, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    pos = np.asarray(q_positions, dtype=np.int64)
    T, nq, D = q.shape
    L, nkv, _ = k.shape
    if k.shape != v.shape or k.shape[2] != D or nq % nkv or pos.shape != (T,):
        raise ValueError(f"attention: bad shapes q {q.shape}, k {k.shape}, v {v.shape}, positions {pos.shape}")
    if T and (pos.min() < 0 or pos.max() >= L):
        raise ValueError(f"attention: query positions {pos.min()}..{pos.max()} need keys the cache lacks (L={L})")
    group = nq // nkv
    scale = np.float32(1.0 / np.sqrt(D))
    kh = k.transpose(1, 0, 2)  # [nkv, L, D]
    vh = v.transpose(1, 0, 2)
    out = np.empty((T, nq, D), dtype=np.float32)
    for start in range(0, T, QUERY_BLOCK):
        rows = slice(start, min(T, start + QUERY_BLOCK))
        qb = q[rows].reshape(-1, nkv, group, D).transpose(1, 2, 0, 3)  # [nkv, g, t, D]
        scores = (qb @ kh[:, None].transpose(0, 1, 3, 2)) * scale  # [nkv, g, t, L]
        visible = np.arange(L)[None, :] <= pos[rows][:, None]  # [t, L]
        scores = np.where(visible, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        ob = probs @ vh[:, None]  # [nkv, g, t, D]
        out[rows] = ob.transpose(2, 0, 1, 3).reshape(-1, nq, D)
    return out.reshape(T, nq * D)
