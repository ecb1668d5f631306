"""How fast could a stacked CPU training step be? Its matmuls alone, replayed, bound it from below.

    python bench/training/bench_training_bound.py [--shapes 64x32,160x128] [--models 16] [--repeats 7]

Records every matmul (aten bmm / baddbmm / mm / addmm) and every GELU (forward and backward) that one training
step of bench_training.py's stacked pack dispatches, forward and backward, with their shapes, strides and
scalars, then replays them on fresh tensors of the same layout: the step's matmuls alone, and its matmuls plus
its GELUs. Nothing a faster implementation of the rest (attention, layer norms, residuals, optimizer) could do
makes a step cheaper than its matmuls, and exact GELU runs at torch's vectorised erf rate whatever fuses it.
In turn within each round it also times the real stacked step, the same models one by one, and a 2048³ matmul,
and reports the ceilings these imply for foundation issue §10's goals:
  * the best speed-up over the one-by-one loop, if everything but the matmuls were free;
  * the best share of the large-matmul rate, if everything but the matmuls and the GELUs were free.
Writes bench/results/training_bound_cpu.json.
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
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure
from training.bench_training import (SWEEP_OPTIMIZER, fraction_of_large_matmul, large_matmul, lst_model,
                                     parse_shapes, random_batch, step_flops, training_step)

from pe_fast.memory import keep_freed_memory
from pe_fast.train import make_optimizer

aten = torch.ops.aten
MATMULS = {aten.bmm.default, aten.baddbmm.default, aten.mm.default, aten.addmm.default}
GELUS = {aten.gelu.default, aten.gelu_backward.default}


class Recorder(TorchDispatchMode):
    """Keeps (op, args, kwargs) of the ops in `wanted`, tensors replaced by (size, stride, dtype)."""

    def __init__(self, wanted):
        super().__init__()
        self.wanted, self.calls = wanted, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.wanted:
            layout = lambda a: (tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a  # noqa: E731
            self.calls.append((func, [layout(a) for a in args], {k: layout(v) for k, v in kwargs.items()}))
        return func(*args, **kwargs)


def replayable(calls):
    """The recorded calls with fresh random tensors of the recorded layouts, ready to run."""
    def tensor(a):
        if isinstance(a, tuple) and len(a) == 3 and isinstance(a[2], torch.dtype):
            size, stride, dtype = a
            return torch.empty_strided(size, stride, dtype=dtype).normal_()
        return a
    return [(func, [tensor(a) for a in args], {k: tensor(v) for k, v in kwargs.items()})
            for func, args, kwargs in calls]


def run_calls(calls) -> None:
    for func, args, kwargs in calls:
        func(*args, **kwargs)  # outputs are allocated and freed as in the step


def bench_shape(width: int, batch: int, models: int, depth: int, repeats: int) -> dict:
    cpu = torch.device("cpu")
    tokens, targets = random_batch(models, batch, cpu)
    pack = lst_model(width, depth, list(range(models)), cpu)
    optimizer = make_optimizer(pack.parameters(), SWEEP_OPTIMIZER)
    alone = [lst_model(width, depth, [m], cpu) for m in range(models)]
    alone_opts = [make_optimizer(m.parameters(), SWEEP_OPTIMIZER) for m in alone]

    def stacked():
        training_step(pack, optimizer, tokens, targets)

    def one_by_one():
        for m, (model, opt) in enumerate(zip(alone, alone_opts)):
            training_step(model, opt, tokens[m:m + 1], targets[m:m + 1])

    stacked()
    recorder = Recorder(MATMULS | GELUS)
    with recorder:
        stacked()
    matmul_calls = replayable([c for c in recorder.calls if c[0] in MATMULS])
    gelu_calls = replayable([c for c in recorder.calls if c[0] in GELUS])
    large, large_flops = large_matmul(cpu)
    variants = {"stacked": stacked, "one_by_one": one_by_one, "matmuls": lambda: run_calls(matmul_calls),
                "gelus": lambda: run_calls(gelu_calls)}
    times = measure.in_turn({**variants, "large": large}, repeats, inner={"large": 3})
    large_gflops = [large_flops / s / 1e9 for s in times.pop("large")]
    flops = step_flops(width, depth, batch, 4 * width) * models
    med = statistics.median
    of_large = functools.partial(fraction_of_large_matmul, flops)
    return {
        "width": width, "batch": batch, "models": models, "depth": depth,
        "matmul_calls": len(matmul_calls), "gelu_calls": len(gelu_calls),
        **{f"{name}_ms": med(t) * 1e3 for name, t in times.items()},
        "large_matmul_gflops": med(large_gflops),
        "matmuls_gflops": flops / med(times["matmuls"]) / 1e9,
        "speedup": measure.per_round(operator.truediv, times["one_by_one"], times["stacked"]),
        "speedup_ceiling_matmuls_only": measure.per_round(operator.truediv, times["one_by_one"], times["matmuls"]),
        "stacked_fraction_of_large_matmul": measure.per_round(of_large, times["stacked"], large_gflops),
        "fraction_ceiling_matmuls_only": measure.per_round(of_large, times["matmuls"], large_gflops),
        "fraction_ceiling_matmuls_and_gelus": measure.per_round(
            lambda matmuls_s, gelus_s, peak: of_large(matmuls_s + gelus_s, peak),
            times["matmuls"], times["gelus"], large_gflops),
        "all_ms": {name: [t * 1e3 for t in ts] for name, ts in times.items()},
        "large_matmul_all_gflops": large_gflops,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="64x32,160x128", help="WIDTHxBATCH or WIDTHxBATCHxMODELS, comma-separated")
    p.add_argument("--models", type=int, default=16, help="models per pack, where a shape does not say")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default="bench/results/training_bound_cpu.json")
    args = p.parse_args()
    shapes = parse_shapes(args.shapes, args.models)
    load_average = os.getloadavg()
    keep_freed_memory()  # as the sweep does
    rows = []
    for width, batch, models in shapes:
        row = bench_shape(width, batch, models, args.depth, args.repeats)
        rows.append(row)
        print(f"d={width:4d} batch={batch:4d} M={models}: stacked {row['stacked_ms']:8.1f} ms, one by one "
              f"{row['one_by_one_ms']:8.1f} ms ({row['speedup']:.2f}×); its {row['matmul_calls']} matmuls alone "
              f"{row['matmuls_ms']:8.1f} ms, {row['gelu_calls']} GELUs {row['gelus_ms']:6.1f} ms. Ceilings: "
              f"speed-up {row['speedup_ceiling_matmuls_only']:.2f}× (matmuls only); "
              f"{row['fraction_ceiling_matmuls_only']:.0%} of large matmul (matmuls only), "
              f"{row['fraction_ceiling_matmuls_and_gelus']:.0%} (matmuls + GELUs); the real step "
              f"{row['stacked_fraction_of_large_matmul']:.0%}", flush=True)
    result = {"benchmark": "training_step_bound", "machine": measure.cpu_name(),
              "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": args.repeats,
              "load_average_at_start": load_average, "rows": rows}
    measure.write_result(args.out, result)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
