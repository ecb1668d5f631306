"""Pearson's and Spearman's correlation of two vectors, in float64 numpy.

scipy.stats gives both, but importing it cost every sweep and report process about 1.3 s on a 2-core AVX2 machine
(python -X importtime), more than all of pe_fast's own modules; the evaluations and the report need only these two.
Both follow scipy.stats's conventions: NaN where a vector is constant or holds a NaN (Spearman ranks ±inf as the
extremes they are, Pearson's mean of them is not a number).
"""
from __future__ import annotations

import numpy as np


def _pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same length, got {x.size} and {y.size}")
    return x, y


def pearson(x, y) -> float:
    """Pearson's r of x and y; NaN where either is constant or not finite (or shorter than 2)."""
    x, y = _pair(x, y)
    if x.size < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return float("nan")
    if (x == x[0]).all() or (y == y[0]).all():  # tested so: a constant's mean need not round to its value
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    x_max, y_max = np.abs(x).max(), np.abs(y).max()
    x, y = x / x_max, y / y_max  # scaled to 1 first: the squares of values near float64's range would overflow
    return float(np.clip(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)), -1.0, 1.0))


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of x's values, ties sharing the mean of their ranks (scipy.stats.rankdata's 'average')."""
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # first index of each run of equal values
    ends = np.r_[starts[1:], x.size]
    mean_rank = (starts + ends + 1) / 2.0  # ranks starts+1 .. ends, averaged
    ranks = np.empty(x.size)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(x, y) -> float:
    """Spearman's ρ of x and y: Pearson's r of their average ranks; NaN where either holds a NaN or is constant."""
    x, y = _pair(x, y)
    if np.isnan(x).any() or np.isnan(y).any():
        return float("nan")
    return pearson(average_ranks(x), average_ranks(y))
