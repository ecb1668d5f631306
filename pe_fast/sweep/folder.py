"""What the sweep puts into its results folder at the start (config.json, the ground truth) and at the end
(results with the task's baselines, curves, PE tables, the summary table); pe_fast.run_folder writes them."""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pe_fast import run_folder
from pe_fast.metrics import attention_maps
from pe_fast.report.numbers import axis_label, varying_axes
from pe_fast.sweep.settings import Settings
from pe_fast.tasks import KINDS


def start_folder(s: Settings, out: Path, task, models: list[dict], packs: list[list[dict]]):
    pack_of = {m["model_id"]: index for index, pack in enumerate(packs) for m in pack}
    config = {"settings": s.to_json(), "task": task.description, "torch": torch.__version__,
              "models": [{**m, "pack": pack_of[m["model_id"]]} for m in models],
              "packs": [[m["model_id"] for m in pack] for pack in packs],
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    run_folder.write_start(out, config, task.ground_truth())


def summary_table(results: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """Mean ± sd over seeds for each (PE, σ, every optimizer axis that varies), of the task's summary columns
    that the results hold."""
    metrics = [c for c in columns if c in results]
    axes = varying_axes(results)
    rows = []
    for key, group in results.groupby(["pe", "sigma", *axes], dropna=False, sort=False):
        pe, sigma, *values = key
        row = {"pe": pe, "sigma": "" if math.isnan(sigma) else f"{sigma:g}",
               **{a: axis_label(a, v) for a, v in zip(axes, values)}, "seeds": len(group)}
        for metric in metrics:
            values = group[metric].to_numpy(dtype=float)
            scale = 100.0 if metric.endswith("acc") or "_acc_" in metric else 1.0
            digits = 1 if scale == 100.0 else 3
            row[metric] = f"{np.nanmean(values) * scale:.{digits}f} ± {np.nanstd(values) * scale:.{digits}f}" \
                if np.isfinite(values).any() else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def attention_map_alignment(results: pd.DataFrame, pe_tables: dict, reference_pe: str | None) -> np.ndarray:
    """Per results row, the alignment of the model's mean attention maps with those of the task's ground-truth
    PE models (metrics.attention_maps.map_alignment); NaN where the task has none or the run trained none."""
    maps = {i: pe_tables[f"{run_folder.ATTENTION_MAP}{i}"] for i in results["model_id"]
            if f"{run_folder.ATTENTION_MAP}{i}" in pe_tables}
    reference_ids = list(results.loc[results["pe"] == reference_pe, "model_id"]) if reference_pe else []
    scores = attention_maps.map_alignment(maps, reference_ids)
    return results["model_id"].map(scores).astype(float).to_numpy()


def finish_folder(s: Settings, out: Path, task, models: list[dict], num_packs: int) -> pd.DataFrame:
    """Every pack together, with the task's baselines and the summary table."""
    results, curves, pe_tables = run_folder.read_packs(out, num_packs)
    results["attn_map_alignment"] = attention_map_alignment(results, pe_tables, KINDS[s.task].view.reference_pe)
    baselines = [dict(task=s.task, model_id=len(models) + i, seed=math.nan, steps=0, pack=-1, **row)
                 for i, row in enumerate(task.baselines())]
    if baselines:
        results = pd.concat([results, pd.DataFrame(baselines)], ignore_index=True)
    if task.data_kind is not None:
        results.insert(1, "data_kind", task.data_kind)
    table = summary_table(results, KINDS[s.task].summary)
    run_folder.write_final(out, results, curves, pe_tables, table.to_string(index=False) + "\n")
    return table
