"""Sparse mappings of one row written out in numpy (float64): independent truths for the tests."""
from __future__ import annotations

import numpy as np


def sparsemax_np(s: np.ndarray) -> np.ndarray:
    """Sparsemax of one row by sorting (Martins & Astudillo 2016), -inf entries get 0."""
    finite = s[np.isfinite(s)]
    z = np.sort(finite)[::-1]
    k = np.arange(1, len(z) + 1)
    support = 1 + k * z > np.cumsum(z)
    kz = k[support][-1]
    tau = (np.cumsum(z)[kz - 1] - 1) / kz
    return np.where(np.isfinite(s), np.maximum(s - tau, 0), 0.0)


def entmax_np(s: np.ndarray, alpha: float) -> np.ndarray:
    """alpha-entmax of one row by bisection on the threshold (200 halvings, float64); -inf gets 0."""
    z = np.where(np.isfinite(s), (alpha - 1) * s, -np.inf)
    lo, hi = z.max() - 1, z.max()
    for _ in range(200):
        tau = (lo + hi) / 2
        total = (np.maximum(z - tau, 0) ** (1 / (alpha - 1))).sum()
        lo, hi = (tau, hi) if total > 1 else (lo, tau)
    p = np.maximum(z - (lo + hi) / 2, 0) ** (1 / (alpha - 1))
    return p / p.sum()


def tsallis_omega_np(y: np.ndarray, alpha: float) -> float:
    """``(sum y^alpha - 1) / (alpha (alpha - 1))``."""
    return float(((y ** alpha).sum() - 1) / (alpha * (alpha - 1)))
