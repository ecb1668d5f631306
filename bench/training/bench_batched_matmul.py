"""A pack's batched matmul against a loop of one plain matmul per model, at the stacked layers' GEMM shapes.

    python bench/training/bench_batched_matmul.py [--models 3] [--rows 2048] [--width 160] [--repeats 21]
                                         [--out bench/results/batched_matmul_cpu.json]

StackedLinear multiplies every model's activations [rows, in] by its own weight [in, out] with one torch.bmm; the
alternative is M calls of torch.mm. For each GEMM of a block's training step (QKV, output projection, MLP up, MLP
down; forward and the weight-gradient form xᵀ·dy) both are timed in turn within every round, so a shared machine's
slow spells hit both alike; medians over the rounds, and the ratio per round, then its median. rows = batch × tokens
(LST: 128 × 16 = 2048). Why: on a CPU at the paper's size a pack trains no faster per model than models one after
another (README, "Tests and benchmarks"), and this shows how much of that is the batched GEMM.
"""
from __future__ import annotations

import argparse
import operator
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure


def gemm_cases(width: int, mlp: int) -> list[tuple[str, int, int]]:
    """(name, in, out) of the stacked GEMMs in one block."""
    return [("qkv", width, 3 * width), ("out_proj", width, width), ("mlp_up", width, mlp), ("mlp_down", mlp, width)]


def time_case(models: int, rows: int, d_in: int, d_out: int, transpose: bool, repeats: int) -> dict:
    """Forward: x [M, rows, in] @ w [M, in, out]. Weight gradient (transpose): xᵀ [M, in, rows] @ dy [M, rows, out]."""
    x = torch.randn(models, rows, d_in)
    right = torch.randn(models, rows, d_out) if transpose else torch.randn(models, d_in, d_out)
    left = x.transpose(1, 2) if transpose else x
    lefts, rights = [left[m] for m in range(models)], [right[m] for m in range(models)]

    def batched():
        torch.bmm(left, right)

    def looped():
        for a, b in zip(lefts, rights):
            torch.mm(a, b)

    times = measure.in_turn({"batched": batched, "looped": looped}, repeats)
    return {"batched_ms": statistics.median(times["batched"]) * 1e3,
            "looped_ms": statistics.median(times["looped"]) * 1e3,
            "looped_speedup": measure.per_round(operator.truediv, times["batched"], times["looped"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=3)
    p.add_argument("--rows", type=int, default=2048, help="batch × tokens per model")
    p.add_argument("--width", type=int, default=160)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="bench/results/batched_matmul_cpu.json")
    args = p.parse_args()
    for name in ("models", "rows", "width", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    timed = []
    for name, d_in, d_out in gemm_cases(args.width, 4 * args.width):
        for transpose in (False, True):
            row = {"gemm": name, "form": "weight_grad" if transpose else "forward", "in": d_in, "out": d_out,
                   **time_case(args.models, args.rows, d_in, d_out, transpose, args.repeats)}
            timed.append(row)
            print(f"{name:9s} {row['form']:11s} [{args.rows}×{d_in}]·[{d_in}×{d_out}] × {args.models}: bmm "
                  f"{row['batched_ms']:7.2f} ms, loop of mm {row['looped_ms']:7.2f} ms "
                  f"(loop {row['looped_speedup']:.2f}× as fast)")
    total = {key: sum(r[key] for r in timed) for key in ("batched_ms", "looped_ms")}
    print(f"all eight: bmm {total['batched_ms']:.1f} ms, loop {total['looped_ms']:.1f} ms")
    measure.write_result(args.out, {"benchmark": "batched_matmul", **measure.environment("cpu"),
                                    "threads": torch.get_num_threads(), "models": args.models, "rows": args.rows,
                                    "width": args.width, "repeats": args.repeats, "gemms": timed,
                                    "total_ms": total})
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
