"""Elementwise activations in fp32, written to stay finite for any input (no overflow warnings)."""

from __future__ import annotations

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), via log-sum-exp so large |x| neither overflows nor warns."""
    x = np.asarray(x, dtype=np.float32)
    return np.exp(-np.logaddexp(np.float32(0), -x))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    x = np.asarray(x, dtype=np.float32)
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x))."""
    return np.logaddexp(np.float32(0), np.asarray(x, dtype=np.float32))
