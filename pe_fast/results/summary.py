"""What a results folder's models sum up to, for the sweep (summary.txt, attn_map_alignment at the end of a sweep),
the report and pooling alike: the baselines' rows, the grid's axes besides PE and σ, the summary table, the attention-map
alignment with the task's ground-truth PE models."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pe_fast import columns as names
from pe_fast.metrics import attention_maps
from pe_fast.results import run_folder
from pe_fast.results.settings import GRID_AXES  # the rows marked grid_axis, outermost first

BASELINE_PREFIX = "baseline:"  # non-transformer reference rows (fMRI / netsim): test_mse / test_r2 only


def is_baseline(pe: pd.Series) -> pd.Series:
    return pe.astype(str).str.startswith(BASELINE_PREFIX)


def varying_axes(results: pd.DataFrame) -> list[str]:
    """The grid axes whose trained models do not all share one value (none in a run without those axes)."""
    models = results[~is_baseline(results["pe"])]
    return [a for a in GRID_AXES if a in models and models[a].nunique(dropna=True) > 1]


def axis_label(axis: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value if isinstance(value, str) else f"{value:g}"


def sigma_label(sigma: float) -> str:
    return "" if not np.isfinite(sigma) else f"{sigma:g}"


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
            scale = 100.0 if names.in_percent(metric) else 1.0
            digits = 1 if scale == 100.0 else 3
            row[metric] = f"{np.nanmean(values) * scale:.{digits}f} ± {np.nanstd(values) * scale:.{digits}f}" \
                if np.isfinite(values).any() else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def attention_map_alignment(results: pd.DataFrame, pe_tables: dict, reference_pe: str | None) -> np.ndarray:
    """Per results row, the alignment of the model's mean attention maps with those of the task's ground-truth
    PE models (metrics.attention_maps.map_alignment); NaN where the task has none or the run trained none."""
    maps = {i: pe_tables[run_folder.attention_map_key(i)] for i in results["model_id"]
            if run_folder.attention_map_key(i) in pe_tables}
    reference_ids = list(results.loc[results["pe"] == reference_pe, "model_id"]) if reference_pe else []
    scores = attention_maps.map_alignment(maps, reference_ids)
    return results["model_id"].map(scores).astype(float).to_numpy()
