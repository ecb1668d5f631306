"""How well a token-by-token similarity matrix follows a known partition into modules.

Both functions take a symmetric similarity matrix S [N, N] (e.g. the cosine similarity of a learned PE's rows)
and the ground-truth module of each token [N]; the diagonal is ignored.
"""
from __future__ import annotations

import numpy as np


def newman_modularity(similarity: np.ndarray, modules: np.ndarray) -> float:
    """Newman's Q of the weighted graph with edge weights max(S_ij, 0), i ≠ j, under the given partition:
    Q = (1/2m) Σ_ij [W_ij − k_i k_j / 2m] δ(c_i, c_j). Negative similarities are dropped (the usual
    positive-weight convention); 0 for a graph without positive edges."""
    weights = np.clip(np.asarray(similarity, dtype=np.float64), 0.0, None)
    np.fill_diagonal(weights, 0.0)
    total = weights.sum()  # = 2m for a symmetric matrix
    if total <= 0:
        return 0.0
    strength = weights.sum(1)
    same = np.asarray(modules)[:, None] == np.asarray(modules)[None, :]
    return float(((weights - np.outer(strength, strength) / total) * same).sum() / total)


def segregation(similarity: np.ndarray, modules: np.ndarray) -> float:
    """Mean within-module minus mean between-module similarity (off-diagonal pairs). Chan et al.'s ratio over
    the within mean is not used: it blows up when that mean is near 0, as it is for a large-σ PE."""
    similarity = np.asarray(similarity, dtype=np.float64)
    modules = np.asarray(modules)
    same = modules[:, None] == modules[None, :]
    off_diagonal = ~np.eye(len(modules), dtype=bool)
    within, between = similarity[same & off_diagonal], similarity[~same]
    if within.size == 0 or between.size == 0:
        return float("nan")
    return float(within.mean() - between.mean())
