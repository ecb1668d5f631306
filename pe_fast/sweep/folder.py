"""What the sweep puts into its results folder at the start (config.json, the ground truth) and at the end
(results with the task's baselines, curves, PE tables, the summary table); pe_fast.results.run_folder writes them."""
from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
import torch

from pe_fast.results import reading, run_folder
from pe_fast.results.summary import attention_map_alignment, summary_table
from pe_fast.results.settings import Settings
from pe_fast.tasks import KINDS


def start_folder(s: Settings, out: Path, task, models: list[dict], packs: list[list[dict]]):
    pack_of = {m["model_id"]: index for index, pack in enumerate(packs) for m in pack}
    config = {"settings": s.to_json(), "task": task.description, "torch": torch.__version__,
              "models": [{**m, "pack": pack_of[m["model_id"]]} for m in models],
              "packs": [[m["model_id"] for m in pack] for pack in packs],
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    run_folder.write_start(out, config, task.ground_truth())


def finish_folder(s: Settings, out: Path, task, models: list[dict], num_packs: int) -> pd.DataFrame:
    """Every pack together, with the task's baselines and the summary table."""
    parts = [reading.read_pack(run_folder.pack_folder(out, index), s.task) for index in range(num_packs)]
    results = pd.concat([part[0] for part in parts], ignore_index=True)
    curves = pd.concat([part[1] for part in parts], ignore_index=True)
    pe_tables = {key: table for part in parts for key, table in part[2].items()}
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


def check_pack_holds(directory: Path, results: pd.DataFrame, pack: list[dict], s: Settings, index: int):
    """A finished pack's results hold this pack's models, each as the grid made it (its PE, σ, seed and axes) and
    as this sweep trains it (task, precision, pack index, at most --steps), or one ReportError naming the first
    that differs: a pack folder copied from another pack or sweep would join the results as if this pack had
    trained it."""
    trained = {"task": s.task, "precision": s.precision, "pack": index}
    for name, value in trained.items():
        if name in results and (results[name] != value).any():
            found = results[name][results[name] != value].iloc[0]
            found = found.item() if hasattr(found, "item") else found
            raise reading.ReportError(f"{directory}: its results have {name} {found!r:.40}, where this sweep's "
                                      f"pack {index} has {value!r}")
    if "steps" in results and not results["steps"].between(1, s.steps).all():
        raise reading.ReportError(f"{directory}: its results have steps {int(results['steps'].max())}, beyond this "
                                  f"sweep's --steps {s.steps}")
    wanted = {model["model_id"]: model for model in pack}
    found = sorted(int(i) for i in results["model_id"]) if "model_id" in results else []
    if found != sorted(wanted):
        raise reading.ReportError(f"{directory}: its results hold models {found[:8]}, not this pack's "
                                  f"{sorted(wanted)[:8]}")
    for row in results.to_dict("records"):
        model = wanted[int(row["model_id"])]
        if (key := reading.differing_key(model, row)) is not None:
            raise reading.ReportError(f"{directory}: its model {model['model_id']} has {key} {row.get(key)!r:.40}, "
                                      f"where this sweep's has {model[key]!r}")
