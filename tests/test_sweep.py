"""The sweep CLI end to end: a tiny real run, and every kind of bad input stopping with one line, exit 2,
and no results folder."""
import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from sweep_harness import refuse_sweep, run_sweep

TINY = ["--task", "lst", "--steps", "4", "--eval-every", "2", "--width", "16", "--depth", "1", "--batch-size", "16",
        "--seeds", "2"]


def test_tiny_sweep_writes_complete_results(tmp_path):
    out = tmp_path / "run"
    proc = run_sweep(*TINY, "--pe", "learned,sin2d,relative", "--sigmas", "0.1,2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    results = pd.read_parquet(out / "results.parquet")
    assert len(results) == 2 * 2 + 2 + 2  # learned × 2 σ × 2 seeds, then sin2d and relative × 2 seeds
    for column in ("task", "pe", "sigma", "seed", "steps", "train_acc", "test_acc", "ood_acc", "ood_acc_binary",
                   "ood_acc_ternary", "ood_acc_quaternary", "pe_rsa", "pe_procrustes", "pe_dist_spearman",
                   "pe_drift", "attn_l0_h0_entropy", "ood_attn_l0_h0_probe_same_row_or_col"):
        assert column in results, column
    assert results["ood_acc"].between(0, 1).all()
    learned = results[results.pe == "learned"]
    assert learned["pe_drift"].notna().all() and results[results.pe == "relative"]["pe_rsa"].isna().all()
    assert set(results[results.pe == "sin2d"]["sigma"].map(math.isnan)) == {True}
    # the paper's attention-map alignment with the sin2d models: every model has maps, hence a score
    assert results["attn_map_alignment"].between(-1, 1).all()
    with np.load(out / "pe_tables.npz") as tables:
        maps = np.stack([tables[f"attention_map_{i}"] for i in results["model_id"]])
    assert maps.shape == (len(results), 1, 16, 16) and np.allclose(maps.sum(-1), 1, atol=1e-5)
    assert "Attention-map alignment with the sin2d models" in (out / "report.md").read_text()
    curves = pd.read_parquet(out / "curves.parquet")
    assert sorted(curves["step"].unique()) == [0, 2, 4]
    # the rank of what was learned: nothing at step 0, then at most the smaller side of the [16 × 16] PE table
    learned_curves = curves[curves.pe == "learned"]
    assert (learned_curves[learned_curves.step == 0][["dpe_rank", "dw_rank_b0"]] == 0).all().all()
    assert learned["dpe_rank"].between(1, 16).all() and results["dw_rank_b0"].between(1, 16).all()
    assert curves[curves.pe == "sin2d"]["dpe_rank"].isna().all()
    assert len(curves) == 3 * len(results)
    config = json.loads((out / "config.json").read_text())
    assert config["settings"]["steps"] == 4 and len(config["models"]) == len(results)
    assert "ood_acc" in proc.stdout  # the summary table
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left
    umask = os.umask(0)
    os.umask(umask)  # results follow the umask (shared folders on a cluster), not mkstemp's 0600
    for path in (out / "results.parquet", out / "config.json", out / "packs" / "0" / "results.parquet"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path
    assert (out / "packs" / "0").stat().st_mode & 0o777 == 0o777 & ~umask


def malformed_puzzles(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("ID,LST_num,condition,puzzles,solutions\n0,,Binary,2000500234001000,4\n1,,Binary,20005,4\n")
    return bad


@pytest.mark.parametrize("flags, message", [
    (["--sigmas", "0.2,-1"], "--sigmas"),
    (["--sigmas", "0"], "--sigmas"),
    (["--pe", "learned,bogus"], "bogus"),
    (["--steps", "0"], "--steps"),
    (["--lst-train", "MALFORMED"], "bad.csv:3"),
    (["--lst-ood", "MALFORMED"], "bad.csv:3"),
    (["--lst-train", "/nonexistent/puzzles.csv"], "does not exist"),
    (["--no-such-flag"], "no-such-flag"),
    (["--sigmas", "abc"], "--sigmas"),
])
def test_bad_input_stops_with_one_line_and_no_folder(tmp_path, flags, message):
    flags = [str(malformed_puzzles(tmp_path)) if f == "MALFORMED" else f for f in flags]
    out = tmp_path / "out"
    proc = refuse_sweep(*TINY, *flags, "--out", str(out))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] in ([], ["bad.csv"])


def test_existing_results_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.parquet").write_text("x")
    proc = run_sweep(*TINY, "--out", str(out))
    assert proc.returncode == 2 and "already exists" in proc.stderr
