"""A results folder someone else made, read by every reader the same way (python -m pe_fast.report,
pe_fast.load_run, python -m pe_fast.compare_lst_logs): what the third hostile round got past some of them is one
error naming the file, and the report writes nothing before it."""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pe_fast
from pe_fast import compare_lst_logs, report
from pe_fast.results import run_folder
from pe_fast.results.reading import ReportError
from sweep_harness import sweep_in_process, without_read_override

LST = ["--task", "lst", "--width", "8", "--depth", "1", "--mlp-width", "16", "--steps", "4", "--eval-every", "2",
       "--batch-size", "8", "--seeds", "1", "--pe", "learned,sin2d", "--sigmas", "0.1", "--no-report"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    done = sweep_in_process(*LST, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


def copy_of(finished, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    return folder


def rewrite_tables(folder, change):
    """results.parquet and curves.parquet, top level and in the packs, changed alike (change(name, frame))."""
    for path in [*folder.glob("*.parquet"), *folder.glob("packs/*/*.parquet")]:
        if path.name in (run_folder.RESULTS, run_folder.CURVES):
            pd.DataFrame.to_parquet(change(path.name, pd.read_parquet(path)), path)


def long_baseline_name(name, frame):
    return frame.assign(pe=frame["pe"].where(frame["model_id"] != 1, "baseline:" + "a" * 200_000))


def duplicated_curves_row(name, frame):
    return pd.concat([frame, frame.iloc[:1]], ignore_index=True) if name == run_folder.CURVES else frame


def mathtext_probe_column(name, frame):
    return frame.assign(**{"attn_l0_h0_probe_$x^{$": 0.5}) if name == run_folder.CURVES else frame


def column_set(column, value, table=None):
    """rewrite_tables' change: one column of every row set to value (in one table, or both)."""
    return lambda name, frame: frame.assign(**{column: value}) if table in (None, name) else frame


def stray_curves_model(name, frame):
    return frame.assign(model_id=frame["model_id"] + 77) if name == run_folder.CURVES else frame


def negative_steps(name, frame):
    return frame.assign(steps=-5) if name == run_folder.RESULTS else frame


def sigma_changed(name, frame):
    return frame.assign(sigma=frame["sigma"].where(frame["pe"] != "learned", 0.7))


def lr_changed(name, frame):
    return frame.assign(lr=frame["lr"] / 2)


def seed_changed(name, frame):
    return frame.assign(seed=frame["seed"].where(frame["model_id"] != 0, 1 + frame["seed"]))


def unlisted_with(column, value):
    """The tables with column set to value, and config.json listing no models to compare them with."""
    def spoil(folder):
        rewrite_tables(folder, lambda name, frame: frame.assign(**{column: value}))
        config = json.loads((folder / run_folder.CONFIG).read_text())
        (folder / run_folder.CONFIG).write_text(json.dumps({**config, "models": []}))
    return spoil


def score_edited(name, frame):
    """test_acc 0.99 in the results and in each model's last evaluation, alike (results are that evaluation)."""
    if name == run_folder.RESULTS:
        return frame.assign(test_acc=0.99)
    last = frame["step"] == frame.groupby("model_id")["step"].transform("max")
    return frame.assign(test_acc=frame["test_acc"].where(~last, 0.99))


def top_level_score_edited(folder):
    for name in (run_folder.RESULTS, run_folder.CURVES):
        score_edited(name, pd.read_parquet(folder / name)).to_parquet(folder / name)
    run_folder.write_digests(folder)


def pe_table_scaled(folder):
    """Model 0's table in its pack's pe_tables.npz (the top level's is compared with it)."""
    path = folder / "packs" / "0" / run_folder.PE_TABLES
    with np.load(path) as stored:
        tables = {key: stored[key] for key in stored.files}
    tables["model_0"] = tables["model_0"] * 100
    np.savez_compressed(path, **tables)


def top_level_pe_table_edited(folder):
    path = folder / run_folder.PE_TABLES
    with np.load(path) as stored:
        tables = {key: stored[key] for key in stored.files}
    np.savez_compressed(path, **{**tables, "model_0": tables["model_0"] * 100})
    run_folder.write_digests(folder)


def pe_tables_below_float32(folder):
    for path in (folder / run_folder.PE_TABLES, folder / "packs" / "0" / run_folder.PE_TABLES):
        with np.load(path) as stored:
            tables = {key: stored[key] for key in stored.files}
        tables["model_0"] = tables["model_0"].astype(np.float64) * 1e-310  # beside 0 in float32
        np.savez_compressed(path, **tables)
        run_folder.write_digests(path.parent)


def pe_tables_changed(change):
    """pe_tables.npz, top level and pack 0's, changed alike (change(tables)) and their digests rewritten: what
    someone who edits a folder can do."""
    def spoil(folder):
        for path in (folder / run_folder.PE_TABLES, folder / "packs" / "0" / run_folder.PE_TABLES):
            with np.load(path) as stored:
                tables = {key: stored[key] for key in stored.files}
            change(tables)
            np.savez_compressed(path, **tables)
            run_folder.write_digests(path.parent)
    return spoil


def with_nan(table):
    table = table.copy()
    table.flat[0] = np.nan
    return table


def weights_scaled_keeping_their_header(folder):
    """A weights file edited as safetensors writes it, its header (model ids, configuration) kept."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    path = folder / "packs" / "0" / run_folder.WEIGHTS
    with safe_open(str(path), "pt") as stored:
        metadata = stored.metadata()
    tensors = load_file(str(path))
    tensors = {key: value * 100 if value.is_floating_point() else value for key, value in tensors.items()}
    save_file(tensors, str(path), metadata=metadata)


def config_settings(**changes):
    def spoil(folder):
        config = json.loads((folder / run_folder.CONFIG).read_text())
        config["settings"].update(changes)
        (folder / run_folder.CONFIG).write_text(json.dumps(config))
    return spoil


def config_task(change):
    """config.json's task, the description of the sweep's data, changed (change(task))."""
    def spoil(folder):
        config = json.loads((folder / run_folder.CONFIG).read_text())
        change(config["task"])
        (folder / run_folder.CONFIG).write_text(json.dumps(config))
    return spoil


def config_with_models(models):
    def spoil(folder):
        config = json.loads((folder / run_folder.CONFIG).read_text())
        config["models"] = models
        (folder / run_folder.CONFIG).write_text(json.dumps(config))
    return spoil


def pack_0_a_link(folder):
    """packs/0 moved beside packs/ and linked back, its weights edited (its digests.json now stale, never read)."""
    (folder / "packs" / "0").rename(folder / "pack-0")
    (folder / "packs" / "0").symlink_to(Path("..") / "pack-0", target_is_directory=True)
    weights_scaled_keeping_their_header(folder)


def config_model_0(change):
    """config.json's entry of model 0 changed (change(entry))."""
    def spoil(folder):
        config = json.loads((folder / run_folder.CONFIG).read_text())
        change(config["models"][0])
        (folder / run_folder.CONFIG).write_text(json.dumps(config))
    return spoil


def swapped_weights(folder):
    """Pack 1's weights in pack 0's place: a valid file, of another pack."""
    shutil.copy(folder / "packs" / "1" / run_folder.WEIGHTS, folder / "packs" / "0" / run_folder.WEIGHTS)


def lying_weights_header(folder):
    path = folder / "packs" / "0" / run_folder.WEIGHTS
    path.write_bytes(struct.pack("<Q", 2 ** 63) + b"{}")


TAMPERS = {
    # a name of 200,000 characters held the report for minutes in the figures' legends
    "a baseline name 200,000 characters long": (lambda f: rewrite_tables(f, long_baseline_name), "column pe"),
    # a baseline name the task never writes reached report.md (held-out round, issue 55); LST writes none
    "a baseline the task does not write": (
        lambda f: rewrite_tables(f, lambda name, frame: frame.assign(pe=frame["pe"].where(frame["model_id"] != 1,
                                                                                           "baseline:evil"))),
        "column pe holds 'baseline:evil', not a baseline task lst writes"),
    "a curves row twice": (lambda f: rewrite_tables(f, duplicated_curves_row), "two rows at step"),
    "curves of a model the results lack": (lambda f: rewrite_tables(f, stray_curves_model), "do not hold"),
    # matplotlib read it as mathtext, and the report ended in an 82-line traceback with its figures half made
    "a probe column named in mathtext": (lambda f: rewrite_tables(f, mathtext_probe_column),
                                         "has a column named 'attn_l0_h0_probe_"),
    "negative steps": (lambda f: rewrite_tables(f, negative_steps), "column steps"),
    "a σ other than config.json's": (lambda f: rewrite_tables(f, sigma_changed), "not this run's results"),
    # every key config.json lists a model by, not its PE and σ only
    "a learning rate other than config.json's": (lambda f: rewrite_tables(f, lr_changed), "model 0 lr"),
    "a seed other than config.json's": (lambda f: rewrite_tables(f, seed_changed), "model 0 seed"),
    # where config.json lists none, each grid axis within its flag's range
    "a learning rate of 0": (unlisted_with("lr", 0.0), "column lr: --lr must be finite and ≥ 1.17"),
    "a negative weight decay": (unlisted_with("weight_decay", -1.0), "column weight_decay"),
    # numbers no sweep of these settings writes, whatever the record of the files' digests says
    "an accuracy of a million": (lambda f: rewrite_tables(f, column_set("test_acc", 1e6)),
                                 "column test_acc holds 1000000.0, an accuracy beyond 0…1"),
    "more steps than the settings": (lambda f: rewrite_tables(f, column_set("steps", 10**12, run_folder.RESULTS)),
                                     "column steps holds 1000000000000, a step beyond the settings' --steps 4"),
    "a pack beyond config.json's": (lambda f: rewrite_tables(f, column_set("pack", 99)), "not one of config.json's"),
    "a trained model in the baselines' pack": (lambda f: rewrite_tables(f, column_set("pack", -1)),
                                               "column pack holds -1, not one of config.json's 2 packs"),
    "a fraction above 1": (lambda f: rewrite_tables(f, column_set("pe_pc1_share", 4.0)),
                           "column pe_pc1_share holds 4.0, a fraction beyond 0…1"),
    "a negative drift": (lambda f: rewrite_tables(f, column_set("pe_drift", -2.0)),
                         "column pe_drift holds -2.0, a negative value"),
    "an R² above 1": (lambda f: rewrite_tables(f, column_set("pe_row_axis_r2", 5.0)), "an R² above 1"),
    "a negative training time": (lambda f: rewrite_tables(f, column_set("train_seconds", -1.0, run_folder.RESULTS)),
                                 "column train_seconds holds -1.0, a negative value"),
    # the record of the digests rewritten (it is no signature) over a score edited at the top level only: the packs
    "a top-level score edited, its record rewritten": (top_level_score_edited,
                                                        "results.parquet: its test_acc is not its packs'"),
    # the report drew the edited top-level table (issue 55); numbers no float32 holds made the metrics 0 / 0
    "a top-level PE table edited, its record rewritten": (top_level_pe_table_edited,
                                                          "pe_tables.npz: its model_0 differs from"),
    "a PE table below float32's smallest, its record rewritten": (pe_tables_below_float32,
                                                                  "holds numbers beyond any float32 a sweep computes"),
    # the results edited alone: they are each model's last evaluation in the curves (their digests rewritten)
    "a result edited alone": (lambda f: (pd.read_parquet(f / run_folder.RESULTS).assign(test_acc=0.99).to_parquet(
        f / run_folder.RESULTS), run_folder.write_digests(f)), "results.parquet gives model 0 test_acc 0.99, its last "
                                                                  "evaluation in curves.parquet"),
    "a curve without its step-0 evaluation": (lambda f: (rewrite_tables(f, lambda name, frame: frame[
        frame["step"] > 0] if name == run_folder.CURVES else frame), *map(run_folder.write_digests, [
            f, *f.glob("packs/*")])), "evaluations of model 0 start at step 2, not 0"),
    # a number edited passes every check of its kind: the folder's record of its files tells
    "a score edited in results.parquet": (lambda f: rewrite_tables(f, score_edited),
                                          "results.parquet has changed since it was written"),
    "a PE table scaled": (pe_table_scaled, "pe_tables.npz: its model_0 differs from"),
    # tables that read as tables, each with its record rewritten: not the models the results and settings hold
    "a PE table narrower than the settings' width": (
        pe_tables_changed(lambda t: t.update(model_0=t["model_0"][..., :4])), "entry model_0 is 4 wide, where"),
    "a PE table of integers": (pe_tables_changed(lambda t: t.update(model_0=t["model_0"].astype(np.int64))),
                               "entry model_0 is a 3-axis int64 array of shape"),
    "a PE table holding NaN where its PE was scored": (pe_tables_changed(lambda t: t.update(model_0=with_nan(
        t["model_0"]))), "entry model_0 holds NaN or inf, where the results score model 0's PE"),
    "an attention map holding NaN where its model's loss is finite": (
        pe_tables_changed(lambda t: t.update(attention_map_0=with_nan(t["attention_map_0"]))),
        "entry attention_map_0 holds NaN or inf, where model 0's train_loss in the results is"),
    "an attention map whose rows do not sum to 1": (
        pe_tables_changed(lambda t: t.update(attention_map_0=t["attention_map_0"] * 0.5)),
        "entry attention_map_0 has rows that do not sum to 1"),
    # held-out round (issue 55): tables of another depth, or removed, were read as the models'
    "an attention map of more blocks than the models'": (
        pe_tables_changed(lambda t: t.update(attention_map_0=np.concatenate([t["attention_map_0"]] * 2))),
        "entry attention_map_0 holds tables for 2 blocks, where the settings' models have 1"),
    "a PE table of more blocks than the models'": (
        pe_tables_changed(lambda t: t.update(model_0=np.concatenate([t["model_0"]] * 2))),
        "entry model_0 holds tables for 2 blocks, where the settings' models have 1"),
    "a PE table removed where its PE was scored": (pe_tables_changed(lambda t: t.pop("model_0")),
                                                   "holds no PE table for model 0, where the results score its PE"),
    "a PE table of a model the results do not hold": (
        pe_tables_changed(lambda t: t.update(model_99=t["model_0"])), "entry model_99 is for model 99, which"),
    "weights scaled, their header kept": (weights_scaled_keeping_their_header,
                                          "weights.safetensors has changed since it was written"),
    "the record naming a file outside": (lambda f: (f / run_folder.DIGESTS).write_text('{"../x": "' + "0" * 64 + '"}'),
                                         "digests.json is not the record"),
    # the record checked whatever else is gone: a file it lists removed, a pack's results broken beside its weights
    "results.parquet removed and a score edited in curves.parquet": (
        lambda f: ((f / run_folder.RESULTS).unlink(),
                   pd.read_parquet(f / run_folder.CURVES).assign(test_acc=0.99).to_parquet(f / run_folder.CURVES)),
        "results.parquet is gone or not a file, though digests.json lists it"),
    "results.parquet damaged": (lambda f: (f / run_folder.RESULTS).write_bytes(b"garbage"),
                                "results.parquet is not a readable parquet"),
    "a pack's results removed, its weights edited": (
        lambda f: ((f / "packs" / "0" / run_folder.RESULTS).unlink(), weights_scaled_keeping_their_header(f)),
        "packs/0/results.parquet is gone or not a file"),
    "a file added to a finished pack": (lambda f: (f / "packs" / "0" / "notes.txt").write_text("x"),
                                        "notes.txt was added to a finished pack's folder"),
    # config.json's settings edited in what trains: the models it lists, the weights' shape say otherwise
    "the settings' learning rate edited": (config_settings(lr=[0.123]), "models lists model 0 with lr 0.001"),
    "the settings' width edited": (config_settings(width=16), "its models have width 8, where config.json's"),
    # ... and in what no model lists: each pack's record of its settings (trained_with.json) says otherwise
    "the settings' warmup edited": (config_settings(warmup=7), "says --warmup 7, not 0 as"),
    # held-out round (issue 55): the data's description edited or removed was read by the report and --resume
    "config.json's task edited": (config_task(lambda task: task["sizes"].update(train=9000)),
                                   "config.json: its task, the description of the sweep's data, has changed"),
    "config.json's task emptied": (config_task(lambda task: task.clear()),
                                   "config.json: its task, the description of the sweep's data, has changed"),
    # config.json's list of models as no sweep writes it (the readers and --resume each say "models lists ...")
    "a models entry with a key no sweep writes": (config_model_0(lambda m: m.update(evil=1)), "models lists"),
    "a models entry without its seed": (config_model_0(lambda m: m.pop("seed")), "models lists"),
    # the report drew from the folder without opening the weights load_run(DIR).model(i) builds from
    "a weights header of 2**63 bytes": (lying_weights_header, run_folder.WEIGHTS),
    "another pack's weights": (swapped_weights, "not this run's pack"),
    # round 5: a pack stripped of its record, a pack that is a link or a copy under another name, packs/ a file,
    # config.json's models emptied, a top-level file a folder: each passed the readers or the finished --resume
    "a pack's digests.json removed, its weights edited": (
        lambda f: ((f / "packs" / "0" / run_folder.DIGESTS).unlink(), weights_scaled_keeping_their_header(f)),
        "packs/0/digests.json is missing"),
    "a pack folder a link to its copy, its weights edited": (pack_0_a_link, "packs/0 is a link"),
    "a pack copied under another name": (lambda f: shutil.copytree(f / "packs" / "0", f / "packs" / "00"),
                                         "packs/00 is not one of this sweep's packs or checkpoints"),
    "packs a file": (lambda f: (shutil.rmtree(f / "packs"), (f / "packs").write_text("x")),
                     "packs is not a folder"),
    "config.json's models emptied": (config_with_models([]), "which config.json does not list"),
    "digests.json a folder": (lambda f: ((f / run_folder.DIGESTS).unlink(), (f / run_folder.DIGESTS).mkdir()),
                              "digests.json is not"),
    "results.parquet a folder": (lambda f: ((f / run_folder.RESULTS).unlink(), (f / run_folder.RESULTS).mkdir()),
                                 "results.parquet is not a"),
}


UNLISTED = {"a learning rate of 0", "a negative weight decay", "config.json's models emptied"}
REMADE_BY_RESUME = {"results.parquet removed and a score edited in curves.parquet", "results.parquet damaged"}


@pytest.mark.parametrize("tamper", TAMPERS)
def test_the_report_and_load_run_refuse_a_tampered_folder_alike(tamper, finished, tmp_path, capsys):
    folder = copy_of(finished, tmp_path)
    spoil, must_name = TAMPERS[tamper]
    spoil(folder)
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    assert report.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and must_name in err, err[:500]
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before  # nothing written, no figure
    with pytest.raises(ReportError, match=must_name):
        pe_fast.load_run(folder)
    # --resume of the finished folder reads it as the readers do (it once said "finished" whatever it held); one
    # whose results.parquet does not read is not finished: its top-level files are made again from its packs, each
    # checked against its own record, and the folder reads
    resumed = sweep_in_process("--resume", "--out", str(folder), "--no-report")
    if tamper in REMADE_BY_RESUME:
        assert resumed.returncode == 0, resumed.stderr[-500:]
        assert (pe_fast.load_run(folder).curves["test_acc"] != 0.99).all()
        return
    # (where config.json lists no models, --resume refuses that first: it checks the list against the grid)
    named = "config.json: models do not list" if tamper in UNLISTED else must_name
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1 and named in resumed.stderr, \
        resumed.stderr[:500]
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before


def test_a_pack_folder_is_not_taken_for_a_results_folder(finished, tmp_path, capsys):
    """The report wrote report.md and figures/ into a finished pack given as DIR, and the sweep's own readers then
    refused the sweep ("figures was added to a finished pack's folder"); a copy of a pack taken out is no run
    either."""
    folder = copy_of(finished, tmp_path)
    pack = folder / "packs" / "0"
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    assert report.main([str(pack)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {pack} is pack 0 of the sweep {folder.resolve()}; pass that folder\n", err
    with pytest.raises(ReportError, match="is pack 0 of the sweep"):
        pe_fast.load_run(pack)
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    shutil.copy(folder / run_folder.CONFIG, pack / run_folder.CONFIG)  # a config.json beside it makes it no run
    with pytest.raises(ReportError, match="is pack 0 of the sweep"):
        pe_fast.load_run(pack)
    (pack / run_folder.CONFIG).unlink()
    taken_out = shutil.copytree(pack, tmp_path / "pack")
    with pytest.raises(ReportError, match="is a sweep's pack .*pass the sweep's folder"):
        pe_fast.load_run(taken_out)
    assert pe_fast.load_run(folder).results["model_id"].is_unique


def test_a_sweep_killed_before_its_record_is_finished_by_resume(finished, tmp_path):
    """Killed between the top-level files and digests.json: --resume said "finished; nothing to resume", and the
    folder kept no record of its files (the readers could not check them) and its dead sweep's lock."""
    folder = copy_of(finished, tmp_path)
    (folder / run_folder.DIGESTS).unlink()
    ended = subprocess.Popen(["true"])
    ended.wait()  # its pid, a dead sweep's
    (folder / run_folder.LOCK).write_text(json.dumps({"pid": ended.pid, "host": socket.gethostname(),
                                                        "started": "2026-12-07 05:00:00"}))
    results = pe_fast.load_run(folder).results
    resumed = sweep_in_process("--resume", "--out", str(folder), "--no-report")
    assert resumed.returncode == 0, resumed.stderr
    assert (folder / run_folder.DIGESTS).is_file() and not (folder / run_folder.LOCK).exists()
    run = pe_fast.load_run(folder)
    assert not any("digests.json" in note for note in run.notes)
    pd.testing.assert_frame_equal(run.results.drop(columns="train_seconds"), results.drop(columns="train_seconds"))


def test_a_link_out_of_the_folder_is_refused_by_every_reader(finished, tmp_path, capsys):
    folder = copy_of(finished, tmp_path)
    outside = tmp_path / "config.json"
    (folder / run_folder.CONFIG).rename(outside)
    (folder / run_folder.CONFIG).symlink_to(outside)
    with pytest.raises(ReportError, match="is a link to"):
        pe_fast.load_run(folder)
    assert compare_lst_logs.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a link to" in err, err
    assert not (folder / "compare_lst_logs.md").exists()


def set_train(value):
    return lambda config: config["task"]["sizes"].update(train=value)


SIZES = {  # config.json's task.sizes.train, which the epochs divide by, and how the refusal shows it
    "None": (set_train(None), "task.sizes.train is None"),
    "text": (set_train("abc"), "task.sizes.train is 'abc'"),
    "a list": (set_train([1, 2]), "task.sizes.train is [1, 2]"),
    "negative": (set_train(-1), "task.sizes.train is -1"),
    "a fraction": (set_train(0.5), "task.sizes.train is 0.5"),
    "true": (set_train(True), "task.sizes.train is True"),
    "missing": (lambda config: config["task"]["sizes"].pop("train"), "task.sizes.train is missing"),
    "sizes a list": (lambda config: config["task"].update(sizes=[8100, 900]), "task.sizes is [8100, 900]"),
    "no task": (lambda config: config.pop("task"), "task is None"),
}


@pytest.mark.parametrize("sizes", SIZES)
def test_compare_lst_logs_refuses_a_training_size_that_is_not_a_count(sizes, finished, tmp_path, capsys):
    folder = copy_of(finished, tmp_path)
    config = json.loads((folder / run_folder.CONFIG).read_text())
    spoil, shown = SIZES[sizes]
    spoil(config)
    (folder / run_folder.CONFIG).write_text(json.dumps(config))
    run_folder.write_digests(folder)  # rewritten too, as whoever edits a folder can: the description is read
    assert compare_lst_logs.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{shown}, not the training split's number" in err, err
    assert not (folder / "compare_lst_logs.md").exists()


def test_compare_lst_logs_writes_nothing_into_the_package(finished, capsys):
    table = run_folder.PACKAGE / "hostile_table.md"
    try:
        assert compare_lst_logs.main([str(finished), "--out", str(table)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "inside the pe_fast package's own folder" in err, err
        assert not table.exists()
    finally:
        table.unlink(missing_ok=True)


def test_compare_lst_logs_refuses_a_folder_without_curves(finished, tmp_path, capsys):
    folder = copy_of(finished, tmp_path)
    # an older pe_fast's folder, without a record of its files or settings (with one, the record names the missing
    # file)
    for path in [folder / run_folder.CURVES, *folder.glob(f"packs/*/{run_folder.CURVES}"),
                 folder / run_folder.DIGESTS, *folder.glob(f"packs/*/{run_folder.DIGESTS}"),
                 *folder.glob(f"packs/*/{run_folder.TRAINED_WITH}")]:
        path.unlink()
    assert compare_lst_logs.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no curves" in err, err


def without_settings(config):
    del config["settings"]


def pe_of_no_kind(config):
    config["settings"]["pe"] = ["learned", "<b>x</b>|`y`"]


def heads_beyond_the_width(config):
    config["settings"]["heads"] = 2 ** 80


def model_relabelled(config):
    config["models"][0]["pe"] = "rope"


CONFIG_TAMPERS = {  # each passed the report and load_run, and --resume refused it
    "no settings": (without_settings, "not a sweep's config"),
    "a pe of no kind": (pe_of_no_kind, "is not a PE of --task lst"),
    "heads that do not divide the width": (heads_beyond_the_width, "must be divisible by --heads"),
    "a model's PE relabelled": (model_relabelled, "models lists model 0 with pe 'rope'"),
}


@pytest.mark.parametrize("tamper", CONFIG_TAMPERS)
def test_every_reader_refuses_settings_the_resume_refuses(tamper, finished, tmp_path, capsys):
    folder = copy_of(finished, tmp_path)
    spoil, must_name = CONFIG_TAMPERS[tamper]
    config = json.loads((folder / run_folder.CONFIG).read_text())
    spoil(config)
    (folder / run_folder.CONFIG).write_text(json.dumps(config))
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    for program in (report, compare_lst_logs):
        assert program.main([str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and must_name in err, err[:500]
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    with pytest.raises(ReportError, match=must_name):
        pe_fast.load_run(folder)


# The readers as a user who may not read the file: called in a process of its own, without_read_override.
READ_AS_ANOTHER_USER = """
import contextlib, io, json, sys
import pe_fast
from pe_fast import compare_lst_logs, report
from sweep_harness import sweep_in_process, without_read_override
folder = sys.argv[1]
answers = {}
readers = (("report", lambda: report.main([folder])), ("compare_lst_logs", lambda: compare_lst_logs.main([folder])))
for name, call in readers:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        answers[name] = [call(), err.getvalue()]
resumed = sweep_in_process("--resume", "--out", folder, "--no-report")
answers["resume"] = [resumed.returncode, resumed.stderr]
try:
    pe_fast.load_run(folder)
    answers["load_run"] = [0, ""]
except Exception as error:
    answers["load_run"] = [type(error).__name__, str(error) + "\\n"]
print(json.dumps(answers))
"""


@pytest.mark.parametrize("hidden", ["config.json", "packs", "packs/0/weights.safetensors", "packs/1/curves.parquet"])
def test_a_file_the_user_may_not_read_is_one_line_from_every_reader(hidden, finished, tmp_path):
    """A mode-000 file or folder in someone else's results folder: once a PermissionError traceback from load_run
    and compare_lst_logs, and --resume's exit 1 telling the user to free space."""
    folder = copy_of(finished, tmp_path)
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    (folder / hidden).chmod(0)
    done = subprocess.run([*without_read_override(), sys.executable, "-c", READ_AS_ANOTHER_USER, str(folder)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                                           os.environ.get("PYTHONPATH", "")])})
    (folder / hidden).chmod(0o755 if (folder / hidden).is_dir() else 0o644)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    for reader in ("report", "compare_lst_logs", "resume"):
        code, err = answers[reader]
        assert code == 2 and err.count("\n") == 1 and str(folder / hidden) in err and "Permission denied" in err, \
            (reader, err[-800:])
    assert answers["load_run"][0] == "ReportError" and f"{folder / hidden}: Permission denied" in answers["load_run"][1]
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("record, must_name", [
    ([], "trained_with.json is not a record of settings a pe_fast writes"),
    ({"foo": 1}, "trained_with.json is not a record of settings a pe_fast writes"),
    # Python's == took False for 0
    ("warmup false", "says --warmup 0, not False as"),
])
def test_a_forged_record_of_a_pack_s_settings_is_named(record, must_name, finished, tmp_path, capsys):
    folder = copy_of(finished, tmp_path)
    path = folder / "packs" / "0" / run_folder.TRAINED_WITH
    if record == "warmup false":
        record = {**json.loads(path.read_text()), "warmup": False}
    path.write_text(json.dumps(record))
    run_folder.write_digests(path.parent)  # rewritten with it: the record of digests is no signature
    assert report.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and must_name in err, err


def test_a_report_of_the_unfinished_sweep_is_removed_when_a_resume_finishes_it(finished, tmp_path, capsys):
    """report.md said "partial: 1 of 2 packs" after the resumed sweep (--no-report) had finished, and the RDMs of one
    pack stayed beside it: nothing marked them old."""
    folder = copy_of(finished, tmp_path)
    for name in ("results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt", "digests.json"):
        (folder / name).unlink()
    shutil.rmtree(folder / "packs" / "1")
    assert report.main([str(folder)]) == 0
    assert "partial: 1 of 2 packs" in (folder / run_folder.REPORT).read_text()
    (folder / run_folder.RDMS).write_bytes(b"the unfinished sweep's")
    (folder / run_folder.FIGURES / "my_notes.txt").write_text("mine")  # figures/ may hold the user's own files
    capsys.readouterr()
    resumed = sweep_in_process("--resume", "--out", str(folder), "--no-report")
    assert resumed.returncode == 0, resumed.stderr
    assert f"note: removed the report of the unfinished sweep (report.md, rdms.hdf5); python -m pe_fast.report " \
           f"{folder} writes it for the finished one (and redraws figures/)" in resumed.stderr
    assert not any((folder / name).exists() for name in (run_folder.REPORT, run_folder.RDMS))
    assert (folder / run_folder.FIGURES / "my_notes.txt").read_text() == "mine"
    assert not any("partial" in note for note in pe_fast.load_run(folder).notes)


def test_files_a_system_adds_unasked_are_left_alone_and_other_strays_refused(finished, tmp_path, capsys):
    """Finder's .DS_Store and Jupyter's .ipynb_checkpoints appear without the user doing anything: they were refused
    in packs/ and in a pack's folder (never read, they are now passed by); a name that merely holds ".partial-" is no
    writer's temporary file (those start with a dot) and is refused."""
    folder = copy_of(finished, tmp_path)
    for made in (folder / "packs" / ".DS_Store", folder / "packs" / "0" / ".DS_Store"):
        made.write_bytes(b"\0")
    (folder / "packs" / ".ipynb_checkpoints").mkdir()
    assert pe_fast.load_run(folder).results["model_id"].is_unique
    shutil.copytree(folder / "packs" / "0", folder / "packs" / "backup.partial-mine")
    with pytest.raises(ReportError, match="packs/backup.partial-mine is not one of this sweep's packs"):
        pe_fast.load_run(folder)
