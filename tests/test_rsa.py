"""RSA through rsatoolbox (pe_fast.report.rsa) and the PE metrics against independent implementations: pe_rsa
against rsatoolbox's Pearson RDM comparison, pe_modularity against networkx, the report's ρ_a against its
closed form on ranks, and the exported RDMs read back."""
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

rsatoolbox = pytest.importorskip("rsatoolbox")
networkx = pytest.importorskip("networkx")
from rsatoolbox.rdm import RDMs, compare, load_rdm  # noqa: E402
from scipy.spatial.distance import pdist  # noqa: E402
from scipy.stats import rankdata  # noqa: E402

from pe_fast.metrics import modules, pe_geometry  # noqa: E402
from pe_fast.metrics.pe_geometry import cosine_similarity_matrix, upper_triangle  # noqa: E402
from pe_fast.report import rsa  # noqa: E402
from pe_fast.results.reading import Run  # noqa: E402
from pe_fast.tasks.lst import grid_coordinates  # noqa: E402


def test_pe_rsa_is_rsatoolbox_pearson_between_the_pe_and_grid_rdms():
    rng = np.random.default_rng(0)
    grid = grid_coordinates()
    for table in (rng.normal(size=(16, 32)), np.hstack([grid, rng.normal(scale=0.3, size=(16, 6))])):
        pe = RDMs(upper_triangle(1 - cosine_similarity_matrix(table))[None])
        truth = RDMs(pdist(grid)[None])
        assert pe_geometry.rsa(table, grid) == pytest.approx(compare(pe, truth, method="corr")[0, 0], abs=1e-10)


def test_pe_modularity_is_networkx_modularity_of_the_positive_weights():
    rng = np.random.default_rng(1)
    for trial in range(5):
        n = 12
        similarity = rng.normal(size=(n, n))
        similarity = (similarity + similarity.T) / 2
        partition = rng.integers(0, 3, size=n)
        graph = networkx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_weighted_edges_from((i, j, similarity[i, j]) for i, j in itertools.combinations(range(n), 2)
                                      if similarity[i, j] > 0)
        communities = [set(np.flatnonzero(partition == c)) for c in np.unique(partition)]
        expected = networkx.community.modularity(graph, communities, weight="weight")
        assert modules.newman_modularity(similarity, partition) == pytest.approx(expected, abs=1e-12)


def rho_a(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ_a (Schütt et al. 2023): average ranks, normalised as if there were no ties,
    12 Σ (r_x − (n+1)/2)(r_y − (n+1)/2) / (n³ − n)."""
    n = len(x)
    return float(12 * np.sum((rankdata(x) - (n + 1) / 2) * (rankdata(y) - (n + 1) / 2)) / (n ** 3 - n))


def lst_run(tmp_path: Path) -> Run:
    rng = np.random.default_rng(2)
    grid = grid_coordinates()
    rows, tables = [], {}
    for model_id, (pe, sigma, noise) in enumerate([("learned", 0.1, 0.2)] * 3 + [("learned", 2.0, 5.0)] * 3):
        rows.append({"task": "lst", "model_id": model_id, "pe": pe, "sigma": sigma, "seed": model_id, "ood_acc": 0.5})
        tables[f"model_{model_id}"] = np.hstack([grid, rng.normal(scale=noise, size=(16, 6))])[None]
    rows.append({"task": "lst", "model_id": 6, "pe": "none", "sigma": np.nan, "seed": 0, "ood_acc": 0.5})  # no PE
    return Run({"settings": {"task": "lst"}}, pd.DataFrame(rows), pd.DataFrame(), tables, [])


def test_rank_table_is_the_mean_rho_a_over_seeds_with_a_bootstrap_interval(tmp_path):
    run = lst_run(tmp_path)
    table = rsa.rank_table(run, "lst", tmp_path)
    assert list(table["sigma"]) == [0.1, 2.0] and list(table["models"]) == [3, 3]
    truth = pdist(grid_coordinates())
    for row in table.itertuples():
        ids = [i for i in range(6) if (i < 3) == (row.sigma == 0.1)]
        rhos = [rho_a(upper_triangle(1 - cosine_similarity_matrix(run.pe_tables[f"model_{i}"][0])), truth)
                for i in ids]
        assert row.rho_a == pytest.approx(np.mean(rhos), abs=1e-12)
        assert row.ci_low <= row.rho_a <= row.ci_high and min(rhos) <= row.ci_low
    assert table.loc[0, "rho_a"] > table.loc[1, "rho_a"]  # the grid-like PEs rank-correlate more


def test_report_rdms_exports_every_model_and_the_ground_truth(tmp_path):
    run = lst_run(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(run.config))
    run.results.to_parquet(tmp_path / "results.parquet")
    np.savez(tmp_path / "pe_tables.npz", **run.pe_tables)
    proc = subprocess.run([sys.executable, "-m", "pe_fast.report", str(tmp_path), "--rdms"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rdms = load_rdm(str(tmp_path / "rdms.hdf5"))
    assert list(rdms.rdm_descriptors["kind"]) == ["model"] * 6 + ["ground truth"]
    assert np.allclose(rdms.dissimilarities[-1], pdist(grid_coordinates()))
    assert np.allclose(rdms.dissimilarities[4], upper_triangle(1 - cosine_similarity_matrix(run.pe_tables["model_4"][0])))
    assert "## RSA with rsatoolbox" in (tmp_path / "report.md").read_text()


def test_rdms_of_a_run_with_fc_and_centroids_export_and_read_back(tmp_path):
    """The ground truth of fMRI and netsim runs is named "1 − FC" (a minus sign, not ASCII), which rsatoolbox's
    HDF5 writer could not encode: `--rdms` on an untouched netsim run ended in a UnicodeEncodeError."""
    rng = np.random.default_rng(0)
    n = 12
    fc = np.corrcoef(rng.normal(size=(n, 40)))
    np.savez(tmp_path / "ground_truth.npz", fc=fc, centroids=rng.normal(size=(n, 3)))
    rows = [{"task": "netsim", "model_id": i, "pe": "learned", "sigma": 0.5, "seed": i} for i in range(2)]
    tables = {f"model_{i}": rng.normal(size=(1, n, 8)) for i in range(2)}
    run = Run({"settings": {"task": "netsim"}}, pd.DataFrame(rows), pd.DataFrame(), tables, [])
    rdms = load_rdm(str(rsa.export(run, "netsim", tmp_path)))
    assert list(rdms.rdm_descriptors["name"]) == ["model_0", "model_1", "1 - FC", "3D distance"]  # ASCII there
    assert np.allclose(rdms.dissimilarities[2], upper_triangle(1 - fc))
