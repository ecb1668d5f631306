"""Where the sweep's training step spends GPU time: torch.profiler over PackTrainer.train_step at the paper's LST
configuration (bench_sweep_gpu), one precision, eager, compiled or compiled as CUDA graphs; prints the top kernels
by device time.

    python bench/training/profile_sweep_step.py [--models 90] [--precision bf16] [--compile off|on|graphs]
                                                [--out FILE.txt]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
from pe_fast import precision
from pe_fast.models import ModelConfig
from pe_fast.tasks.lst import LSTTask
from pe_fast.train import COMPILE_MODES, PackTrainer, TrainConfig
from training.bench_sweep_gpu import BATCH, DEPTH, LR, MLP, PAPER_SIGMAS, WIDTH


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=90)
    p.add_argument("--precision", default="bf16", choices=precision.PRECISIONS)
    p.add_argument("--compile", default="off", choices=COMPILE_MODES)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--backend", default=None, help="the models' compute path (default: the device's)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision.apply(args.precision)
    task = LSTTask()
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=WIDTH, depth=DEPTH, heads=1, mlp_width=MLP,
                         pe="learned", readout_token=task.readout_token,
                         backend=args.backend)
    train = TrainConfig(steps=1000, batch_size=BATCH, lr=LR, eval_every=1000, precision=args.precision,
                        compile=args.compile)
    trainer = PackTrainer(task, config, train, list(range(args.models)),
                          [PAPER_SIGMAS[m % len(PAPER_SIGMAS)] for m in range(args.models)], device)
    for _ in range(5):
        trainer.train_step()
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            trainer.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=70)
    header = f"{args.precision} compile={args.compile} backend={args.backend or 'default'} M={args.models}, {args.steps} steps\n"
    print(header + table)
    if args.out:
        Path(args.out).write_text(header + table)


if __name__ == "__main__":
    main()
