"""Several results folders as one run: `python -m pe_fast.report A B ... --out DIR`, and compare_lst_logs.

Sweeps of one configuration that trained different models (other PE kinds, σ or seeds: a `--pe learned` run and a
later `--pe sin1d` one, or a fifth seed added with `--seed-values`) pool into a results folder of their own. Its
report sets them side by side and pairs them by seed, as if one sweep had trained them all. The models are
renumbered in the order of the folders; the task's baselines, ground truth and task description are the first
folder's, after checking that every folder has the same ones.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pe_fast.results import run_folder
from pe_fast.results.reading import (ReportError, Run, check_alike, check_named_once, read_npz, read_run,
                                     recorded_settings, task_name)
from pe_fast.results.settings import Settings, pe_dropout_of
from pe_fast.results.summary import GRID_AXES, attention_map_alignment, is_baseline, sigma_label, summary_table
from pe_fast.tasks import KINDS

def pooled_dropout(settings: dict[Path, Settings]) -> tuple[float, list[str]]:
    """(pe_dropout, pe_dropout_on) of the pooled run: each PE kind must have trained with one dropout in every
    folder, and the kinds with dropout with one rate, so that the pooled config.json records what each model had."""
    rate_of: dict[str, tuple[float, Path]] = {}
    for directory, setting in settings.items():
        for kind in setting.pe:
            rate = pe_dropout_of(setting, kind)
            if kind in rate_of and rate_of[kind][0] != rate:
                raise ReportError(f"{kind} trained with PE dropout {rate:g} in {directory} and "
                                  f"{rate_of[kind][0]:g} in {rate_of[kind][1]}: not one run's models")
            rate_of.setdefault(kind, (rate, directory))
    rates = {rate for rate, _ in rate_of.values() if rate > 0}
    if len(rates) > 1:
        raise ReportError(f"the folders train PE kinds with different PE dropout rates ({', '.join(map(str, rates))}); "
                          f"one pooled config.json records only one")
    first = next(iter(settings.values()))
    if not rates:
        return first.pe_dropout, list(first.pe_dropout_on)
    return rates.pop(), [kind for kind, (rate, _) in rate_of.items() if rate > 0]


def same_ground_truth(directories: list[Path]) -> dict[str, np.ndarray]:
    """The folders' ground truth (FC, networks, ...), which must be the same wherever a folder has one."""
    truths = {d: read_npz(d / run_folder.GROUND_TRUTH) for d in directories if (d / run_folder.GROUND_TRUTH).is_file()}
    if not truths:
        return {}
    (first_dir, first), *others = truths.items()
    for directory, truth in others:
        if truth.keys() != first.keys() or not all(np.array_equal(truth[k], first[k]) for k in first):
            raise ReportError(f"{directory} and {first_dir} have different ground truths (task data): not one run")
    return first


def renumbered(run: Run, offset: int) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray], dict[int, int]]:
    """One folder's models, curves and PE tables with model ids from offset on, and the map old id → new."""
    models = run.results[~is_baseline(run.results["pe"])]
    new_id = {int(old): offset + i for i, old in enumerate(models["model_id"])}
    models = models.assign(model_id=models["model_id"].map(new_id))
    curves = run.curves
    if "model_id" in curves:
        curves = curves[curves["model_id"].isin(new_id)].assign(model_id=curves["model_id"].map(new_id))
    tables = {}
    for key, table in run.pe_tables.items():
        prefix, _, old = key.rpartition("_")
        if old.isdigit() and int(old) in new_id:
            tables[f"{prefix}_{new_id[int(old)]}"] = table
    return models, curves, tables, new_id


def pool(directories: list[Path], out: Path) -> Path:
    """Write the pooled results folder out (config.json, results, curves, PE tables, summary) and return it."""
    if len(directories) < 2:
        raise ReportError("pooling needs two or more results folders (one folder: python -m pe_fast.report DIR)")
    check_named_once(directories)
    try:
        run_folder.check_out_folder(out, probe=False)
        if out.exists() and any(out.iterdir()):  # before the write probe: a refused folder is left untouched
            raise ReportError(f"--out {out} exists and is not an empty folder; the pooled run goes to a new one")
        run_folder.check_writable(out)
    except run_folder.OutFolderError as error:
        raise ReportError(f"--out {error}")
    runs = {d: read_run(d) for d in directories}
    for directory, run in runs.items():
        if not run_folder.is_finished(directory):
            raise ReportError(f"{directory} has not finished (no results.parquet); pool finished sweeps")
    tasks = {task_name(run) for run in runs.values()}
    if len(tasks) > 1:
        raise ReportError(f"the folders ran different tasks ({', '.join(sorted(tasks))})")
    view = KINDS[tasks.pop()].view
    settings = {d: recorded_settings(d, run) for d, run in runs.items()}
    check_alike(settings)
    first_dir, first = directories[0], runs[directories[0]]
    for directory, run in runs.items():
        if run.config.get("task") != first.config.get("task"):
            raise ReportError(f"{directory} and {first_dir} describe different task data in config.json (task): "
                              f"not one run")
    pe_dropout, pe_dropout_on = pooled_dropout(settings)
    truth = same_ground_truth(directories)

    parts, offset = [], 0
    for run in runs.values():
        parts.append(renumbered(run, offset))
        offset += len(parts[-1][3])
    results = pd.concat([p[0] for p in parts], ignore_index=True)
    key = ["pe", "sigma", "seed", *[a for a in GRID_AXES if a in results]]
    twice = results[results.duplicated(key, keep=False)]
    if len(twice):
        row = twice.iloc[0]
        seed = int(row.seed) if pd.notna(row.seed) else None  # as given: 16777217 is not 1.67772e+07
        raise ReportError(f"{row.pe} σ={sigma_label(row.sigma)} seed {seed} is in more than one folder; give each "
                          f"model once")
    pe_tables = {k: v for p in parts for k, v in p[2].items()}
    if "attn_map_alignment" in results:  # against the pooled reference models, where every folder kept its maps
        maps_everywhere = all(any(k.startswith(run_folder.ATTENTION_MAP) for k in run.pe_tables)
                              for run in runs.values())
        results["attn_map_alignment"] = (attention_map_alignment(results, pe_tables, view.reference_pe)
                                         if maps_everywhere else np.nan)
    baselines = first.results[is_baseline(first.results["pe"])]
    results = pd.concat([results, baselines.assign(model_id=np.arange(offset, offset + len(baselines)))],
                        ignore_index=True)
    curves = pd.concat([p[1] for p in parts], ignore_index=True)

    new_ids = [p[3] for p in parts]
    # each model's source: its folder's place in pooled_from and its id there (Run.model opens it there)
    models = [{**m, "model_id": ids[m["model_id"]], "pack": -1, "pooled_from": [folder, m["model_id"]]}
              for folder, (run, ids) in enumerate(zip(runs.values(), new_ids))
              for m in run.config.get("models") or [] if m.get("model_id") in ids]
    merged = dataclasses.replace(
        settings[first_dir], out=str(out),
        pe=tuple(dict.fromkeys(kind for s in settings.values() for kind in s.pe)),
        sigmas=tuple(sorted({sigma for s in settings.values() for sigma in s.sigmas})),
        seed_values=tuple(sorted({int(seed) for seed in results["seed"].dropna()})),
        seeds=int(results["seed"].nunique()), pe_dropout=pe_dropout, pe_dropout_on=tuple(pe_dropout_on),
        preset=first.config["settings"].get("preset") if len({s.preset for s in settings.values()}) == 1 else None)
    config = {"settings": merged.to_json(), "task": first.config.get("task"),
              "torch": ", ".join(sorted({str(run.config.get("torch")) for run in runs.values()})),
              "models": models, "packs": [], run_folder.POOLED_FROM: [str(d.resolve()) for d in directories],
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out.mkdir(parents=True, exist_ok=True)
    run_folder.write_start(out, config, truth)
    # what its models trained with, the settings merged: an edited config.json is found out (digests.json lists it)
    run_folder.write_json(out / run_folder.TRAINED_WITH, merged.trained_with())
    table = summary_table(results, KINDS[merged.task].summary)
    run_folder.write_final(out, results, curves, pe_tables, table.to_string(index=False) + "\n")
    return out
