"""Elementwise activations in fp32, written to stay finite for any input (exp only of values <= 0)."""

from __future__ import annotations

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x))."""
    x = np.asarray(x, dtype=np.float32)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    x = np.asarray(x, dtype=np.float32)
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x))."""
    x = np.asarray(x, dtype=np.float32)
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))
