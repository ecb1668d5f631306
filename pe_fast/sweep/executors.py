"""Where the packs train: here, one after the other (local), or as Ray tasks. A pack's unit of work,
train_and_store_pack, is the same for both: train from its checkpoint, if any, and write DIR/packs/<index>/."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from pathlib import Path

import pandas as pd
import torch

from pe_fast import memory, precision, run_folder
from pe_fast.sweep import live_curves
from pe_fast.sweep.grid import model_config, train_config
from pe_fast.sweep.live_curves import LiveCurves
from pe_fast.sweep.progress import Progress
from pe_fast.sweep.settings import Settings
from pe_fast.sweep.task_loading import load_task
from pe_fast.train import PackTrainer


def apply_runtime(s: Settings):
    """Process-wide settings, in the sweep's process and in every Ray worker: threads, backend, malloc, TF32."""
    memory.keep_freed_memory()
    precision.apply(s.precision)
    if s.threads:
        torch.set_num_threads(s.threads)
    if s.backend is not None:
        os.environ["PE_FAST_BACKEND"] = s.backend


def train_and_store_pack(s: Settings, index: int, pack: list[dict], out: Path, task, on_step=None) -> dict:
    """Train pack `index` (from its checkpoint, if it has one), checkpointing as it goes, and write
    DIR/packs/<index>/. Returns {index, models, trained_steps}."""
    trainer = PackTrainer(task, model_config(s, task, pack[0]["pe"]), train_config(s, pack),
                          [m["seed"] for m in pack], [m["sigma"] for m in pack], torch.device(s.device))
    state = run_folder.load_checkpoint(out, index)
    if state is not None:
        trainer.load_state_dict(state)
    first_step = trainer.step
    live = LiveCurves(out, pack, live_curves.varying_axes(s), first_step) if s.tensorboard else None
    result = trainer.run(on_step, checkpoint=lambda: run_folder.save_checkpoint(out, index, trainer.state_dict()),
                         checkpoint_every=s.checkpoint_every, on_evaluate=live and live.evaluation)
    if live is not None:
        live.finish(result.final, trainer.step)
    final_rows, curve_rows, pe_tables = [], [], {}
    for local, model in enumerate(pack):
        # results.parquet's sigma is a float column: "no σ" is stored as NaN there
        stored = {**model, "sigma": math.nan if model["sigma"] is None else model["sigma"]}
        identity = dict(task=s.task, **stored, steps=s.steps, precision=s.precision, pack=index)
        final_rows.append({**identity, **{k: v for k, v in result.final[local].items() if k not in ("model", "step")},
                           "train_seconds": result.seconds / len(pack)})
        curve_rows.extend({**identity, **{k: v for k, v in row.items() if k != "model"}}
                          for row in result.curves if row["model"] == local)
        if local in result.pe_tables:
            pe_tables[f"model_{model['model_id']}"] = result.pe_tables[local]
        pe_tables[f"{run_folder.ATTENTION_MAP}{model['model_id']}"] = result.attention_maps[local]
    run_folder.write_pack(out, index, pd.DataFrame(final_rows), pd.DataFrame(curve_rows), pe_tables)
    return {"index": index, "models": len(pack), "trained_steps": s.steps - first_step}


def run_local(s: Settings, todo: list[int], packs: list[list[dict]], out: Path, task, progress: Progress):
    for index in todo:
        progress.start_pack(index, len(packs[index]))
        done = train_and_store_pack(s, index, packs[index], out, task, on_step=progress.update)
        progress.finish_pack(done["models"], done["trained_steps"])


@functools.lru_cache(maxsize=2)
def _cached_task(settings_json: str):
    return load_task(Settings.from_json(json.loads(settings_json), packs=()))


def ray_pack_task(s: Settings, index: int, pack: list[dict], out: str) -> dict:
    """The body of one Ray task: a worker loads the task (once per worker process) and trains one pack."""
    apply_runtime(s)
    task = _cached_task(json.dumps(s.to_json(), sort_keys=True))
    return train_and_store_pack(s, index, pack, Path(out), task)


def run_ray(s: Settings, todo: list[int], packs: list[list[dict]], out: Path, progress: Progress):
    """Each pack is one Ray task with its CPUs (--threads, default 1) or one GPU; the workers write the pack
    folders themselves (on a cluster, --out must be a folder every node sees). Tasks are gathered as they end."""
    import ray
    if not ray.is_initialized():
        ray.init(address=s.ray_address, include_dashboard=False, log_to_driver=False)
    gpus = 1 if s.device == "cuda" else 0
    remote = ray.remote(num_cpus=s.threads or 1, num_gpus=gpus, max_retries=0)(ray_pack_task)
    settings = dataclasses.replace(s, threads=s.threads or 1)
    pending = [remote.remote(settings, index, packs[index], str(out.resolve())) for index in todo]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        done = ray.get(ready[0])
        progress.finish_pack(done["models"], done["trained_steps"])
