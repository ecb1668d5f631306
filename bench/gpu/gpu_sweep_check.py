"""On a GPU: pe_fast.memory's per-model estimate against torch.cuda.max_memory_allocated of real training steps
(triton and reference backends), and a small CUDA sweep killed after its first checkpoint and resumed, compared
with an uninterrupted one. Writes a JSON summary to $OUT/gpu_sweep_check.json (default bench/results).

    python bench/gpu/gpu_sweep_check.py
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast import memory
from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.train import TrainConfig, make_optimizer

OUT = Path(os.environ.get("OUT", "bench/results"))
CONFIGS = {  # name: (model config, batch size)
    "lst": (dict(num_tokens=16, token_dim=5, out_dim=4, width=64, depth=4, heads=1, mlp_width=256), 128),
    "fmri100": (dict(num_tokens=100, token_dim=2, out_dim=1, width=32, depth=2, heads=1, mlp_width=128), 64),
    "glasser360": (dict(num_tokens=360, token_dim=2, out_dim=1, width=64, depth=2, heads=4, mlp_width=256), 16),
}


def measured_per_model(config: ModelConfig, batch: int, models: int, backend: str) -> float:
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    model = StackedTransformer(dataclasses.replace(config, backend=backend), list(range(models)),
                               [0.5] * models).cuda()
    optimizer = make_optimizer(model.parameters(), TrainConfig(steps=1, optimizer="adam"))
    tokens = torch.randn(models, batch, config.num_tokens, config.token_dim, device="cuda")
    for step in range(2):  # the second step has the optimizer's state
        if step == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        outputs, _ = model(tokens)
        optimizer.zero_grad(set_to_none=True)
        outputs.square().mean().backward()
        optimizer.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del model, optimizer, tokens, outputs
    return peak / models


def memory_check() -> list[dict]:
    rows = []
    for name, (fields, batch) in CONFIGS.items():
        config = ModelConfig(**fields)
        for backend in ("triton", "reference"):
            try:
                measured = measured_per_model(config, batch, 8, backend)
            except Exception as error:  # a backend missing on this machine
                rows.append(dict(config=name, backend=backend, error=f"{type(error).__name__}: {error}"[:200]))
                continue
            estimate = memory.bytes_per_model(config, batch, "adam", backend)
            rows.append(dict(config=name, backend=backend, estimate_mb=estimate / 2**20,
                             measured_mb=measured / 2**20, ratio=estimate / measured))
            print(rows[-1], flush=True)
    return rows


SWEEP = ["--task", "netsim", "--nodes", "40", "--modules", "4", "--timepoints", "300", "--width", "32", "--depth",
         "2", "--batch-size", "32", "--seeds", "2", "--pe", "learned", "--sigmas", "0.1,1", "--max-pack", "2",
         "--steps", "300", "--eval-every", "50", "--checkpoint-every", "25", "--device", "cuda", "--no-report"]


def sweep(*args, wait=True):
    proc = subprocess.Popen([sys.executable, "-m", "pe_fast.sweep", *SWEEP, *args], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    if wait:
        proc.wait()
    return proc


def resume_check() -> dict:
    import numpy as np
    import pandas as pd
    base = OUT / "gpu_sweep"
    subprocess.run(["rm", "-rf", str(base)])
    whole, cut = base / "whole", base / "cut"
    first = sweep("--out", str(cut), wait=False)
    while not (cut / "packs").is_dir() or not list((cut / "packs").glob("*.checkpoint.pt")):
        if first.poll() is not None:
            return {"error": first.stderr.read()[-500:]}
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    resumed = subprocess.run([sys.executable, "-m", "pe_fast.sweep", "--resume", "--out", str(cut)],
                             capture_output=True, text=True)
    done = sweep("--out", str(whole))
    out = {"killed_rc": first.returncode, "resume_rc": resumed.returncode, "whole_rc": done.returncode,
           "resume_stderr": resumed.stderr[-600:]}
    if resumed.returncode == 0 and done.returncode == 0:
        for name in ("results.parquet", "curves.parquet"):
            a = pd.read_parquet(cut / name).drop(columns=["train_seconds"], errors="ignore")
            b = pd.read_parquet(whole / name).drop(columns=["train_seconds"], errors="ignore")
            numeric = a.select_dtypes("number").columns
            diff = np.nanmax(np.abs(a[numeric].to_numpy(float) - b[numeric].to_numpy(float)))
            out[f"{name}_equal"] = bool(a.equals(b))
            out[f"{name}_max_abs_diff"] = float(diff)
    return out


def main():
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no flags: --help, and no typos
    OUT.mkdir(parents=True, exist_ok=True)
    result = {"device": measure.device_name("cuda"), "torch": torch.__version__,
              "free_gb": torch.cuda.mem_get_info()[0] / 2**30, "memory": memory_check()}
    result["resume"] = resume_check()
    print(json.dumps(result["resume"], indent=1))
    measure.write_result(OUT / "gpu_sweep_check.json", result)


if __name__ == "__main__":
    main()
