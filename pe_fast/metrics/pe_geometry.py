"""How well a learned PE mirrors the tokens' ground-truth positions.

All functions take one model's PE table P [N, D] (numpy) and return a float.
"""
from __future__ import annotations

import numpy as np
from scipy.spatial.distance import pdist

from pe_fast.metrics.correlation import pearson, spearman


def cosine_similarity_matrix(table: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(table, axis=1, keepdims=True)
    unit = table / np.maximum(norms, 1e-12)
    return unit @ unit.T


def upper_triangle(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.triu_indices(matrix.shape[0], k=1)]


def rsa(table: np.ndarray, coordinates: np.ndarray) -> float:
    """Pearson correlation of the PE's cosine similarities with minus the tokens' Euclidean distances."""
    similarity = upper_triangle(cosine_similarity_matrix(table))
    return pearson(similarity, -pdist(coordinates))


def distance_spearman(table: np.ndarray, coordinates: np.ndarray) -> float:
    """Spearman correlation of the pairwise Euclidean distances of PE vectors and of token positions."""
    return spearman(pdist(table), pdist(coordinates))


def procrustes_disparity(table: np.ndarray, target: np.ndarray) -> float:
    """Residual of the best rotation (+ uniform scale, after centring) of `table` onto `target`:
    ‖s·P̂R − Ĝ‖² with both centred and scaled to unit Frobenius norm. 0 = same shape, 1 = unrelated.
    The target's width may differ: the narrower of the two is zero-padded."""
    width = max(table.shape[1], target.shape[1])
    p = np.pad(table, ((0, 0), (0, width - table.shape[1])))
    g = np.pad(target, ((0, 0), (0, width - target.shape[1])))
    p, g = p - p.mean(0), g - g.mean(0)
    p, g = p / np.linalg.norm(p), g / np.linalg.norm(g)
    # max over rotations of trace(Rᵀ pᵀg) is the nuclear norm of pᵀg; the optimal scale gives 1 − that².
    nuclear = np.linalg.svd(p.T @ g, compute_uv=False).sum()
    return float(max(0.0, 1.0 - nuclear ** 2))


def top_components_procrustes(table: np.ndarray, positions: np.ndarray, components: int = 3) -> float:
    """procrustes_disparity of the table's first principal components (token-centred) onto the tokens' positions:
    whether the PE's main axes lay the tokens out as they lie."""
    centred = table - table.mean(0)
    top = np.linalg.svd(centred, full_matrices=False)[2][:components]
    return procrustes_disparity(centred @ top.T, positions)


def relative_drift(current: np.ndarray, initial: np.ndarray) -> float:
    """‖P_t − P_0‖ / ‖P_0‖: how far the PE moved from its initial value (rich vs lazy learning)."""
    return float(np.linalg.norm(current - initial) / max(np.linalg.norm(initial), 1e-12))
