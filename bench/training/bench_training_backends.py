"""A whole stacked training step (forward, backward, AdamW) with each pe_attention backend, in one run.

    python bench/training/bench_training_backends.py [--backends reference,cpp] [--repeats 5] [--threads N]
                                            [--out bench/results/training_backends_cpu.json]

Shapes (name: tokens N, token width, outputs; 4 post-LN blocks, MLP 4·d; M models of one pack, batch B):
  lst:        N = 16,  5-dim one-hot tokens, 4 classes read out from the last token; d = 64, H = 1, M = 16, B = 128
  fmri-N100:  N = 100, 17-dim tokens (a 16-point window + mask flag), 16 outputs per token (MSE); d = 64, H = 4,
              M = 8, B = 32
  fmri-N360:  the same at N = 360 (the Glasser atlas' regions)
Every repeat times one step per backend back to back (one model, its attention layers' backend switched before
each step), so a change in the machine's load hits all of them; medians and ratios vs the first
backend are reported. Everything else in the step (embedding, MLPs, layer norms, AdamW) is the same code.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast.memory import keep_freed_memory
from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.nn import PEAttention
from pe_fast.train import TrainConfig, make_optimizer

SHAPES = {  # name: (N, token_dim, out_dim, readout_token, width, heads, models, batch)
    "lst": (16, 5, 4, 15, 64, 1, 16, 128),
    "fmri-N100": (100, 17, 16, None, 64, 4, 8, 32),
    "fmri-N360": (360, 17, 16, None, 64, 4, 8, 32),
}


def make_step(name: str, depth: int):
    N, token_dim, out_dim, readout, width, heads, M, B = SHAPES[name]
    config = ModelConfig(num_tokens=N, token_dim=token_dim, out_dim=out_dim, width=width, depth=depth, heads=heads,
                         mlp_width=4 * width, pe="learned", readout_token=readout)
    model = StackedTransformer(config, list(range(M)), [0.2] * M)
    optimizer = make_optimizer(model.parameters(), TrainConfig(steps=1, lr=1e-4, optimizer="adamw"))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(M, B, N, token_dim, generator=g)
    targets = torch.randint(0, out_dim, (M, B), generator=g) if readout is not None else \
        torch.randn(M, B, N, out_dim, generator=g)

    def step():
        outputs, _ = model(tokens)
        if readout is not None:
            loss = F.cross_entropy(outputs.reshape(M * B, out_dim), targets.reshape(M * B), reduction="none")
        else:
            loss = F.mse_loss(outputs, targets, reduction="none")
        optimizer.zero_grad(set_to_none=True)
        loss.reshape(M, -1).mean(1).sum().backward()
        optimizer.step()
    return step, model


def on_backend(backend: str, step, model):
    """The step with every attention layer of the model on this backend."""
    def run():
        for layer in model.modules():
            if isinstance(layer, PEAttention):
                layer.backend = backend
        step()
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="reference,cpp")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="bench/results/training_backends_cpu.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the sweep does
    backends = args.backends.split(",")
    rows = []
    for name in args.shapes.split(","):
        step, model = make_step(name, args.depth)
        times = measure.in_turn({b: on_backend(b, step, model) for b in backends}, args.repeats)
        N, token_dim, out_dim, readout, width, heads, M, B = SHAPES[name]
        median = {b: statistics.median(t) for b, t in times.items()}
        row = {"shape": name, "N": N, "width": width, "heads": heads, "depth": args.depth, "models": M, "batch": B,
               **{f"{b}_step_ms": 1e3 * median[b] for b in backends},
               **{f"{b}_all_ms": [1e3 * t for t in times[b]] for b in backends},
               **{f"speedup_{b}_vs_{backends[0]}": median[backends[0]] / median[b] for b in backends[1:]}}
        rows.append(row)
        print(f"{name:10s} " + ", ".join(f"{b} {1e3 * median[b]:8.1f} ms" for b in backends) + "; " +
              ", ".join(f"{b} {median[backends[0]] / median[b]:.2f}×" for b in backends[1:]), flush=True)
    result = {"benchmark": "training_step_per_backend", "cpu": measure.cpu_name(),
              "logical_cpus": os.cpu_count(), "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
              "load_average_1_5_15_at_end": list(os.getloadavg()), "repeats": args.repeats, "rows": rows}
    measure.write_result(args.out, result)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
