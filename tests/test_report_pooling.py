"""`python -m pe_fast.report A B ... --out DIR`: sweeps of one configuration pooled as one run. The reference is a
sweep that trained the same models together: pooled folders must give its models, PE tables and paired
differences. Folders that did not train alike are refused with one line, before anything is written."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pe_fast
from pe_fast import report
from pe_fast.results import run_folder
from pe_fast.report.numbers import paired_difference
from pe_fast.sweep import grid
from sweep_harness import TINY_NETSIM, run_sweep, sweep_results

NETSIM = [*TINY_NETSIM, "--sigmas", "0.1,1", "--steps", "12", "--eval-every", "6", "--warmup", "0", "--threads", "1",
          "--eval-items", "64"]
KEY = ["pe", "sigma", "seed"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One sweep of learned and random PEs × 2 seeds, and the same models in three folders: the learned PE, the
    random PE's first seed, its second seed (added by value, as a user adds a seed)."""
    root = tmp_path_factory.mktemp("pooling")
    folders = {"together": ["--pe", "learned,random", "--seeds", "2"],
               "learned": ["--pe", "learned", "--seeds", "2"],
               "random-1": ["--pe", "random", "--seeds", "1"],
               "random-2": ["--pe", "random", "--seed-values", str(grid.AUTHOR_SEEDS[1])]}
    for name, flags in folders.items():
        sweep_results(root / name, *NETSIM, *flags)
    return root


def models(results: pd.DataFrame) -> pd.DataFrame:
    return results[results["pe"].isin(["learned", "random"])].sort_values(KEY).reset_index(drop=True)


def test_pooled_folders_are_the_sweep_that_trained_them_together(runs):
    out = runs / "pooled"
    typed = subprocess.run([sys.executable, "-m", "pe_fast.report", str(runs / "learned"), str(runs / "random-1"),
                            str(runs / "random-2"), "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert typed.returncode == 0, typed.stderr
    pooled, together = (pd.read_parquet(folder / run_folder.RESULTS) for folder in (out, runs / "together"))
    assert pooled["model_id"].is_unique and len(pooled) == len(together)  # 8 models and the same baseline rows
    a, b = models(pooled), models(together)
    assert a[KEY].equals(b[KEY])
    for column in ("train_mse", "test_mse", "test_r2", "pe_fc_corr"):  # the pack size changes the matmuls' blocking
        np.testing.assert_allclose(a[column], b[column], rtol=1e-4, atol=1e-6, err_msg=column)

    # each pooled model's PE table is its own folder's, under its new id
    tables = dict(np.load(out / run_folder.PE_TABLES))
    for name in ("learned", "random-1", "random-2"):
        source = pd.read_parquet(runs / name / run_folder.RESULTS)
        source_tables = dict(np.load(runs / name / run_folder.PE_TABLES))
        for row in models(source).itertuples():
            new = a.loc[(a["pe"] == row.pe) & (a["sigma"] == row.sigma) & (a["seed"] == row.seed), "model_id"].item()
            np.testing.assert_array_equal(tables[f"model_{new}"], source_tables[f"model_{row.model_id}"])

    # the report pairs the learned PE with the random one of the same seed, across folders
    learned, fixed = (a[(a["pe"] == pe) & (a["sigma"] == 0.1)].set_index("seed")["test_r2"] for pe in ("learned",
                                                                                                          "random"))
    mean, low, high, n = paired_difference(learned, fixed)
    assert n == 2
    assert (f"learned − random (training the PE) at σ=0.1: {mean:+.3f} (95 % CI {low:+.3f} to {high:+.3f}, 2 seeds)"
            in (out / run_folder.REPORT).read_text())
    rows = [line.split() for line in (out / run_folder.SUMMARY).read_text().splitlines()[1:]]
    assert sorted((pe, sigma, seeds) for pe, sigma, seeds, *_ in rows if pe in ("learned", "random")) == [
        (pe, sigma, "2") for pe in ("learned", "random") for sigma in ("0.1", "1")]  # both seeds of every (PE, σ)

    config = run_folder.read_config(out)
    assert config["settings"]["pe"] == ["learned", "random"] and config["settings"]["seeds"] == 2
    assert config[run_folder.POOLED_FROM] == [str((runs / n).resolve()) for n in ("learned", "random-1", "random-2")]
    resumed = run_sweep("--resume", "--out", str(out))
    assert resumed.returncode == 2 and "nothing to continue" in resumed.stderr, resumed.stderr


def test_folders_that_did_not_train_alike_are_refused(runs, tmp_path, capsys):
    longer = tmp_path / "longer"
    sweep_results(longer, *[f if f != "12" else "18" for f in NETSIM], "--pe", "random", "--seeds", "1")
    dropout = tmp_path / "dropout"
    sweep_results(dropout, *NETSIM, "--pe", "random", "--seed-values", str(grid.AUTHOR_SEEDS[1]), "--pe-dropout",
                  "0.1", "--pe-dropout-on", "random")
    not_empty = tmp_path / "not-empty"
    not_empty.mkdir()
    (not_empty / "notes.txt").write_text("mine")
    big = [tmp_path / f"big-seed-{i}" for i in range(2)]  # 16777217 and 16777216 alike in float32 and in :g
    for folder in big:
        sweep_results(folder, *NETSIM, "--pe", "learned", "--sigmas", "0.1", "--seed-values", "16777217")
    learned, random_1 = str(runs / "learned"), str(runs / "random-1")
    link = tmp_path / "learned-again"
    link.symlink_to(learned, target_is_directory=True)
    cases = (([learned, str(longer)], "trained with steps = 18"),
             ([learned, str(runs / "together")], "is in more than one folder"),
             ([str(folder) for folder in big], "seed 16777217 is in more than one folder"),
             ([random_1, str(dropout)], "random trained with PE dropout 0.1"),
             ([learned], "two or more"),
             ([learned, learned], f"{Path(learned).resolve()} is named twice; name each folder once"),
             ([learned, str(link)], f"{Path(learned).resolve()} is named twice (as {learned} and as {link})"))
    for i, (folders, message) in enumerate(cases):
        out = tmp_path / f"out-{i}"
        assert report.main([*folders, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
        assert not out.exists()
    assert report.main([learned, random_1, "--out", str(not_empty)]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert sorted(p.name for p in not_empty.iterdir()) == ["notes.txt"]
    assert report.main([learned, random_1, "--out"]) == 2 and "usage" in capsys.readouterr().err


def test_a_pooled_folder_whose_config_was_edited_is_refused(runs, tmp_path, capsys):
    """A pooled folder records what its models trained with (trained_with.json, in its digests), as each pack of a
    sweep does: a config.json edited since (steps, lr) was read by the report and load_run as if the models had
    trained so; only run.model, which opens the source folders, refused it."""
    out = tmp_path / "pooled"
    assert report.main([str(runs / "learned"), str(runs / "random-1"), "--out", str(out)]) == 0
    capsys.readouterr()
    assert pe_fast.load_run(out).results["model_id"].is_unique  # untouched, it reads
    config = run_folder.read_config(out)
    config["settings"]["steps"] = 5000
    (out / run_folder.CONFIG).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="says --steps 5000, not 12 as .*trained_with.json records"):
        pe_fast.load_run(out)
    assert report.main([str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--steps 5000, not 12" in err, err
