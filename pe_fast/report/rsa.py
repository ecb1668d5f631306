"""The learned PEs as rsatoolbox RDMs (the authors compare representations with rsatoolbox), and the report's
rank-correlation table (issue 16 item 4). Optional: `pip install "pe_fast[rsa]"`.

* A model's RDM: 1 − the cosine similarity of its first PE table's rows (the table pe_rsa reads), one
  dissimilarity per token pair.
* The ground truth's RDMs: LST, the tokens' Euclidean distances on the 4 × 4 grid; fMRI / netsim (from
  DIR/ground_truth.npz), 1 − FC and, where the regions have centroids, their Euclidean distances.
* `rank_table`: per (PE, σ) and ground truth, rsatoolbox's rank correlation ρ_a (Spearman's ρ normalised as
  without ties, Schütt et al. 2023: the grid's many tied distances would otherwise shrink the scale) of each
  model's RDM with the ground truth's, the mean over the models (seeds) and a 95 % bootstrap interval over them.
"""
from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.spatial.distance import pdist

from pe_fast.results import run_folder
from pe_fast.metrics.pe_geometry import cosine_similarity_matrix, upper_triangle
from pe_fast.results.reading import Run, read_ground_truth
from pe_fast.tasks import KINDS

RDMS_FILE = run_folder.RDMS
BOOTSTRAP_DRAWS = 2000


def available() -> bool:
    return importlib.util.find_spec("rsatoolbox") is not None


def ground_truth_dissimilarities(task: str, directory: Path) -> dict[str, np.ndarray]:
    """Name -> the ground truth's dissimilarities, upper triangle, in pdist's pair order."""
    if (fixed := KINDS[task].view.fixed_geometry) is not None:
        name, coordinates = fixed
        return {name: pdist(coordinates())}
    path = directory / run_folder.GROUND_TRUTH
    if not path.is_file():
        return {}
    truth = read_ground_truth(path)  # the one reader of the file, with its checks
    found = {"1 − FC": upper_triangle(1 - truth["fc"])} if "fc" in truth else {}
    if "centroids" in truth:
        found["3D distance"] = pdist(truth["centroids"])
    return found


def model_dissimilarities(run: Run) -> tuple[pd.DataFrame, np.ndarray]:
    """(the trained models that have a PE table: results rows, their RDMs [models, pairs])."""
    models = run.results[[run_folder.pe_table_key(i) in run.pe_tables for i in run.results["model_id"]]]
    rdms = [upper_triangle(1 - cosine_similarity_matrix(run.pe_tables[run_folder.pe_table_key(i)][0]))
            for i in models["model_id"]]
    # no PE tables (a folder kept without pe_tables.npz, as docs/results keeps them): no RDMs, an empty [0, 0]
    return models.reset_index(drop=True), (np.array(rdms) if rdms else np.empty((0, 0)))


def hdf5_text(text: str) -> str:
    """A descriptor as rsatoolbox's HDF5 files hold it: ASCII (it writes strings as bytes), so "1 − FC" is "1 - FC"
    there."""
    return text.replace("\u2212", "-").encode("ascii", "replace").decode("ascii")


def as_rdms(run: Run, task: str, directory: Path):
    """Every model's RDM, then the ground truth's, as one rsatoolbox RDMs object with descriptors (kind: model /
    ground truth; name; pe, sigma, seed, model_id for the models)."""
    from rsatoolbox.rdm import RDMs
    models, rdms = model_dissimilarities(run)
    truth = ground_truth_dissimilarities(task, directory)
    count = len(models) + len(truth)
    return RDMs(np.vstack([rdms, *truth.values()]) if count else np.zeros((0, 0)),
                dissimilarity_measure="1 − cosine similarity (models)",
                rdm_descriptors={"kind": ["model"] * len(models) + ["ground truth"] * len(truth),
                                 "name": [run_folder.pe_table_key(i) for i in models["model_id"]] + [
                                     hdf5_text(name) for name in truth],
                                 "pe": list(models["pe"]) + [""] * len(truth),
                                 "sigma": list(models["sigma"].astype(float)) + [np.nan] * len(truth),
                                 "seed": list(models["seed"].astype(float)) + [np.nan] * len(truth),
                                 "model_id": list(models["model_id"].astype(int)) + [-1] * len(truth)})


def export(run: Run, task: str, directory: Path) -> Path:
    path = directory / RDMS_FILE
    rdms = as_rdms(run, task, directory)
    with tempfile.TemporaryDirectory() as private:  # rsatoolbox writes to a path: its own, then copied in
        rdms.save(str(Path(private) / RDMS_FILE), file_type="hdf5", overwrite=True)
        written = (Path(private) / RDMS_FILE).read_bytes()
    run_folder.write_atomic(path, lambda file: file.write(written), under=directory)
    return path


def bootstrap_interval(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean, resampling the values (models) with replacement."""
    if len(values) < 2:
        return np.nan, np.nan
    draws = np.random.default_rng(seed).choice(values, size=(BOOTSTRAP_DRAWS, len(values))).mean(1)
    return float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def rank_table(run: Run, task: str, directory: Path) -> pd.DataFrame:
    """Per (PE, σ, ground truth): models, mean ρ_a, and its 95 % bootstrap interval over the models."""
    from rsatoolbox.rdm import RDMs, compare
    models, rdms = model_dissimilarities(run)
    rows = []
    for name, truth in ground_truth_dissimilarities(task, directory).items():
        if not len(models):
            break
        rho = compare(RDMs(rdms), RDMs(truth[None]), method="rho-a")[:, 0]
        for (pe, sigma), group in models.groupby(["pe", "sigma"], dropna=False, sort=False):
            values = rho[group.index]
            low, high = bootstrap_interval(values)
            rows.append({"pe": pe, "sigma": sigma, "ground_truth": name, "models": len(values),
                         "rho_a": float(values.mean()), "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows)
