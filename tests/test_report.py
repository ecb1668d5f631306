"""The report on synthetic results folders whose numbers the tests compute independently (Spearman ρ with scipy,
means with numpy), on a running sweep's packs, on the real H100 results in docs/results, and on bad input."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pe_fast import report
from pe_fast.report import figures
from pe_fast.report.numbers import alignment, probe_names
from pe_fast.results import migrate
from pe_fast.results.reading import ReportError, load_run
from pe_fast.tasks import KINDS

DOCS = Path(__file__).resolve().parent.parent / "docs" / "results"
LST_FIGURES = ("generalisation_vs_sigma", "pe_similarity_vs_sigma", "alignment_vs_generalisation",
               "attention_over_training", "pe_drift", "learned_pe", "pe_rank_vs_sigma", "pe_rank_over_training")
RHO_LINE = re.compile(r"Spearman ρ = (-?\d+\.\d+) over (\d+) models")


def synthetic_rows(task: str, models: list[dict], layers: int, heads: int, probes: list[str], rng) -> pd.DataFrame:
    """One final-results row per model, columns named as pe_fast.train writes them; small σ generalises better."""
    rows = []
    for m in models:
        sigma = m["sigma"]
        quality = 0.7 - 0.2 * np.log10(sigma) if np.isfinite(sigma) else 0.6  # falls with σ
        row = dict(task=task, **m, steps=100)
        for l in range(layers):
            for h in range(heads):
                for prefix in ("attn", "ood_attn") if task == "lst" else ("attn",):
                    row[f"{prefix}_l{l}_h{h}_entropy"] = rng.uniform(1, 2.7)
                    row[f"{prefix}_l{l}_h{h}_max_prob"] = rng.uniform(0.1, 0.9)
                    row[f"{prefix}_l{l}_h{h}_sum_p2"] = rng.uniform(0.06, 0.5)
                    for probe in probes:
                        row[f"{prefix}_l{l}_h{h}_probe_{probe}"] = rng.uniform(0.2, 0.6)
        if task == "lst":
            row.update(train_acc=min(1.0, quality + 0.2), test_acc=quality + 0.05, ood_acc=quality + rng.normal(0, .05),
                       pe_rsa=quality - 0.3 + rng.normal(0, .05), pe_procrustes=rng.uniform(0, 1),
                       pe_dist_spearman=rng.uniform(-.2, .9))
            for c, drop in (("binary", 0.0), ("ternary", 0.1), ("quaternary", 0.25)):
                row[f"ood_acc_{c}"] = row["ood_acc"] - drop
        else:
            row.update(test_r2=quality - 0.4 + rng.normal(0, .05), test_mse=1.4 - quality + rng.normal(0, .05),
                       pe_fc_corr=quality - 0.3, pe_modularity=rng.uniform(0, .4), pe_segregation=rng.uniform(0, 1),
                       pe_dist_spearman=rng.uniform(-.2, .9), pe_procrustes=rng.uniform(0, 1))
        row["pe_drift"] = 0.5 / sigma if m["pe"] == "learned" else np.nan
        row["pe_effective_rank"], row["pe_pc1_share"] = rng.uniform(2, 8), rng.uniform(0.1, 0.9)
        rows.append(row)
    return pd.DataFrame(rows)


def synthetic_curves(results: pd.DataFrame, steps=(0, 50, 100)) -> pd.DataFrame:
    """The final rows scaled towards chance at earlier steps; no attention window at step 0 (as in train.py)."""
    parts = []
    for step in steps:
        part = results.copy()
        part.insert(0, "step", step)
        numeric = [c for c in part.columns if c not in ("task", "pe", "model_id", "sigma", "seed", "steps", "pack",
                                                          "step", "optimizer", "lr", "lr_last")]
        part[numeric] = part[numeric] * (0.5 + 0.5 * step / steps[-1])
        if step == 0:
            part[[c for c in numeric if "attn_" in c]] = np.nan
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def grid(pe_sigmas: dict, seeds: int) -> list[dict]:
    models = []
    for pack, (pe, sigmas) in enumerate(pe_sigmas.items()):
        for sigma in sigmas:
            for seed in range(seeds):
                models.append(dict(model_id=len(models), pe=pe, sigma=sigma, seed=100 + seed, pack=pack))
    return models


def write_folder(directory: Path, task: str, models: list[dict], results: pd.DataFrame, tokens: int,
                 packs_only: list[int] | None = None):
    """A results folder as the sweep writes it: finished (top-level files) or running (packs/<index>/ only)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"settings": {"task": task, "steps": 100, "sigmas": sorted({m["sigma"] for m in models
                                                                          if np.isfinite(m["sigma"])})},
              "models": models}
    (directory / "config.json").write_text(json.dumps(config))
    trained = results[~results["pe"].str.startswith("baseline:")]
    tables = {f"model_{i}": np.random.default_rng(i).normal(size=(2, tokens, 8))
              for i, pe in zip(trained["model_id"], trained["pe"]) if pe != "none"}
    if packs_only is None:
        results.to_parquet(directory / "results.parquet")
        synthetic_curves(trained).to_parquet(directory / "curves.parquet")
        np.savez(directory / "pe_tables.npz", **tables)
        return
    for pack in packs_only:
        folder = directory / "packs" / str(pack)
        folder.mkdir(parents=True)
        rows = results[results["pack"] == pack]
        rows.to_parquet(folder / "results.parquet")
        synthetic_curves(rows).to_parquet(folder / "curves.parquet")
        np.savez(folder / "pe_tables.npz", **{f"model_{i}": tables[f"model_{i}"] for i in rows["model_id"]
                                               if f"model_{i}" in tables})


def printed_rho(text: str) -> tuple[float, int]:
    match = RHO_LINE.search(text)
    assert match, text
    return float(match[1]), int(match[2])


def expected_alignment(results: pd.DataFrame, prefix: str, probe: str, score: str) -> tuple[float, int]:
    columns = [c for c in results.columns if c.startswith(f"{prefix}_l") and c.endswith(f"_probe_{probe}")]
    frame = results[columns + [score]].dropna()
    return stats.spearmanr(frame[columns].mean(axis=1), frame[score]).statistic, len(frame)


def mean_sd(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.3f} ± {values.std():.3f}"


def assert_figures(directory: Path, names):
    for name in names:
        path = directory / "figures" / f"{name}.png"
        assert path.is_file() and path.stat().st_size > 5000, name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](figures/{name}.png)" in (directory / "report.md").read_text()


def test_lst_report_on_a_running_sweep(tmp_path):
    """Packs only (2 of 3 finished): every LST figure, ρ and means equal to scipy / numpy on the same rows."""
    rng = np.random.default_rng(0)
    models = grid({"learned": [0.1, 0.5, 2.0], "sin2d": [np.nan], "none": [np.nan]}, seeds=3)
    results = synthetic_rows("lst", models, layers=2, heads=2, probes=["same_row", "same_col", "same_row_or_col"],
                             rng=rng)
    write_folder(tmp_path, "lst", models, results, tokens=16, packs_only=[0, 1])
    # text from a folder someone else made: shown in report.md, never run or laid out as markdown of its own (a
    # setting of free text; one with choices, as --preset, or a line break, is refused as --resume refuses it)
    config = json.loads((tmp_path / "config.json").read_text())
    config["settings"]["out"] = "cpu\n# INJECTED"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ReportError, match="--out 'cpu\\\\n# INJECTED': holds a control character"):
        load_run(tmp_path)
    config["settings"]["out"] = "cpu # INJECTED <script>alert(1)</script> | x"
    (tmp_path / "config.json").write_text(json.dumps(config))
    run = load_run(tmp_path)
    config, loaded, curves, tables = run.config, run.results, run.curves, run.pe_tables
    present = results[results["pack"].isin([0, 1])]
    assert len(loaded) == len(present) == 12 and set(tables) == {f"model_{i}" for i in present["model_id"]}
    assert len(curves) == 3 * 12 and len(config["models"]) == len(models) == 15

    path = report.write_report(tmp_path)
    text = path.read_text()
    assert "partial: 2 of 3 packs (12 of 15 models)" in text
    assert "<script" not in text and not any(line.startswith("# INJECTED") for line in text.splitlines())
    assert "| out | cpu # INJECTED &lt;script&gt;alert(1)&lt;/script&gt; \\| x |" in text
    assert_figures(tmp_path, LST_FIGURES)
    rho, n = printed_rho(text)
    want, want_n = expected_alignment(present, "ood_attn", "same_row_or_col", "ood_acc")
    assert n == want_n == 12 and rho == pytest.approx(want, abs=5e-4)
    small = present[(present["pe"] == "learned") & (present["sigma"] == 0.1)]
    assert f"| learned | 0.1 | 3 | {mean_sd(small['train_acc'])} |" in text
    assert f"σ=0.1 ood_acc {mean_sd(small['ood_acc'])}" in text  # the plain statement, from the data
    assert "none" not in text.split("## Summary")[1].split("## Figures")[0]  # pack 2 (none) not finished


def test_control_characters_from_a_folder_reach_report_md_as_escapes():
    """A terminal escape, a bell and a right-to-left override in a recorded setting: shown, not acted on (issue 55)."""
    from pe_fast.markdown import inert
    assert inert("cpu\x1b[2J\x07\u202efdp") == "cpu\\x1b\\[2J\\x07\\u202efdp"
    assert inert("σ × γ — ok") == "σ × γ — ok"  # letters and symbols of any script stay
    # markdown's marks shown as typed: no emphasis, code span, link or math of a file name's making
    assert inert("*b* `c` [l](u) $x$ _i_ a_b ~~s~~ \\") == \
        "\\*b\\* \\`c\\` \\[l\\](u) \\$x\\$ \\_i\\_ a_b \\~\\~s\\~\\~ \\\\"


def test_a_folder_name_and_data_kind_reach_report_md_inert(tmp_path):
    """The folder's name (its heading) and results' data_kind are anyone's text too: shown, never run."""
    folder = tmp_path / "x\u202e<img src=x onerror=alert(1)>"
    models = grid({"learned": [0.5]}, seeds=2)
    results = synthetic_rows("fmri", models, layers=1, heads=1, probes=["same_network"], rng=np.random.default_rng(0))
    write_folder(folder, "fmri", models, results, tokens=12)
    results.assign(data_kind="<script>alert(1)</script>\n# INJECTED").to_parquet(folder / "results.parquet")
    text = report.write_report(folder).read_text()
    assert "<img" not in text and "<script" not in text and "\u202e" not in text
    assert not any(line.startswith("# INJECTED") for line in text.splitlines())
    assert text.startswith("# pe_fast report: x\\u202e&lt;img src=x onerror=alert(1)&gt;\n")


def test_fmri_report_with_baselines_and_many_sigmas(tmp_path):
    """20 σ (colour bar), baseline rows in the table, ρ on the same_network probe against test_r2, and the
    PE-vs-FC figure once ground_truth.npz exists."""
    rng = np.random.default_rng(1)
    sigmas = [0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0]  # more than 8: the colour-bar layout
    models = grid({"learned": sigmas, "sinnd": [np.nan]}, seeds=2)
    baselines = [dict(model_id=len(models) + k, pe=f"baseline:{name}", sigma=np.nan, seed=np.nan, pack=-1)
                 for k, name in enumerate(("mean", "linear"))]
    trained = synthetic_rows("fmri", models, layers=2, heads=1, probes=["same_network", "near_3d"], rng=rng)
    base = pd.DataFrame([dict(task="fmri", **b, steps=0, test_mse=1.0 + 0.1 * k, test_r2=0.05 * k)
                         for k, b in enumerate(baselines)])
    results = pd.concat([trained, base], ignore_index=True)
    write_folder(tmp_path, "fmri", models, results, tokens=12)
    networks = np.repeat([2, 0, 1], 4)
    fc = np.where(networks[:, None] == networks[None, :], 0.6, -0.1) + np.eye(12) * 0.4
    labels = np.array([f"region{i}" for i in range(12)])  # the sweep also stores region names
    gradients = np.column_stack([networks - 1.0, np.arange(12.0), np.cos(np.arange(12.0))])  # each varies: a gradient
    np.savez(tmp_path / "ground_truth.npz", fc=fc, networks=networks, labels=labels, gradients=gradients)

    text = report.write_report(tmp_path).read_text()
    assert_figures(tmp_path, LST_FIGURES + ("pe_gradient",))
    rho, n = printed_rho(text)
    want, want_n = expected_alignment(results, "attn", "same_network", "test_r2")
    assert n == want_n == len(trained) and rho == pytest.approx(want, abs=5e-4)
    assert "| baseline:mean |  | 1 | 1.000 ± 0.000 | 0.000 ± 0.000 |" in text
    assert "Non-transformer references: baseline:mean 0.000, baseline:linear 0.050 (test_r2)." in text
    one = trained[(trained["pe"] == "learned") & (trained["sigma"] == 0.7)]
    assert f"| learned | 0.7 | 2 | {mean_sd(one['test_mse'])} | {mean_sd(one['test_r2'])} |" in text


def test_fmri_without_ground_truth_notes_the_missing_figure(tmp_path, monkeypatch):
    """The PE-vs-FC figure is skipped with a note, and a stale one from an earlier report is removed."""
    for slow in ("metric_vs_sigma", "alignment_figure", "curves_by_sigma"):  # only the note is under test here
        monkeypatch.setattr(figures, slow, lambda *args, **kwargs: None)
    models = grid({"learned": [0.1, 1.0]}, seeds=2)
    results = synthetic_rows("netsim", models, layers=1, heads=1, probes=["same_network"],
                             rng=np.random.default_rng(2))
    write_folder(tmp_path, "netsim", models, results, tokens=12)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "learned_pe.png").write_bytes(b"stale")
    text = report.write_report(tmp_path).read_text()
    assert "no ground_truth.npz" in text and "figures/learned_pe.png" not in text
    assert not (tmp_path / "figures" / "learned_pe.png").exists()


def test_real_h100_results_load_and_align():
    """The H100 runs in docs/results: real column names; a folder with curves only stands in its last evaluation."""
    run = load_run(DOCS / "h100-paper-learned-16k")
    results, curves = run.results, run.curves
    align = alignment(results, KINDS["lst"].view)
    want, n = expected_alignment(results, "ood_attn", "same_row_or_col", "ood_acc")
    assert align.n == n == 6 and align.rho == pytest.approx(want)
    assert probe_names(curves) == ["same_row", "same_col", "same_row_or_col"]
    run = load_run(DOCS / "h100-paper-sin2d-6k")
    derived, curves, tables = run.results, run.curves, run.pe_tables
    final = curves[curves["step"] == curves["step"].max()].sort_values("model_id")
    assert len(derived) == 3 and not tables
    np.testing.assert_array_equal(derived.sort_values("model_id")["ood_acc"], final["ood_acc"])


def test_bad_input_stops_with_one_line(tmp_path, capsys):
    proc = subprocess.run([sys.executable, "-m", "pe_fast.report", str(tmp_path / "missing")], check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is not a folder" in proc.stderr, proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "results.parquet").write_text("not parquet")
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)  # Python's JSON reader recurses
    # a folder of anything else, a link deep inside it: named as no results folder, its tree not walked (held-out
    # round, issue 55: the report blamed the link, and walked all of /usr)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "etc").symlink_to("/etc")
    for argv, message in (([str(empty)], "empty is not a results folder (no config.json"),
                          ([str(elsewhere)], "elsewhere is not a results folder"),
                          ([str(corrupt)], "not a readable parquet"),
                          ([str(deep)], "config.json is not a sweep's config"), ([], "usage")):
        assert report.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (empty / "report.md").exists() and not (empty / "figures").exists()
    with pytest.raises(ValueError, match="config.json is not a sweep.s config"):  # a Python caller's bad argument
        load_run(deep)


def test_convergence_against_curves_of_known_shape():
    """Flat, linear and geometrically slowing ood_acc curves, and a model that does not fit: the verdicts and the
    step estimate follow from the shapes (closed forms), not from this code's own earlier output."""
    from pe_fast.report.numbers import convergence, convergence_lines
    steps = np.arange(0, 4001, 500)
    shapes = {
        0.1: (0.9 + 0 * steps, 1.0),                       # flat: converged
        0.5: (0.5 + 0.1 * steps / 1000, 1.0),              # +0.1 per 1000 steps, not slowing: no estimate
        1.0: (0.9 - 0.32 * 0.5 ** (steps / 1000), 1.0),    # gains halve every 1000 steps (one quarter)
        2.0: (0.9 + 0 * steps, 0.8),                       # flat, but its training accuracy ends at 0.8
    }
    curves = pd.DataFrame([dict(pe="learned", sigma=sigma, step=s, ood_acc=v, train_acc=fit)
                           for sigma, (values, fit) in shapes.items() for s, v in zip(steps, values)])
    (check,) = convergence(curves, KINDS["lst"].view)
    assert not check.converged and not check.too_short
    improving = {who: (gain, more) for who, gain, more in check.still_improving}
    assert set(improving) == {"σ=0.5", "σ=1"}
    assert improving["σ=0.5"] == (pytest.approx(0.1), None)
    # the last quarter gains 0.32·(0.5³ − 0.5⁴) = 0.02, the one before 0.04: ratio ½, so one more quarter
    # (1000 steps) gains 0.01, which is not more than the tolerance
    assert improving["σ=1"][0] == pytest.approx(0.02) and improving["σ=1"][1] == 1000
    assert check.unfit == [("σ=2", pytest.approx(0.8))]
    text = " ".join(convergence_lines([check], KINDS["lst"].view))
    assert "not converged" in text and "about 1,000 more steps" in text and "σ=2 does not fit" in text
    flat = curves[curves["sigma"] == 0.1]
    assert convergence(flat, KINDS["lst"].view)[0].converged
    assert convergence(flat[flat["step"] <= 1000], KINDS["lst"].view)[0].too_short
    # flat, but under a cosine schedule whose rate is at 1/2·(1 + cos(3π/4)) ≈ 15 % of its peak at 3/4 of the run
    cosine = flat.assign(lr_last=0.5 * (1 + np.cos(np.pi * flat["step"] / 4000)))
    (check,) = convergence(cosine, KINDS["lst"].view)
    assert not check.converged and check.decayed == pytest.approx(0.5 * (1 + np.cos(0.75 * np.pi)))
    # curves from before the optimizer axes called the rate lr: read through migrate.table, as read_run reads them
    (check,) = convergence(migrate.table(cosine.rename(columns={"lr_last": "lr"})), KINDS["lst"].view)
    assert not check.converged and check.decayed == pytest.approx(0.5 * (1 + np.cos(0.75 * np.pi)))
    assert convergence(flat.assign(lr_last=1e-3), KINDS["lst"].view)[0].converged  # a constant rate: a real plateau
    # with a learning-rate axis each rate is judged on its own: the flat curve at one, the rising one at another
    axis = pd.concat([flat.assign(lr=1e-3, lr_last=1e-3),
                      curves[curves["sigma"] == 0.5].assign(sigma=0.1, lr=3e-3, lr_last=3e-3)])
    (check,) = convergence(axis, KINDS["lst"].view)
    assert [(who, gain) for who, gain, _ in check.still_improving] == [("σ=0.1, lr=0.003", pytest.approx(0.1))]


def test_convergence_between_sparse_evaluations():
    """Evaluations every 1,000 of 10,000 steps miss the quarters' boundaries (5,000 lies on one, 7,500 does not).
    Gains that halve every quarter (2,500 steps), 0.03 in the last one: two more quarters bring a gain of 0.0075,
    under the tolerance, so about 5,000 more steps. Reading the score at 7,000 instead of 7,500 stretched the last
    quarter and shrank the one before, and estimated 12,500."""
    from pe_fast.report.numbers import convergence
    steps = np.arange(0, 10001, 1000)
    amplitude = 0.03 / (0.5 ** 3 - 0.5 ** 4)   # v(10,000) − v(7,500) = 0.03
    curves = pd.DataFrame(dict(pe="learned", sigma=0.1, step=steps, ood_acc=0.95 - amplitude * 0.5 ** (steps / 2500),
                               train_acc=1.0))
    (check,) = convergence(curves, KINDS["lst"].view)
    ((who, gain, more),) = check.still_improving
    # linear interpolation between evaluations overstates the last quarter's gain by about 2 %
    assert who == "σ=0.1" and gain == pytest.approx(0.03, rel=0.03) and more == 5000


def test_optimizer_axes_get_their_own_rows_and_a_phase_diagram(tmp_path):
    """σ × two learning rates × two seeds: the summary has one row per (σ, lr) with numpy's means, and the
    σ × lr heatmaps and the rich/lazy figure are drawn."""
    rng = np.random.default_rng(3)
    models = grid({"learned": [0.1, 1.0]}, seeds=2)
    models = [dict(m, model_id=2 * m["model_id"] + k, lr=lr, optimizer="adam") for m in models
              for k, lr in enumerate((1e-3, 3e-3))]
    results = synthetic_rows("fmri", models, layers=1, heads=1, probes=["same_network"], rng=rng)
    for column in ("weight_drift_b0", "repr_change", "attn_change"):
        results[column] = rng.uniform(0, 1, len(results))
    results["lr_last"] = results["lr"]  # a constant schedule
    write_folder(tmp_path, "fmri", models, results, tokens=12)
    text = report.write_report(tmp_path).read_text()
    assert "| PE | σ | lr | models |" in text
    one = results[(results["sigma"] == 1.0) & (results["lr"] == 3e-3)]
    assert f"| learned | 1 | 0.003 | 2 | {mean_sd(one['test_mse'])} |" in text
    assert_figures(tmp_path, ("phase_diagram", "rich_lazy_vs_sigma"))


def test_paired_differences_by_seed_with_t_intervals():
    """The statement's seed-paired differences against numbers worked out here: σ 0.1 beats σ 2 on every seed,
    and the best (PE, σ) against a baseline is a one-sample interval around a constant."""
    from pe_fast.report.numbers import paired_statements
    r2 = {0.1: [0.50, 0.52, 0.49, 0.51], 0.5: [0.48, 0.50, 0.47, 0.49], 2.0: [0.44, 0.45, 0.45, 0.43]}
    rows = [dict(pe="learned", sigma=sigma, seed=seed, test_r2=value)
            for sigma, values in r2.items() for seed, value in zip((7, 8, 9, 10), values)]
    rows.append(dict(pe="baseline:linear", sigma=np.nan, seed=np.nan, test_r2=0.505))
    lines = paired_statements(pd.DataFrame(rows), "test_r2")

    def interval(d):
        d = np.asarray(d)
        half = 3.182446305284263 * d.std(ddof=1) / 2  # t(0.975, 3 df), √4 seeds
        return f"{d.mean():+.3f} (95 % CI {d.mean() - half:+.3f} to {d.mean() + half:+.3f}, 4 seeds)"

    assert lines == [f"learned σ=0.1 − σ=2: {interval(np.subtract(r2[0.1], r2[2.0]))}",
                     f"learned σ=0.1 − baseline:linear: {interval(np.subtract(r2[0.1], 0.505))}"]
    with_lr = pd.DataFrame(rows).assign(lr=[1e-3, 3e-3] * 6 + [np.nan], lr_last=1.0)
    assert paired_statements(with_lr, "test_r2") == []  # σ pairs are ambiguous when another axis varies
    # with the random PE (the learned one's untrained start) at σ 0.5 and 2: learned − random at each
    fixed = {0.5: [0.47, 0.50, 0.44, 0.49], 2.0: [0.43, 0.45, 0.41, 0.42]}
    rows += [dict(pe="random", sigma=sigma, seed=seed, test_r2=value)
             for sigma, values in fixed.items() for seed, value in zip((7, 8, 9, 10), values)]
    lines = paired_statements(pd.DataFrame(rows), "test_r2")
    assert lines == [f"learned σ=0.1 − σ=2: {interval(np.subtract(r2[0.1], r2[2.0]))}",
                     f"random σ=0.5 − σ=2: {interval(np.subtract(fixed[0.5], fixed[2.0]))}",
                     f"learned − random (training the PE) at σ=0.5: {interval(np.subtract(r2[0.5], fixed[0.5]))}",
                     f"learned − random (training the PE) at σ=2: {interval(np.subtract(r2[2.0], fixed[2.0]))}",
                     f"learned σ=0.1 − random σ=0.5: {interval(np.subtract(r2[0.1], fixed[0.5]))}",
                     f"learned σ=0.1 − baseline:linear: {interval(np.subtract(r2[0.1], 0.505))}"]
    # when the best model and the best random PE share σ, that pair is learned − random at σ, stated once
    same_sigma = pd.DataFrame(rows).assign(test_r2=lambda f: f["test_r2"] + 0.1 * ((f["pe"] == "learned")
                                                                                   & (f["sigma"] == 0.5)))
    lines = paired_statements(same_sigma, "test_r2")
    assert f"learned − random (training the PE) at σ=0.5: {interval(np.add(r2[0.5], 0.1) - fixed[0.5])}" in lines
    assert not any(line.startswith("learned σ=0.5 − random") for line in lines)
    # and the best against the best of each other PE kind, those without a σ too (sinusoids of the index, no PE)
    sinusoids, no_pe = [0.46, 0.47, 0.47, 0.45], [0.30, 0.31, 0.29, 0.30]
    rows += [dict(pe=pe, sigma=np.nan, seed=seed, test_r2=value) for pe, values in (("sin1d", sinusoids),
                                                                                     ("none", no_pe))
             for seed, value in zip((7, 8, 9, 10), values)]
    lines = paired_statements(pd.DataFrame(rows), "test_r2")
    assert lines[-4:] == [f"learned σ=0.1 − random σ=0.5: {interval(np.subtract(r2[0.1], fixed[0.5]))}",
                          f"learned σ=0.1 − sin1d: {interval(np.subtract(r2[0.1], sinusoids))}",
                          f"learned σ=0.1 − none: {interval(np.subtract(r2[0.1], no_pe))}",
                          f"learned σ=0.1 − baseline:linear: {interval(np.subtract(r2[0.1], 0.505))}"]
    # a PE without a σ on top (as sin2d on the LST): it against each σ-PE's best σ
    raised = pd.DataFrame(rows).assign(test_r2=lambda f: f["test_r2"] + 0.1 * (f["pe"] == "sin1d"))
    assert (f"sin1d − learned σ=0.1: {interval(np.subtract(np.add(sinusoids, 0.1), r2[0.1]))}"
            in paired_statements(raised, "test_r2"))


def test_a_folder_kept_without_pe_tables_gets_its_report(tmp_path):
    """docs/results keeps no pe_tables.npz: the report is still written, and its RSA section says why it is empty."""
    pytest.importorskip("rsatoolbox")
    folder = shutil.copytree(DOCS / "cpu-glasser360-learned-10k", tmp_path / "run")
    text = report.write_report(folder).read_text()
    assert "No model with a PE table" in text and "| learned | 0.5 | 3 |" in text


@pytest.mark.parametrize("argv, names", [(["some-run", "--rmds"], "unrecognized argument '--rmds'"),
                                         (["some-run", "--outt", "x"], "unrecognized argument '--outt'"),
                                         (["a", "b", "--out", ""], "--out names no folder")])
def test_a_misspelled_report_option_is_named(argv, names, tmp_path, capsys, monkeypatch):
    """A misspelled --rdms got the usage line alone, naming nothing."""
    from pe_fast.report.cli import main as report_main
    monkeypatch.chdir(tmp_path)
    assert report_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and "usage" in err, err
    assert list(tmp_path.iterdir()) == []
