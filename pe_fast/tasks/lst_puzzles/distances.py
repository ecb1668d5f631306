"""Jaccard distances between puzzles, as sets of (cell, shape) pairs of their non-blank cells: how far the
generalisation set lies from the training puzzles."""
from __future__ import annotations

import numpy as np

from pe_fast.tasks.lst_puzzles.puzzles import NUM_CELLS, NUM_SYMBOLS, grid_array

def _element_matrix(grids) -> np.ndarray:
    """Each grid as the indicator of its (cell, symbol) pairs, [P,80] float32 (blank = no element)."""
    g = grid_array(grids)
    onehot = np.zeros((len(g), NUM_CELLS, NUM_SYMBOLS + 1), dtype=np.float32)
    np.put_along_axis(onehot, g[:, :, None], 1.0, axis=2)
    return onehot[:, :, 1:].reshape(len(g), -1)


def _intersections_unions(a: np.ndarray, b: np.ndarray, sb: np.ndarray):
    # Counts are small integers, exact in float32, so BLAS can do the set intersections.
    inter = a @ b.T
    union = a.sum(axis=1)[:, None] + sb[None, :] - inter
    return inter, union


def jaccard_distance_matrix(a_grids, b_grids, chunk_rows: int = 2048) -> np.ndarray:
    """Jaccard distances [len(a), len(b)] (float64) between the sets of (cell, symbol) pairs of the
    non-blank cells (the query included). Two empty grids are at distance 0."""
    a, b = _element_matrix(a_grids), _element_matrix(b_grids)
    sb = b.sum(axis=1)
    out = np.empty((len(a), len(b)), dtype=np.float64)
    for start in range(0, len(a), chunk_rows):
        inter, union = _intersections_unions(a[start : start + chunk_rows], b, sb)
        inter, union = inter.astype(np.float64), union.astype(np.float64)
        # (union - inter) / union is one correctly rounded division, so exact fractions such as
        # 4/5 compare equal to the literal 0.8.
        out[start : start + chunk_rows] = np.divide(union - inter, union, out=np.zeros_like(union), where=union > 0)
    return out


def nearest_jaccard_distance(a_grids, b_grids, chunk_rows: int = 1024) -> np.ndarray:
    """For each grid of ``a``, its smallest Jaccard distance to any grid of ``b`` ([len(a)] float64)."""
    a, b = _element_matrix(a_grids), _element_matrix(b_grids)
    out = np.full(len(a), np.inf)
    if len(b) == 0:
        return out
    sb = b.sum(axis=1)
    for start in range(0, len(a), chunk_rows):
        inter, union = _intersections_unions(a[start : start + chunk_rows], b, sb)
        # Find the most similar grid in float32 (distinct fractions with denominators <= 160 differ
        # far more than float32 rounding), then compute its distance exactly in float64.
        similarity = np.divide(inter, union, out=np.ones_like(inter), where=union > 0)
        nearest = similarity.argmax(axis=1)
        rows = np.arange(len(inter))
        i = inter[rows, nearest].astype(np.float64)
        u = union[rows, nearest].astype(np.float64)
        out[start : start + len(inter)] = np.divide(u - i, u, out=np.zeros_like(u), where=u > 0)
    return out

