"""`python -m pe_fast.compare_lst_logs DIR`: an LST run against logs whose numbers are written here, so every
difference and verdict is known in advance; bad input is one line and exit code 2."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pe_fast.compare_lst_logs import main
from pe_fast.sweep import settings as sweep_settings
from pe_fast.tasks.lst_puzzles import AUTHORS_LOGS_FILE, authors_file

SEEDS = (2235, 6312, 6068, 9742)  # the authors' logs have 4 here; the run shares the first 3
TRAIN, BATCH = 8100, 128


def their_accuracy(setting: str, seed: int, epoch: int, phase: str) -> float:
    base = {"sin2d": 0.6, "learned": 0.7}[setting] + 0.01 * SEEDS.index(seed)
    return min(1.0, base + (0.2 if epoch else 0.0) + (0.05 if phase == "train" else 0.0))


def write_logs(path):
    rows = []
    for pe, sigma in (("sin2d", np.nan), ("learned", 1.0)):
        for seed in SEEDS:
            for epoch in (0, 200, 400):
                for phase in ("train", "test", "human108"):
                    rows.append(dict(pe=pe, sigma=sigma, seed=seed, epoch=epoch, phase=phase, condition="average",
                                     loss=np.nan, accuracy=their_accuracy(pe, seed, epoch, phase)))
                    rows.append(dict(rows[-1], condition="binary", accuracy=0.0))  # must be ignored
    pd.DataFrame(rows).to_csv(path, index=False)


def write_run(directory, test_offset: float, trained_seeds=SEEDS[:3], **settings):
    """Our run: the same accuracies as theirs, except learned's test accuracy shifted by test_offset; evaluations
    at epochs 0, 195 (near their 200) and 300 (near none of theirs). Their PE dropout unless settings say."""
    directory.mkdir()
    rows = []
    for pe, sigma in (("sin2d", np.nan), ("learned", 1.0)):
        for seed in trained_seeds:
            for epoch in (0, 195, 300):
                step = round(epoch * TRAIN / BATCH)
                near = 200 if epoch == 195 else epoch
                train = their_accuracy(pe, seed, near, "train")
                test = their_accuracy(pe, seed, near, "test") + (test_offset if pe == "learned" else 0.0)
                model_id = len(trained_seeds) * ["sin2d", "learned"].index(pe) + list(trained_seeds).index(seed)
                rows.append(dict(pe=pe, sigma=sigma, seed=seed, model_id=model_id, step=step, train_acc=train,
                                 test_acc=test, ood_acc=0.5))
    curves = pd.DataFrame(rows)
    curves.to_parquet(directory / "curves.parquet")
    curves[curves["step"] == curves["step"].max()].to_parquet(directory / "results.parquet")
    recorded = sweep_settings.from_flags(sweep_settings.build_parser().parse_args(
        ["--task", "lst", "--preset", "paper-e200"])).to_json()  # as the sweep writes it
    # evaluations every --eval-every steps: one that divides the epochs' steps
    every = math.gcd(*curves["step"].astype(int).unique().tolist())
    settings = {k: v for k, v in {**recorded, "batch_size": BATCH, "pe_dropout": 0.1, "eval_every": every,
                                  "steps": int(curves["step"].max()), **settings}.items()
                if v is not None}  # None: a setting config.json files from before it lack
    config = {"settings": settings, "task": {"sizes": {"train": TRAIN}}}
    (directory / "config.json").write_text(json.dumps(config))


def test_differences_and_verdicts_follow_from_the_numbers(tmp_path, capsys):
    write_logs(tmp_path / "logs.csv")
    write_run(tmp_path / "run", test_offset=0.05)
    assert main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv")]) == 0
    text = capsys.readouterr().out
    assert text == (tmp_path / "run" / "compare_lst_logs.md").read_text()
    # their test sd over all 4 seeds at epoch 200: the seeds add 0, 1, 2, 3 points
    sd = np.std([0.0, 0.01, 0.02, 0.03], ddof=1)
    assert f"+5.0 ({0.05 / sd:+.2f})" in text  # learned's test: +5 points, in their seed-sds
    same = "86.0 ± 0.8 | 86.0 ± 0.8 | +0.0 (+0.00) | 81.0 ± 0.8 | 81.0 ± 0.8 | +0.0 (+0.00)"
    assert f"| sin2d | 200 | 195 | 3 | {same} |" in text
    assert "their epoch 200 (ours 195, 3 shared seeds): within" in text  # sin2d
    assert "learned σ=1** at their epoch 200 (ours 195, 3 shared seeds): not within" in text
    assert "| 400 |" not in text and "| 300 |" not in text  # no evaluation of ours near their epoch 400
    assert "| 91.0 |" in text  # their human108 at epoch 200 for learned: mean of 0.9, 0.91, 0.92, theirs only
    assert "PE dropout" not in text  # trained as theirs


@pytest.mark.parametrize("settings, marked, unmarked", [
    ({"pe_dropout": 0.0}, "| sin2d (PE dropout 0, theirs 0.1) | 200 |", "| learned σ=1 | 200 |"),
    ({"pe_dropout": None}, "| sin2d (PE dropout 0, theirs 0.1) | 200 |", "| learned σ=1 | 200 |"),  # before it
    ({"pe_dropout_on": ["learned", "sin2d"]}, "| learned σ=1 (PE dropout 0.1, theirs 0) | 200 |", "| sin2d | 200 |"),
])
def test_a_setting_trained_with_another_pe_dropout_than_theirs_says_so(tmp_path, capsys, settings, marked,
                                                                        unmarked):
    write_logs(tmp_path / "logs.csv")
    write_run(tmp_path / "run", test_offset=0.0, **settings)
    assert main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv")]) == 0
    text = capsys.readouterr().out
    assert marked in text and unmarked in text


def test_a_difference_from_logs_whose_seeds_all_agree_is_outside_with_its_sign(tmp_path, capsys):
    """Their 15 seeds all at 100 % training accuracy (sd 0): ours a little below is outside, said in words."""
    write_logs(tmp_path / "logs.csv")
    logs = pd.read_csv(tmp_path / "logs.csv")
    logs.loc[(logs["pe"] == "learned") & (logs["epoch"] == 200) & (logs["phase"] == "train"), "accuracy"] = 1.0
    logs.to_csv(tmp_path / "logs.csv", index=False)
    write_run(tmp_path / "run", test_offset=0.0)
    assert main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv")]) == 0
    text = capsys.readouterr().out
    below = 100 * (1.0 - np.mean([their_accuracy("learned", seed, 200, "train") for seed in SEEDS[:3]]))
    assert f"| -{below:.1f} (outside: their seeds' sd is 0) |" in text
    assert f"learned σ=1** at their epoch 200 (ours 195, 3 shared seeds): not within one of their seed-sds (train Δ " \
           f"-{below:.1f} points = outside: their seeds' sd is 0, test Δ +0.0 points = +0.00 sd)" in text


def test_folders_with_different_seeds_compare_as_one_run(tmp_path, capsys):
    """A --seeds 2 run and a run of the third seed alone give the table of the three seeds in one folder, written
    only where --out says; folders that trained differently, or share a seed, are refused."""
    write_logs(tmp_path / "logs.csv")
    logs = ["--logs", str(tmp_path / "logs.csv")]
    write_run(tmp_path / "all", test_offset=0.05)
    write_run(tmp_path / "first", test_offset=0.05, trained_seeds=SEEDS[:2], seeds=2)
    write_run(tmp_path / "third", test_offset=0.05, trained_seeds=SEEDS[2:3], seeds=1, seed_values=[SEEDS[2]])
    assert main([str(tmp_path / "all"), *logs]) == 0
    alone = capsys.readouterr().out
    assert main([str(tmp_path / "first"), str(tmp_path / "third"), *logs]) == 0
    pooled = capsys.readouterr().out
    assert pooled.splitlines()[1:] == alone.splitlines()[1:]  # all but the title, which names the folders
    assert pooled.splitlines()[0] == "# first + third against the authors' LST logs"
    assert not (tmp_path / "first" / "compare_lst_logs.md").exists()
    assert main([str(tmp_path / "first"), str(tmp_path / "third"), *logs, "--out", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text() == capsys.readouterr().out
    config = json.loads((tmp_path / "third" / "config.json").read_text())
    config["settings"]["precision"] = None  # as sweeps from before --precision recorded float32
    (tmp_path / "third" / "config.json").write_text(json.dumps(config))
    assert main([str(tmp_path / "first"), str(tmp_path / "third"), *logs]) == 0 and capsys.readouterr().out == pooled
    write_run(tmp_path / "wider", test_offset=0.05, trained_seeds=SEEDS[2:3], width=192)
    for folders, message in (([tmp_path / "first", tmp_path / "wider"], "trained with width = 192"),
                             ([tmp_path / "all", tmp_path / "third"], f"seed {SEEDS[2]} of "),
                             ([tmp_path / "all", tmp_path / "all"], f"{(tmp_path / 'all').resolve()} is named twice")):
        code, err = main([*map(str, folders), *logs]), capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and message in err, err


def test_bad_input_is_one_line(tmp_path, capsys):
    write_logs(tmp_path / "logs.csv")
    not_lst = tmp_path / "fmri"
    not_lst.mkdir()
    pd.DataFrame([dict(pe="learned", sigma=1.0, seed=1, model_id=0, step=0, test_r2=0.1)]).to_parquet(
        not_lst / "results.parquet")
    (not_lst / "config.json").write_text(json.dumps({"settings": {"task": "fmri"}}))
    unreadable = tmp_path / "unreadable"  # an LST run whose config.json lacks the sweep's settings
    shutil.copytree(not_lst, unreadable)
    (unreadable / "config.json").write_text(json.dumps({"settings": {"task": "lst"}}))
    logs = ["--logs", str(tmp_path / "logs.csv")]
    for args, message in (([str(not_lst), *logs], "is not an LST run"),
                          ([str(unreadable), *logs], "has settings this pe_fast cannot read"),
                          ([str(tmp_path / "missing"), *logs], "is not a folder"),
                          ([str(not_lst), "--logs", str(tmp_path / "none.csv")], "logs are not at")):
        code, err = main(args), capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and message in err, err
    # and as a program: the same line, exit 2
    done = subprocess.run([sys.executable, "-m", "pe_fast.compare_lst_logs", str(not_lst), *logs], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not an LST run" in done.stderr, done.stderr


def test_the_h100_run_against_the_real_logs(tmp_path, capsys):
    """docs/results' H100 run (3 of their seeds, evaluations every 2,000 steps): at their epoch 200 our step
    12,000, compared with the authors' logs that ship with pe_fast; their numbers recomputed here with pandas."""
    from pathlib import Path
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "docs" / "results" / "h100-paper-learned-16k", run)
    assert main([str(run)]) == 0
    text = capsys.readouterr().out
    logs = pd.read_parquet(authors_file(AUTHORS_LOGS_FILE))
    theirs = logs[(logs["pe"] == "learned") & np.isclose(logs["sigma"], 2.0) & (logs["epoch"] == 200)
                  & (logs["condition"] == "average") & (logs["phase"] == "test")
                  & logs["seed"].isin([2235, 6312, 6068])]
    ours = pd.read_parquet(run / "curves.parquet")
    ours = ours[(ours["sigma"] == 2.0) & (ours["step"] == 12000)]
    want = f"| {100 * ours['test_acc'].mean():.1f} ± {100 * ours['test_acc'].std(ddof=0):.1f} | " \
           f"{100 * theirs['accuracy'].mean():.1f} ± {100 * theirs['accuracy'].std(ddof=0):.1f} |"
    assert want in text


def test_paper_e200_preset_is_the_authors_grid_at_their_epoch_200():
    """--preset paper-e200: the authors' 21 settings × their 15 seeds, trained for 200 of their epochs (puzzles
    seen: steps × batch over their 8,100 training puzzles), checkpointed often enough for short GPU slots."""
    from pe_fast.sweep import grid, settings
    s = settings.from_flags(settings.build_parser().parse_args(["--task", "lst", "--preset", "paper-e200"]))
    models = grid.expand_grid(s)
    assert len(models) == 315
    settings_seen = {(m["pe"], m["sigma"]) for m in models}
    assert settings_seen == {("sin2d", None)} | {("learned", round(k / 10, 1)) for k in range(1, 21)}
    for setting in settings_seen:
        assert sorted(m["seed"] for m in models if (m["pe"], m["sigma"]) == setting) == sorted(grid.AUTHOR_SEEDS)
    assert set(pd.read_parquet(authors_file(AUTHORS_LOGS_FILE))["seed"]) == set(grid.AUTHOR_SEEDS)
    assert s.steps * s.batch_size / TRAIN == pytest.approx(200, abs=1)
    assert (s.width, s.depth, s.mlp_width, s.lr, s.optimizer) == (160, 4, 640, (1e-4,), ("adamw",))
    assert s.steps % s.eval_every == 0 and s.checkpoint_every <= 500
    # their sinusoidal PE module's dropout, for the sinusoidal PE only
    from pe_fast.sweep.task_loading import load_task
    task = load_task(s)
    assert grid.model_config(s, task, "sin2d").pe_dropout == 0.1
    assert grid.model_config(s, task, "learned").pe_dropout == 0.0


@pytest.mark.parametrize("named", [False, True], ids=["default output", "named by --out"])
@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_a_link_planted_as_the_output_is_never_written_through(link, named, tmp_path, capsys):
    """Named by --out, the same file was written through the link: a file outside the folder overwritten. A
    symbolic link out of the folder is refused, as the report and load_run refuse it; a hard link is replaced."""
    write_logs(tmp_path / "logs.csv")
    write_run(tmp_path / "run", test_offset=0.0)
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's file\n")
    planted = tmp_path / "run" / "compare_lst_logs.md"
    planted.symlink_to(outside) if link == "symlink" else os.link(outside, planted)
    out = ["--out", str(planted)] if named else []
    code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), *out])
    assert outside.read_text() == "someone else's file\n"
    if link == "symlink":
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and f"{planted} is a link to {outside}" in err, err
    else:
        assert code == 0 and planted.read_text() == capsys.readouterr().out


def test_an_output_that_is_a_folder_is_one_line(tmp_path, capsys):
    write_logs(tmp_path / "logs.csv")
    write_run(tmp_path / "run", test_offset=0.0)
    (tmp_path / "run" / "compare_lst_logs.md").mkdir()
    code, err = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv")]), capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is not a regular file" in err, err


def test_an_output_that_is_a_fifo_is_one_line_not_a_hang(tmp_path, capsys):
    write_logs(tmp_path / "logs.csv")
    write_run(tmp_path / "run", test_offset=0.0)
    os.mkfifo(tmp_path / "pipe")
    code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), "--out", str(tmp_path / "pipe")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--out" in err and "is not a regular file" in err, err


@pytest.mark.parametrize("out, must_name", [("", "--out '' names no file"), ("   ", "--out '   ' names no file"),
                                             ("a\nb.md", "--out 'a\\nb.md': holds a control character")])
def test_an_out_naming_no_file_or_holding_a_line_break_is_refused(out, must_name, tmp_path, capsys, monkeypatch):
    """As the sweep's and the report's --out: "" fell back to DIR's own table, "   " and a line break became files."""
    monkeypatch.chdir(tmp_path)
    write_logs(tmp_path / "logs.csv")
    write_run(tmp_path / "run", test_offset=0.0)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), "--out", out])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and must_name in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_folder_name_reaches_the_table_as_text_not_html(tmp_path, capsys):
    """The title named the folder raw: its HTML ran and its markdown rendered (report.md escaped the same name)."""
    write_logs(tmp_path / "logs.csv")
    folder = tmp_path / "x<img src=x onerror=alert(1)>**a**"
    write_run(folder, test_offset=0.0)
    assert main([str(folder), "--logs", str(tmp_path / "logs.csv")]) == 0
    title = (folder / "compare_lst_logs.md").read_text().splitlines()[0]
    assert title == "# x&lt;img src=x onerror=alert(1)&gt;\\*\\*a\\*\\* against the authors' LST logs", title


LOGS_HEADER = "pe,sigma,seed,epoch,phase,condition,accuracy\n"


@pytest.mark.parametrize("text, message", [
    (LOGS_HEADER, "no rows of condition average"),
    (LOGS_HEADER + "learned,0.5,2235,200,test,average,high\n", "column accuracy holds values that are not numbers"),
    (LOGS_HEADER + "learned,small,2235,200,test,average,0.5\n", "column sigma holds values that are not numbers"),
    (LOGS_HEADER + "learned,0.5,2235,zero,test,average,0.5\n", "column epoch holds values that are not numbers"),
])
def test_logs_of_the_wrong_kind_are_one_line(text, message, tmp_path):
    """--logs is a file from anyone: read as a program, a column of text where numbers belong is one line."""
    write_run(tmp_path / "run", test_offset=0.0)
    (tmp_path / "logs.csv").write_text(text)
    done = subprocess.run([sys.executable, "-m", "pe_fast.compare_lst_logs", str(tmp_path / "run"), "--logs",
                           str(tmp_path / "logs.csv")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "run" / "compare_lst_logs.md").exists()


def test_logs_that_expand_far_beyond_their_file_are_not_read(tmp_path, capsys, monkeypatch):
    """A parquet file of few bytes declaring many rows: refused from its metadata, as a results folder's tables."""
    from pe_fast.data import declared_size
    monkeypatch.setattr(declared_size, "EXPANSION_FLOOR", 2**16)  # the floor of a real file: 256 MiB declared
    write_run(tmp_path / "run", test_offset=0.0)
    pd.DataFrame(dict(pe=["learned"] * 100_000, sigma=0.5, seed=2235, epoch=200, phase="test", condition="average",
                      accuracy=0.5)).to_parquet(tmp_path / "logs.parquet")
    code, err = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.parquet")]), capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "declares" in err, err


def test_logs_whose_text_is_stored_once_and_read_in_every_row_are_not_read(tmp_path, capsys):
    """A 71 KB logs file whose condition column holds a 300 KB string through a dictionary page took 12 GB: its
    text is counted over every row before it is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    write_run(tmp_path / "run", test_offset=0.0)
    rows = 20_000
    condition = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array(["a" * 300_000]))
    pq.write_table(pa.table(dict(pe=["learned"] * rows, sigma=np.full(rows, 0.5), seed=np.full(rows, 2235),
                                 epoch=np.full(rows, 200), phase=["test"] * rows, condition=condition,
                                 accuracy=np.full(rows, 0.5))), tmp_path / "logs.parquet", compression="zstd")
    code, err = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.parquet")]), capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "declares 5,722 MiB once read" in err, err
    assert not (tmp_path / "run" / "compare_lst_logs.md").exists()


@pytest.mark.parametrize("logs", ["", " "])
def test_an_empty_logs_name_is_refused_not_read_as_the_authors(logs, tmp_path, capsys):
    write_run(tmp_path / "run", test_offset=0.0)
    code, err = main([str(tmp_path / "run"), "--logs", logs]), capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"--logs {logs!r} names no file" in err, err
    assert not (tmp_path / "run" / "compare_lst_logs.md").exists()


def test_an_out_over_a_results_folder_s_own_file_is_refused(tmp_path, capsys):
    """--out names any path; over a file of a results folder (its results.parquet, say) the table would replace
    the run's results."""
    write_logs(tmp_path / "logs.csv")
    write_run(tmp_path / "run", test_offset=0.0)
    results = tmp_path / "run" / "results.parquet"
    before = results.read_bytes()
    code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), "--out", str(results)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is a file of the results folder" in err, err
    assert results.read_bytes() == before
    # a name a sweep writes, though the folder lacks it (.lock: the table kept every later --resume out)
    for name in ("ground_truth.npz", "digests.json", ".lock"):
        (tmp_path / "run" / name).unlink(missing_ok=True)
        target = tmp_path / "run" / name
        code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), "--out", str(target)])
        err = capsys.readouterr().err
        assert code == 2 and "is a file of the results folder" in err and not target.exists(), err
    new_name = tmp_path / "run" / "t.md"  # a new file in the folder is the user's to write
    assert main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), "--out", str(new_name)]) == 0
    # another results folder's own table (it compares that folder, not this one) is its file too
    write_run(tmp_path / "other", test_offset=0.0)
    assert main([str(tmp_path / "other"), "--logs", str(tmp_path / "logs.csv")]) == 0
    theirs = tmp_path / "other" / "compare_lst_logs.md"
    before = theirs.read_bytes()
    capsys.readouterr()
    code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), "--out", str(theirs)])
    err = capsys.readouterr().err
    assert code == 2 and "is a file of the results folder" in err and theirs.read_bytes() == before, err
    (tmp_path / "other" / "packs" / "0").mkdir(parents=True, exist_ok=True)
    inside_pack = tmp_path / "other" / "packs" / "0" / "compare_lst_logs.md"  # a new file, but in a pack's folder
    code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), "--out", str(inside_pack)])
    assert code == 2 and not inside_pack.exists(), capsys.readouterr().err
    # a finished pack's folder, which holds a results.parquet of its own, read as a results folder of its own
    shutil.copy(tmp_path / "other" / "results.parquet", tmp_path / "other" / "packs" / "0" / "results.parquet")
    for name in ("compare_lst_logs.md", "new.md"):
        target = inside_pack.parent / name
        code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv"), "--out", str(target)])
        assert code == 2 and not target.exists(), capsys.readouterr().err


@pytest.mark.parametrize("spoil, message", [
    (lambda logs: logs.assign(accuracy=np.nan), "column accuracy holds missing values"),
    (lambda logs: logs.assign(epoch=logs["epoch"].astype(float).where(logs["epoch"] != 200, np.inf)),
     "column epoch holds infinite values"),
    (lambda logs: logs.assign(accuracy=logs["accuracy"] * 100), "an accuracy outside [0, 1]"),
    (lambda logs: logs.assign(sigma=-logs["sigma"]), "a σ not above 0"),  # matched no σ of ours, silently
    # a KeyError's traceback once
    (lambda logs: logs.assign(phase="zzz"), "column phase holds no train and no test rows"),
    (lambda logs: logs.assign(phase=logs["phase"].replace("test", "validation")), "column phase holds no test rows"),
    # two accuracies for one seed, epoch and phase were averaged into one; a missing one compared as nan ± nan
    (lambda logs: pd.concat([logs, logs.iloc[[0]].assign(accuracy=0.9)]), "two rows of condition average for pe "),
    (lambda logs: logs.drop(logs.index[(logs["phase"] == "test") & (logs["condition"] == "average")][:1]),
     "has a row of condition average for only one of train and test"),
])
def test_logs_of_numbers_no_log_holds_are_one_line(spoil, message, tmp_path, capsys):
    write_logs(tmp_path / "logs.csv")
    spoil(pd.read_csv(tmp_path / "logs.csv")).to_csv(tmp_path / "logs.csv", index=False)
    write_run(tmp_path / "run", test_offset=0.0)
    code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_long_csv_with_a_word_among_its_seeds_is_one_line_without_pandas_warnings(tmp_path, capsys):
    """pandas reads a long CSV in chunks and warns (DtypeWarning) where their types differ; read whole, the column
    is text and refused as such, with nothing else on stderr."""
    import warnings
    write_logs(tmp_path / "logs.csv")
    logs = pd.read_csv(tmp_path / "logs.csv")
    logs = pd.concat([logs] * (300_000 // len(logs) + 1), ignore_index=True)
    logs["seed"] = logs["seed"].astype(object)
    logs.loc[len(logs) - 1, "seed"] = "x"
    logs.to_csv(tmp_path / "logs.csv", index=False)
    write_run(tmp_path / "run", test_offset=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main([str(tmp_path / "run"), "--logs", str(tmp_path / "logs.csv")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "column seed holds values that are not numbers" in err, err
    assert not [w for w in caught if "DtypeWarning" in type(w.message).__name__], caught
