"""Training throughput of a stacked pack vs the same models trained one after another (issue: foundation §10).

    python bench/training/bench_training.py [--models 16] [--repeats 7] [--out bench/results/training_cpu.json]

For each LST shape (16 tokens of 5 features, 4 layers, 1 head, MLP 4·d) it times full training steps
(forward, backward, AdamW) of (a) one StackedTransformer holding M models and (b) M single-model
StackedTransformers stepped one after another, in the same process, and reports model-steps/s, the speed-up,
and the achieved GFLOP/s (matmul FLOPs of forward + backward = 3 × forward) against this machine's
large-matmul GFLOP/s (2048³ fp32 matmul; 8192³ on a GPU). The stacked step, the one-by-one loop and the large
matmul are timed in turn within each of --repeats rounds; ratios are per round, then the median. Like the sweep,
it first sets pe_fast.memory.keep_freed_memory (--default-malloc does not). `--device cuda` runs it on a GPU.
"""
from __future__ import annotations

import argparse
import functools
import operator
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast.memory import keep_freed_memory
from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.train import TrainConfig, make_optimizer

N_TOKENS, TOKEN_DIM, CLASSES = 16, 5, 4


def step_flops(width: int, depth: int, batch: int, mlp: int) -> float:
    """Matmul FLOPs one model executes in a training step (forward ×3 for forward + backward). Every block
    projects q, k, v and attends at all N tokens; the output projection and the MLP run at all tokens except in
    the last block, which computes the readout token only (StackedTransformer with readout_token)."""
    tokens = batch * N_TOKENS
    attention = 2 * tokens * width * 3 * width + 4 * batch * N_TOKENS ** 2 * width
    per_token_rest = 2 * width * width + 4 * width * mlp  # output projection + MLP, per token
    forward = (depth * attention + ((depth - 1) * tokens + batch) * per_token_rest
               + 2 * tokens * TOKEN_DIM * width + 2 * batch * width * CLASSES)
    return 3.0 * forward


def fraction_of_large_matmul(flops: float, step_s: float, large_gflops: float) -> float:
    """The share of the large matmul's GFLOP/s that a step of `flops` matmul FLOPs in step_s seconds reaches."""
    return flops / step_s / 1e9 / large_gflops


def large_matmul(device: torch.device):
    """One large fp32 matmul (2048³ on the CPU, 8192³ on a GPU) and its FLOPs."""
    size = 2048 if device.type == "cpu" else 8192
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    return (lambda: a @ b), 2 * size ** 3


def training_step(model: StackedTransformer, optimizer, tokens, targets):
    outputs, _ = model(tokens)
    M, B, C = outputs.shape
    loss = torch.nn.functional.cross_entropy(outputs.reshape(M * B, C), targets.reshape(M * B), reduction="none")
    optimizer.zero_grad(set_to_none=True)
    loss.view(M, B).mean(1).sum().backward()
    optimizer.step()


SWEEP_OPTIMIZER = TrainConfig(steps=1, lr=1e-4, optimizer="adamw")  # make_optimizer: the sweep's (fused) AdamW


def lst_model(width: int, depth: int, seeds: list[int], device: torch.device,
              backend: str | None = None) -> StackedTransformer:
    """The LST-shaped pack every benchmark here times: 1 head, MLP 4·d, learned PE, readout at the last token."""
    config = ModelConfig(num_tokens=N_TOKENS, token_dim=TOKEN_DIM, out_dim=CLASSES, width=width, depth=depth,
                         heads=1, mlp_width=4 * width, pe="learned", readout_token=N_TOKENS - 1,
                         backend=backend)
    return StackedTransformer(config, seeds, [0.2] * len(seeds)).to(device)


def random_batch(models: int, batch: int, device: torch.device):
    """Random tokens [M,B,N,token_dim] and class targets [M,B]."""
    return (torch.randn(models, batch, N_TOKENS, TOKEN_DIM, device=device),
            torch.randint(0, CLASSES, (models, batch), device=device))


def bench_shape(width: int, batch: int, models: int, depth: int, repeats: int, device: torch.device,
                backend: str | None = None) -> dict:
    seeds = list(range(models))
    tokens, targets = random_batch(models, batch, device)
    pack = lst_model(width, depth, seeds, device, backend)
    pack_opt = make_optimizer(pack.parameters(), SWEEP_OPTIMIZER)
    alone = [lst_model(width, depth, [s], device, backend) for s in seeds]
    alone_opts = [make_optimizer(m.parameters(), SWEEP_OPTIMIZER) for m in alone]

    def one_by_one():
        for m, (model, opt) in enumerate(zip(alone, alone_opts)):
            training_step(model, opt, tokens[m:m + 1], targets[m:m + 1])

    def stacked():
        training_step(pack, pack_opt, tokens, targets)

    matmul, matmul_flops = large_matmul(device)
    times = measure.in_turn({"stacked": stacked, "one_by_one": one_by_one, "matmul": matmul}, repeats, device,
                            inner={"matmul": 3})
    stacked_s, loop_s = times["stacked"], times["one_by_one"]
    matmul_gflops = [matmul_flops / s / 1e9 for s in times["matmul"]]
    flops = step_flops(width, depth, batch, 4 * width) * models
    med = statistics.median
    of_large = functools.partial(fraction_of_large_matmul, flops)
    return {"width": width, "batch": batch, "models": models, "depth": depth,
            "stacked_step_ms": med(stacked_s) * 1e3, "one_by_one_step_ms": med(loop_s) * 1e3,
            "stacked_model_steps_per_s": models / med(stacked_s), "one_by_one_model_steps_per_s": models / med(loop_s),
            "speedup": measure.per_round(operator.truediv, loop_s, stacked_s),
            "stacked_gflops": flops / med(stacked_s) / 1e9, "one_by_one_gflops": flops / med(loop_s) / 1e9,
            "large_matmul_gflops": med(matmul_gflops),
            "stacked_fraction_of_large_matmul": measure.per_round(of_large, stacked_s, matmul_gflops),
            "one_by_one_fraction_of_large_matmul": measure.per_round(of_large, loop_s, matmul_gflops),
            "stacked_all_ms": [t * 1e3 for t in stacked_s], "one_by_one_all_ms": [t * 1e3 for t in loop_s],
            "large_matmul_all_gflops": matmul_gflops}


def parse_shapes(text: str, default_models: int) -> list[tuple[int, int, int]]:
    """"64x32,160x128x64" -> [(width, batch, models)]; a malformed list exits with one line and code 2."""
    shapes = []
    for shape in text.split(","):
        parts = shape.split("x")
        if len(parts) not in (2, 3) or not all(part.isdigit() and int(part) > 0 for part in parts):
            print(f"error: --shapes takes WIDTHxBATCH or WIDTHxBATCHxMODELS, comma-separated; got {shape!r}",
                  file=sys.stderr)
            sys.exit(2)
        width, batch, *models = map(int, parts)
        shapes.append((width, batch, models[0] if models else default_models))
    return shapes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=16, help="models per pack, where a shape does not say")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", help="the models' compute path (pe_fast.models.transformer.compute_paths); "
                                     "default: the fastest on the device")
    p.add_argument("--shapes", default="64x32,64x32x64,64x128,160x32,160x128",
                   help="WIDTHxBATCH or WIDTHxBATCHxMODELS, comma-separated")
    p.add_argument("--default-malloc", action="store_true",
                   help="leave glibc's malloc as it is (the sweep sets pe_fast.memory.keep_freed_memory)")
    p.add_argument("--out", default="bench/results/training_cpu.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = False if args.default_malloc else keep_freed_memory()
    device = torch.device(args.device)
    rows = []
    for width, batch, models in parse_shapes(args.shapes, args.models):
        row = bench_shape(width, batch, models, args.depth, args.repeats, device, args.backend)
        rows.append(row)
        print(f"d={width:4d} batch={batch:4d} M={models:3d}: stacked {row['stacked_model_steps_per_s']:8.1f} "
              f"model-steps/s, one by one {row['one_by_one_model_steps_per_s']:8.1f} ({row['speedup']:.2f}×); "
              f"{row['stacked_gflops']:.1f} GFLOP/s = {100 * row['stacked_fraction_of_large_matmul']:.0f} % "
              f"of large matmul ({row['large_matmul_gflops']:.1f})", flush=True)
    result = {"benchmark": "training_step", "machine": measure.cpu_name(),
              "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
              "device": measure.device_name(device),
              "backend": args.backend or "default", "keep_freed_memory": kept,
              "load_average_at_start": os.getloadavg(), "repeats": args.repeats, "rows": rows}
    measure.write_result(args.out, result)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
