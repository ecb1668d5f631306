"""PE-geometry metrics against closed forms and scipy's independent implementations."""
import numpy as np
from scipy.spatial import procrustes
from scipy.stats import special_ortho_group

from pe_fast.metrics import pe_geometry

GRID = np.stack(np.divmod(np.arange(16), 4), axis=1).astype(float)


def test_procrustes_disparity_equals_scipy_and_ignores_rotation_scale_and_shift():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(16, 5)), rng.normal(size=(16, 5))
    assert np.isclose(pe_geometry.procrustes_disparity(a, b), procrustes(a, b)[2])
    rotated = 3.0 * a @ special_ortho_group.rvs(5, random_state=1) + 7.0
    assert pe_geometry.procrustes_disparity(rotated, a) < 1e-12


def test_procrustes_pads_the_narrower_table():
    embedded = np.pad(GRID, ((0, 0), (0, 6))) @ special_ortho_group.rvs(8, random_state=2)
    assert pe_geometry.procrustes_disparity(embedded, GRID) < 1e-12


def test_grid_coordinates_as_pe_score_perfectly_on_distance_spearman():
    assert np.isclose(pe_geometry.distance_spearman(GRID * 2.5 + 1, GRID), 1.0)


def test_rsa_is_pearson_of_cosine_similarity_and_negative_distance():
    rng = np.random.default_rng(2)
    table = rng.normal(size=(16, 8))
    sims, dists = [], []
    for i in range(16):
        for j in range(i + 1, 16):
            sims.append(table[i] @ table[j] / np.linalg.norm(table[i]) / np.linalg.norm(table[j]))
            dists.append(-np.linalg.norm(GRID[i] - GRID[j]))
    assert np.isclose(pe_geometry.rsa(table, GRID), np.corrcoef(sims, dists)[0, 1])


def test_random_tables_score_near_zero_and_drift_is_relative():
    rng = np.random.default_rng(3)
    scores = [pe_geometry.rsa(rng.normal(size=(16, 64)), GRID) for _ in range(50)]
    assert abs(np.mean(scores)) < 0.05
    p0 = rng.normal(size=(16, 4))
    assert np.isclose(pe_geometry.relative_drift(p0 * 1.5, p0), 0.5)
