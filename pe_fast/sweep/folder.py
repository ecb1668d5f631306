"""What the sweep writes into its results folder at the start (config.json, the ground truth) and at the end
(results, curves, PE tables, the summary); pe_fast.run_folder holds the layout and the atomic writes."""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pe_fast import run_folder
from pe_fast.sweep.settings import Settings

SUMMARY_METRICS = ("train_acc", "test_acc", "ood_acc", "ood_acc_binary", "ood_acc_ternary", "ood_acc_quaternary",
                   "pe_rsa", "train_mse", "test_mse", "test_r2", "pe_fc_corr", "pe_coupling_corr", "pe_modularity",
                   "pe_segregation", "pe_dist_spearman")


def start_folder(s: Settings, out: Path, task, models: list[dict], packs: list[list[dict]]):
    """config.json (and the ground truth of region tasks) at the start, so that the report can read a sweep
    while it runs and --resume can continue it."""
    pack_of = {m["model_id"]: index for index, pack in enumerate(packs) for m in pack}
    config = {"settings": s.to_json(), "task": task.description, "torch": torch.__version__,
              "models": [{**m, "pack": pack_of[m["model_id"]]} for m in models],
              "packs": [[m["model_id"] for m in pack] for pack in packs],
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    run_folder.write_json(out / "config.json", config)
    if hasattr(task, "baselines"):
        data = task.data
        ground_truth = {"fc": data.fc, "labels": np.asarray(data.labels, dtype=str)}
        for name in ("networks", "centroids", "coupling"):
            if getattr(data, name) is not None:
                ground_truth[name] = getattr(data, name)
        run_folder.write_atomic(out / "ground_truth.npz", lambda tmp: save_npz(tmp, ground_truth))


def save_npz(path: Path, arrays: dict):
    with open(path, "wb") as file:  # a file object: np.savez would add ".npz" to the temporary name
        np.savez_compressed(file, **arrays)


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean ± sd over seeds for each (PE, σ)."""
    metrics = [c for c in SUMMARY_METRICS if c in results]
    rows = []
    for (pe, sigma), group in results.groupby(["pe", "sigma"], dropna=False, sort=False):
        row = {"pe": pe, "sigma": "" if math.isnan(sigma) else f"{sigma:g}", "seeds": len(group)}
        for metric in metrics:
            values = group[metric].to_numpy(dtype=float)
            scale = 100.0 if metric.endswith("acc") or "_acc_" in metric else 1.0
            digits = 1 if scale == 100.0 else 3
            row[metric] = f"{np.nanmean(values) * scale:.{digits}f} ± {np.nanstd(values) * scale:.{digits}f}" \
                if np.isfinite(values).any() else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def finish_folder(s: Settings, out: Path, task, models: list[dict], num_packs: int) -> pd.DataFrame:
    """Every pack together in the top-level files; results.parquet last (its presence means finished)."""
    results, curves, pe_tables = run_folder.read_packs(out, num_packs)
    if hasattr(task, "baselines"):
        rows = [dict(task=s.task, model_id=len(models) + i, seed=math.nan, steps=0, pack=-1, **row)
                for i, row in enumerate(task.baselines())]
        results = pd.concat([results, pd.DataFrame(rows)], ignore_index=True)
        # Whether the series are real fMRI, simulated from real FC, or a simulated network: never mix them up.
        results.insert(1, "data_kind", task.data.kind)
    run_folder.write_atomic(out / "pe_tables.npz", lambda tmp: save_npz(tmp, pe_tables))
    run_folder.write_atomic(out / "curves.parquet", lambda tmp: curves.to_parquet(tmp, index=False))
    table = summary_table(results)
    run_folder.write_atomic(out / "summary.txt", lambda tmp: tmp.write_text(table.to_string(index=False) + "\n"))
    run_folder.write_atomic(out / "results.parquet", lambda tmp: results.to_parquet(tmp, index=False))
    return table
