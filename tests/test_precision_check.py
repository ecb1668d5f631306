"""bench/science/precision_check.py, issue 13's precision verdict: checked on hand-made results whose verdicts
follow from the stated rules, on the first H100 science check (its sweeps' own summary.txt gives the means), and on bad
input; its main runs in the test's process (a process of its own spends 5 s starting Python and importing torch,
pandas and scipy), and once as the program a user types."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "science" / "precision_check.py"
H100_SCIENCE = ROOT / "bench" / "results" / "h100-20261126-sweep" / "science"


_spec = importlib.util.spec_from_file_location("precision_check", SCRIPT)
precision_check = sys.modules["precision_check"] = importlib.util.module_from_spec(_spec)  # (its dataclasses)
_spec.loader.exec_module(precision_check)


def run(*args) -> subprocess.CompletedProcess:
    """The script with these arguments, its main called here: exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = precision_check.main([str(a) for a in args])
        except SystemExit as exit_:  # argparse's own refusals
            code = exit_.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_as_a_program(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)


def write_runs(folder: Path, rows: list[tuple]) -> None:
    """rows: (precision, pe, sigma, seed, train_acc, test_acc, ood_acc) as fractions; one results file per
    precision, as the sweeps write them."""
    frame = pd.DataFrame(rows, columns=["precision", "pe", "sigma", "seed", "train_acc", "test_acc", "ood_acc"])
    frame["task"] = "lst"
    for precision, runs in frame.groupby("precision"):
        (folder / precision).mkdir(parents=True)
        runs.to_parquet(folder / precision / "results.parquet")


def grid(precision: str, small: list[float], large: list[float], large_fit: float = 0.96) -> list[tuple]:
    """learned σ 0.2 and 2.0 over three seeds with the given generalisation accuracies."""
    seeds = (2235, 6312, 6068)
    return ([(precision, "learned", 0.2, s, 1.0, 0.98, a) for s, a in zip(seeds, small)]
            + [(precision, "learned", 2.0, s, large_fit, 0.80, a) for s, a in zip(seeds, large)])


def test_faithful_when_within_every_tolerance(tmp_path):
    # σ 2.0: fp32 0.36 / 0.38 / 0.40 (sd 1.63 points), bf16 0.37 / 0.39 / 0.41: +1.0 point, within the sd
    write_runs(tmp_path, grid("fp32", [0.84, 0.86, 0.88], [0.36, 0.38, 0.40])
               + grid("bf16", [0.84, 0.86, 0.88], [0.37, 0.39, 0.41], large_fit=0.955))
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "bf16: faithful to fp32" in result.stdout
    assert run_as_a_program(tmp_path).stdout == result.stdout  # as a user types it: the same report
    # the paired difference is exactly +1.0 at every seed: a zero-width interval
    assert "| learned σ = 2 | 3 | 96.0 ± 0.0 / 95.5 ± 0.0 |" in result.stdout
    assert "+1.0 (+1.0 to +1.0)" in result.stdout


def test_each_rule_can_fail(tmp_path):
    # σ 2.0 in bf16: training 1.5 points lower, generalisation 0.30 / 0.32 / 0.34 = −6 points against a larger sd
    # of 1.63; σ 0.2 in bf16 drops to 0.30 / 0.32 / 0.34 as well, below σ 2.0's 0.36 … 0.40 in fp32 → the ranking
    write_runs(tmp_path, grid("fp32", [0.84, 0.86, 0.88], [0.36, 0.38, 0.40])
               + grid("bf16", [0.30, 0.31, 0.32], [0.33, 0.32, 0.34], large_fit=0.945))
    verdict = run(tmp_path).stdout.splitlines()[-1]
    assert verdict.startswith("bf16: NOT faithful to fp32")
    assert "ranking learned σ = 2 > learned σ = 0.2 against learned σ = 0.2 > learned σ = 2" in verdict
    assert "learned σ = 2 training accuracy -1.50 points" in verdict
    assert "learned σ = 2 generalisation -5.00 points (seed-sd 1.63)" in verdict
    assert "learned σ = 0.2 generalisation -55.00 points" in verdict


def test_each_precision_gets_its_own_verdict(tmp_path):
    write_runs(tmp_path, grid("fp32", [0.84, 0.86, 0.88], [0.36, 0.38, 0.40])
               + grid("bf16", [0.84, 0.86, 0.88], [0.30, 0.32, 0.34])
               + grid("fp16", [0.84, 0.86, 0.88], [0.37, 0.39, 0.41]))
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "train acc fp32 / bf16 / fp16" in result.stdout
    verdicts = result.stdout.splitlines()[-2:]
    assert verdicts[0].startswith("bf16: NOT faithful to fp32") and verdicts[1].startswith("fp16: faithful to fp32")


def test_missing_settings_are_named(tmp_path):
    write_runs(tmp_path, grid("fp32", [0.84, 0.86, 0.88], [0.36, 0.38, 0.40])
               + grid("bf16", [0.84, 0.86, 0.88], [0.36, 0.38, 0.40])[:3])
    result = run(tmp_path)
    assert "not the same settings as the reference" in result.stdout.splitlines()[-1]
    assert "| learned σ = 2 | 3 | 96.0 ± 0.0 / – |" in result.stdout


def test_first_h100_check_matches_its_sweeps_summaries():
    """The sweeps' own summary.txt (written by the sweep, not by this script) holds each setting's train, held-out
    and generalisation accuracy as mean ± sd in %: the table must show the same, fp32 first."""
    out = run(H100_SCIENCE).stdout
    for pe in ("learned", "sin2d"):
        summaries = {precision: (H100_SCIENCE / f"{precision}-{pe}" / "summary.txt").read_text().splitlines()[1:]
                     for precision in ("fp32", "bf16")}
        for fp32_row, bf16_row in zip(summaries["fp32"], summaries["bf16"]):
            fp32_cells = re.findall(r"\d+\.\d ± \d+\.\d", fp32_row)[:3]
            bf16_cells = re.findall(r"\d+\.\d ± \d+\.\d", bf16_row)[:3]
            for a, b in zip(fp32_cells, bf16_cells):
                assert f"{a} / {b}" in out
    assert "**84.4 ± 3.4 / 84.0 ± 3.4**" in out  # σ 0.2's generalisation, as docs/reproduction.md quotes it


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "no results.parquet under"),
    (lambda d: write_runs(d, grid("fp32", [0.8] * 3, [0.4] * 3)), "only fp32 runs: nothing to compare"),
    (lambda d: write_runs(d, grid("bf16", [0.8] * 3, [0.4] * 3)), "no fp32 runs to compare with"),
    (lambda d: (d / "x").mkdir() or (d / "x" / "results.parquet").write_text("not parquet"),
     "not a readable parquet file"),
    (lambda d: write_runs(d / "a", grid("fp32", [0.8] * 3, [0.4] * 3)) or write_runs(d / "b", grid("fp32", [0.8] * 3,
                                                                                                   [0.4] * 3)),
     "two results for fp32 learned σ = 0.2 seed 2235"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, make, message):
    make(tmp_path)
    result = run(tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1 and not result.stdout


def test_other_tasks_are_refused(tmp_path):
    frame = pd.DataFrame({"task": ["fmri"], "precision": ["fp32"], "pe": ["learned"], "sigma": [0.1], "seed": [1],
                          "train_acc": [1.0], "test_acc": [1.0], "ood_acc": [1.0]})
    frame.to_parquet(tmp_path / "results.parquet")
    result = run(tmp_path)
    assert result.returncode == 2 and "defined on LST runs" in result.stderr


def test_verdicts_json_for_the_speed_records(tmp_path):
    """--verdicts writes what bench_sweep_gpu.py --science-check quotes per precision: fp16 within every tolerance
    passes, bf16 with the ranking turned fails, the reference passes by definition."""
    runs = tmp_path / "runs"
    write_runs(runs, grid("fp32", [0.84, 0.86, 0.88], [0.36, 0.38, 0.40])
               + grid("fp16", [0.84, 0.86, 0.88], [0.37, 0.39, 0.41], large_fit=0.955)
               + grid("bf16", [0.30, 0.31, 0.32], [0.33, 0.32, 0.34], large_fit=0.945))
    out = tmp_path / "verdicts.json"
    result = run(runs, "--verdicts", out)
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == {"reference": "fp32",
                                           "verdicts": {"fp32": "pass", "bf16": "fail", "fp16": "pass"}}


def test_by_folder_compares_compute_paths_of_one_precision(tmp_path):
    """--by folder (gpu_check.sh's science_paths step): the first folder under FOLDER names the run, here two
    compute paths in tf32; the same −6-point σ 2.0 gap as above fails the same rule."""
    rows = grid("tf32", [0.84, 0.86, 0.88], [0.36, 0.38, 0.40]) + grid("tf32", [0.84, 0.86, 0.88], [0.30, 0.32, 0.34])
    frame = pd.DataFrame(rows, columns=["precision", "pe", "sigma", "seed", "train_acc", "test_acc", "ood_acc"])
    frame["task"] = "lst"
    for path, runs in (("triton", frame.iloc[:6]), ("fused", frame.iloc[6:])):
        (tmp_path / path).mkdir()
        runs.to_parquet(tmp_path / path / "learned-results.parquet")
    result = run(tmp_path, "--by", "folder", "--reference", "triton")
    assert result.returncode == 0, result.stderr
    assert "train acc triton / fused" in result.stdout
    assert result.stdout.splitlines()[-1] == ("fused: NOT faithful to triton: learned σ = 2 generalisation -6.00 "
                                              "points (seed-sd 1.63)")
    # by precision, the same files are one run twice over
    assert run(tmp_path).returncode == 2


def test_by_folder_refuses_mixed_precisions_and_loose_files(tmp_path):
    write_runs(tmp_path, grid("fp32", [0.84, 0.86, 0.88], [0.36, 0.38, 0.40])
               + grid("bf16", [0.84, 0.86, 0.88], [0.37, 0.39, 0.41]))
    result = run(tmp_path, "--by", "folder", "--reference", "fp32")
    assert result.returncode == 2 and "different precisions (bf16, fp32)" in result.stderr
    loose = tmp_path / "loose"
    loose.mkdir()
    (tmp_path / "fp32" / "results.parquet").rename(loose / "results.parquet")
    result = run(loose, "--by", "folder")
    assert result.returncode == 2 and "lies directly in it" in result.stderr
