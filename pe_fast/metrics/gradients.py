"""Connectivity gradients of an FC matrix, and how a learned PE's principal axes line up with them (issue 19).

`diffusion_gradients` is diffusion-map embedding as BrainSpace 0.3.0 defines it (Vos de Wael et al. 2020,
`GradientMaps(kernel='normalized_angle', approach='dm')`; Margulies et al. 2016), written here in numpy /
scipy so that BrainSpace (and its vtk / scikit-learn) is never imported. The PE metrics take one PE table
P [N, D] (numpy, rows = tokens) and centre it over tokens before the SVD.
"""
from __future__ import annotations

import numpy as np
from scipy import linalg

from pe_fast.data.regions import GRADIENTS

KERNELS = ("normalized_angle", "cosine")


class DisconnectedGraph(ValueError):
    """The thresholded affinity graph has more than one connected piece: no single diffusion embedding."""


def _positive_peak(columns: np.ndarray) -> np.ndarray:
    """Flip each column so that its largest-|value| entry is positive (BrainSpace's sign convention)."""
    peaks = columns[np.abs(columns).argmax(axis=0), np.arange(columns.shape[1])]
    return columns * np.where(peaks < 0, -1.0, 1.0)


def _affinity(fc: np.ndarray, sparsity: float, kernel: str) -> np.ndarray:
    n = len(fc)
    # BrainSpace's count, int() of the float product: 100 rows at sparsity 0.9 keep 9 values, not 10.
    keep = max(1, int(n * (1 - sparsity)))
    top = np.argpartition(fc, n - keep, axis=1)[:, -keep:]
    rows = np.arange(n)[:, None]
    sparse = np.zeros_like(fc)
    sparse[rows, top] = fc[rows, top]
    norms = np.linalg.norm(sparse, axis=1)
    if not np.all(norms > 0):
        raise ValueError(f"FC rows {np.flatnonzero(norms == 0).tolist()} are zero after keeping each row's "
                         f"top {keep} values: gradients need rows with some positive connectivity")
    unit = sparse / norms[:, None]
    cosine = np.clip(unit @ unit.T, -1.0, 1.0)
    affinity = 1 - np.arccos(cosine) / np.pi if kernel == "normalized_angle" else cosine
    return np.maximum(affinity, 0.0)  # BrainSpace zeroes negative affinities (only cosine has them)


def diffusion_gradients(fc: np.ndarray, n_components: int = GRADIENTS, sparsity: float = 0.9,
                        kernel: str = "normalized_angle", alpha: float = 0.5,
                        diffusion_time: float = 0) -> np.ndarray:
    """The first `n_components` connectivity gradients of a square FC matrix, [N, n_components].

    Each row keeps its top (1 − sparsity) share of values (the rest set to 0); the affinity of two rows is
    their normalised angle 1 − arccos(cos θ)/π (or their cosine, negatives set to 0); diffusion maps with
    anisotropic normalisation W_α = D^−α W D^−α and Markov matrix P = D_α^−1 W_α; the trivial eigenvector
    is dropped and the next ones are scaled by λ/(1 − λ) (diffusion_time = 0, all time scales) or λ^t.
    Scale as in BrainSpace: unit-norm right eigenvectors of P divided by the trivial one's constant value.
    Sign: each gradient's largest-|value| entry is positive (BrainSpace's convention).
    """
    fc = np.asarray(fc, dtype=np.float64)
    if fc.ndim != 2 or fc.shape[0] != fc.shape[1]:
        raise ValueError(f"diffusion_gradients needs a square FC matrix, got shape {fc.shape}")
    if not np.isfinite(fc).all():
        raise ValueError("the FC matrix has NaN or infinite values: fill or drop those regions first")
    constant = np.flatnonzero(np.ptp(fc, axis=1) == 0)
    if constant.size:
        raise ValueError(f"FC rows {constant.tolist()} are constant: their top values, and so their "
                         "gradient positions, are undefined; drop those regions first")
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {KERNELS}")
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity is the share of each row set to 0, in [0, 1), got {sparsity}")
    n = len(fc)
    if not 1 <= n_components <= n - 2:
        raise ValueError(f"n_components must be between 1 and {n - 2} for {n} regions, got {n_components}")

    w = _affinity(fc, sparsity, kernel)
    d = w.sum(axis=1)
    w = w / np.outer(d, d) ** alpha
    d_alpha = w.sum(axis=1)
    # P = D_α^−1 W_α is similar to the symmetric S = D_α^−1/2 W_α D_α^−1/2: exact eigh instead of a
    # non-symmetric eigensolver; P's right eigenvectors are S's divided by √d_α.
    s = w / np.sqrt(np.outer(d_alpha, d_alpha))
    lam, phi = linalg.eigh(s, subset_by_index=[n - n_components - 1, n - 1])
    lam, phi = lam[::-1], phi[:, ::-1]
    if lam[1] > 1 - 1e-10:
        raise DisconnectedGraph("the affinity graph is disconnected (a second eigenvalue of 1): "
                         "use kernel='normalized_angle' or a lower sparsity")
    psi = phi / np.sqrt(d_alpha)[:, None]
    psi = psi / np.linalg.norm(psi, axis=0)
    psi = psi[:, 1:] / psi[:, :1]  # the trivial eigenvector is constant; dividing by it sets it to ones
    lam = lam[1:]
    scale = lam / (1 - lam) if diffusion_time <= 0 else lam ** diffusion_time
    return _positive_peak(psi * scale)


def fc_gradients(fc: np.ndarray, n_components: int = GRADIENTS) -> np.ndarray:
    """The gradients pe_fast compares learned PEs with: the cosine kernel, as Margulies et al. 2016 (whose
    Schaefer-100 gradient 1 cubnm ships; ours from cubnm's group FC correlates with it at 0.966, the
    normalised angle's at 0.63, its first two eigenvalues being almost tied), and the normalised angle where
    the cosine graph falls apart into disconnected pieces."""
    try:
        return diffusion_gradients(fc, n_components, kernel="cosine")
    except DisconnectedGraph:
        return diffusion_gradients(fc, n_components, kernel="normalized_angle")


def _centred_svd(table: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(u, s, scale) of the token-centred table: s in units of scale, its largest |entry|, so that the squares of
    the spectrum neither underflow (a table near 1e-310: 0 / 0) nor overflow."""
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2 or not np.isfinite(table).all():
        raise ValueError(f"a PE table must be a finite [N, D] array, got shape {table.shape}")
    centred = table - table.mean(axis=0)
    scale = float(np.abs(centred).max()) if centred.size else 0.0
    if scale == 0:
        raise ValueError("the PE table is the same vector for every token: it has no principal components")
    u, s, _ = np.linalg.svd(centred / scale, full_matrices=False)
    return u, s, scale


def pe_principal_components(table: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """PC scores [N, k] of the token-centred table and each PC's share of its variance [k].
    Sign: each score column's largest-|value| entry is positive."""
    u, s, scale = _centred_svd(table)
    return _positive_peak(u[:, :k] * (s[:k] * scale)), s[:k] ** 2 / np.sum(s ** 2)


def effective_rank(table: np.ndarray) -> float:
    """(Σs)² / Σs² of the token-centred table's singular values: 1 for rank 1, k for k equal ones."""
    _, s, _ = _centred_svd(table)
    return float(s.sum() ** 2 / np.sum(s ** 2))


def pc1_share(table: np.ndarray) -> float:
    """s₁² / Σs²: the first principal component's share of the token-centred table's variance."""
    _, s, _ = _centred_svd(table)
    return float(s[0] ** 2 / np.sum(s ** 2))


def rank_metrics(table: np.ndarray) -> dict[str, float]:
    """The results columns of the PE's spectrum. Low rank = a PE organised along few axes, as rich training from
    a small initialisation predicts; a large-σ PE stays near full-rank noise."""
    return {"pe_effective_rank": effective_rank(table), "pe_pc1_share": pc1_share(table)}


def _abs_correlations(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|Pearson r| between every column of a [N, p] and every column of b [N, q], as [p, q]; NaN for a constant
    column, which has no correlation."""
    with np.errstate(divide="ignore", invalid="ignore"):
        za = (a - a.mean(0)) / a.std(0)
        zb = (b - b.mean(0)) / b.std(0)
    return np.abs(za.T @ zb) / len(a)


def gradient_alignment(table: np.ndarray, gradients: np.ndarray, n_pcs: int = 5) -> list[tuple[float, int]]:
    """For each gradient column, (best |Pearson r| with any of the PE's first n_pcs PC scores, that PC's
    0-based index). PCs with no variance (beyond the table's rank) are left out."""
    gradients = np.asarray(gradients, dtype=np.float64).reshape(len(gradients), -1)
    u, s, _ = _centred_svd(table)
    n_pcs = min(n_pcs, int(np.sum(s > s[0] * 1e-10)))
    r = _abs_correlations(gradients, u[:, :n_pcs])
    return [(float(row.max()), int(row.argmax())) for row in r]


def grid_axis_alignment(table: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[float, float]:
    """(R² of the row coordinate, R² of the column coordinate), each regressed on the PE's top two PC scores.

    R² rather than the best single-PC |r|: on a square grid the row and column axes carry equal variance,
    so PC1 and PC2 may be any rotation within their plane; R² measures the plane and ignores the rotation.
    The two PCs are uncorrelated, so R² = r(PC1, axis)² + r(PC2, axis)². Random tables give about 2/N.
    """
    u, s, _ = _centred_svd(table)
    k = min(2, int(np.sum(s > s[0] * 1e-10)))
    r = _abs_correlations(np.column_stack([rows, cols]).astype(np.float64), u[:, :k])
    return float(np.sum(r[0] ** 2)), float(np.sum(r[1] ** 2))
