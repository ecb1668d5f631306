"""Training throughput of a pack whose models each have their own learning rate (pe_fast.stacked_optim) against the
same pack with one learning rate and torch's optimizer as pe_fast.train.make_optimizer builds it (issue 14).

    python bench/training/bench_stacked_optimizer.py [--models 36] [--repeats 7]
                                                     [--out bench/results/stacked_optimizer_cpu.json]

The pack is the fMRI default model (100 tokens, width 32, depth 2, 1 head, MLP 64, learned PE at every block,
batch 32, masked-region MSE, one probe): σ × 3 learning rates × 3 seeds = 36 models. For each optimizer kind (adam,
the fMRI default; adamw; sgd with momentum 0.9) it times the full training step (forward, backward, optimizer step,
schedule step), as the issue measures it, and the optimizer step alone, each with the two optimizers on two
identical packs. Within each of --repeats rounds the two alternate (which goes first alternates too), so a slow
spell of a shared machine hits both alike; ratios are per round, then the median.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast.memory import keep_freed_memory
from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.stacked_optim import StackedOptimizer
from pe_fast.train import TrainConfig, lr_factor, make_optimizer

FMRI_MODEL = ModelConfig(num_tokens=100, token_dim=2, out_dim=1, width=32, depth=2, heads=1, mlp_width=64,
                         pe="learned")  # the fMRI task's defaults (pe_fast.tasks.masked_regions.REGION_DEFAULTS)
BATCH, MASK_FRACTION = 32, 0.2
SCHEDULE = TrainConfig(steps=800, lr=3e-3, warmup=50, schedule="cosine")
LEARNING_RATES = (3e-4, 1e-3, 3e-3)  # the experiment
SIGMAS = (0.01, 0.1, 0.5, 2.0)
SGD_MOMENTUM = 0.9


def fmri_pack(models: int, device: torch.device) -> StackedTransformer:
    """σ × seed models; the seeds repeat so that the pack holds `models` of them."""
    sigmas = [SIGMAS[m % len(SIGMAS)] for m in range(models)]
    return StackedTransformer(FMRI_MODEL, seeds=list(range(models)), sigmas=sigmas).to(device)


def fmri_batch(models: int, device: torch.device):
    """Random inputs [M,B,N,2], targets [M,B,N,1], a mask of the regions to predict [M,B,N] and one probe."""
    g = torch.Generator().manual_seed(0)
    N = FMRI_MODEL.num_tokens
    inputs = torch.randn(models, BATCH, N, FMRI_MODEL.token_dim, generator=g)
    targets = torch.randn(models, BATCH, N, 1, generator=g)
    mask = torch.rand(models, BATCH, N, generator=g) < MASK_FRACTION
    probes = (torch.rand(1, N, N, generator=g) < 0.2).float()
    return [t.to(device) for t in (inputs, targets, mask, probes)]


def training_step(model, optimizer, scheduler, inputs, targets, mask, probes):
    """As pe_fast.train.PackTrainer.train_step, with the masked-region loss (each model's mean over its mask)."""
    outputs, _ = model(inputs, probes)
    weight = mask.float()
    loss = (((outputs - targets) ** 2).mean(-1) * weight).sum((1, 2)) / weight.sum((1, 2))
    optimizer.zero_grad(set_to_none=True)
    loss.sum().backward()
    optimizer.step()
    scheduler.step()


def optimizers(kind: str, models: int, one_lr_pack, per_model_pack):
    """torch's optimizer with one lr (the sweep's today) and StackedOptimizer with σ × 3 lr × seed rates."""
    momentum = SGD_MOMENTUM if kind == "sgd" else 0.0
    one_lr = make_optimizer(one_lr_pack.parameters(), TrainConfig(steps=1, lr=SCHEDULE.lr, optimizer=kind,
                                                                  momentum=momentum))
    lrs = [LEARNING_RATES[(m // len(SIGMAS)) % len(LEARNING_RATES)] for m in range(models)]
    per_model = StackedOptimizer(per_model_pack.parameters(), kind, lr=lrs, momentum=momentum)
    return [(opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, SCHEDULE)))
            for opt in (one_lr, per_model)]


def bench_kind(kind: str, models: int, repeats: int, device: torch.device) -> dict:
    batch = fmri_batch(models, device)
    packs = [fmri_pack(models, device), fmri_pack(models, device)]  # [one lr, per-model lr]
    pairs = optimizers(kind, models, *packs)
    full_steps = [lambda p=pack, o=pair: training_step(p, *o, *batch) for pack, pair in zip(packs, pairs)]
    optimizer_steps = [opt.step for opt, _ in pairs]
    for fn in full_steps + optimizer_steps:  # warm-up; the gradients stay for the optimizer-alone timings
        fn()
    full_s, optimizer_s = ([], []), ([], [])
    inner = 10 if device.type == "cuda" else 1  # a GPU step takes milliseconds: time several per sample
    for r in range(repeats):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            full_s[i].append(measure.seconds(full_steps[i], inner, device))
        for i in order:
            optimizer_s[i].append(measure.seconds(optimizer_steps[i], 20, device))
    med = statistics.median
    return {"kind": kind, "models": models,
            "one_lr_model_steps_per_s": models / med(full_s[0]),
            "per_model_lr_model_steps_per_s": models / med(full_s[1]),
            "ratio": med([a / b for a, b in zip(*full_s)]),  # per-model-lr model-steps/s ÷ one-lr model-steps/s
            "one_lr_optimizer_ms": med(optimizer_s[0]) * 1e3, "per_model_lr_optimizer_ms": med(optimizer_s[1]) * 1e3,
            "one_lr_step_all_ms": [t * 1e3 for t in full_s[0]], "per_model_lr_step_all_ms": [t * 1e3 for t in full_s[1]],
            "one_lr_optimizer_all_ms": [t * 1e3 for t in optimizer_s[0]],
            "per_model_lr_optimizer_all_ms": [t * 1e3 for t in optimizer_s[1]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=len(SIGMAS) * len(LEARNING_RATES) * 3)
    p.add_argument("--kinds", default="adam,adamw,sgd")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="bench/results/stacked_optimizer_cpu.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = keep_freed_memory()  # as the sweep does
    device = torch.device(args.device)
    rows = []
    for kind in args.kinds.split(","):
        row = bench_kind(kind, args.models, args.repeats, device)
        rows.append(row)
        print(f"{kind:5s} M={args.models}: one lr {row['one_lr_model_steps_per_s']:7.1f} model-steps/s, per-model lr "
              f"{row['per_model_lr_model_steps_per_s']:7.1f} ({100 * row['ratio']:.1f} %); optimizer step alone "
              f"{row['one_lr_optimizer_ms']:.2f} ms vs {row['per_model_lr_optimizer_ms']:.2f} ms", flush=True)
    result = {"benchmark": "stacked_optimizer", "environment": measure.environment(device),
              "keep_freed_memory": kept,
              "repeats": args.repeats, "rows": rows}
    measure.write_result(args.out, result)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
