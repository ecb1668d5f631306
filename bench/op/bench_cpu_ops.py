"""pe_attention on CPU: the "cpp" backend (C++ kernels) against the eager "reference", in one run.

    python bench/op/bench_cpu_ops.py [--repeats 7] [--threads 1,2] [--out bench/results/cpu_ops.json]

Shapes: N = 16 (M·B = 16·64 = 1024) and N = 100, 360 (M·B = 8·4 = 32); d = 64, H = 4, 3 probes, float32.
Modes: forward (autograd on, as in training) and forward + backward. Each repeat times both backends back to
back, so a change in the machine's load hits both; the table reports medians and reference / cpp ratios.
Peak memory of one forward + backward at N = 360: the peak RSS of a fresh process that warms the backend up
on a small shape and then runs it, minus that of the same process without the run (torch's CPU allocator has
no peak counter, and tracemalloc does not see it).
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast.ops import BACKENDS, pe_attention

BACKEND_NAMES = ("reference", "cpp")
SHAPES = {16: (16, 64), 100: (8, 4), 360: (8, 4)}  # N -> (M, B)
D, H, K = 64, 4, 3


def make_inputs(N: int, M: int, B: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, B, N, D, generator=g)
    pe = 0.2 * torch.randn(M, N, D, generator=g)
    w = torch.randn(M, D, 3 * D, generator=g) / math.sqrt(D)
    b = torch.zeros(M, 3 * D)
    probes = (torch.rand(K, N, N, generator=g) > 0.5).float()
    grad = torch.randn(M, B, N, D, generator=g)
    return [t.requires_grad_() for t in (x, pe, w, b)], probes, grad


def step(leaves, probes, grad, backend: str, backward: bool) -> None:
    out, _ = pe_attention(*leaves, H, probes, backend=backend)
    if backward:
        out.backward(grad)
        for t in leaves:
            t.grad = None


def bench_shape(N: int, repeats: int) -> list[dict]:
    leaves, probes, grad = make_inputs(N, *SHAPES[N])
    inner = 3 if N == 16 else 1
    rows = []
    for backward in (False, True):
        times = measure.in_turn({name: functools.partial(step, leaves, probes, grad, name, backward)
                                 for name in BACKEND_NAMES}, repeats, inner=dict.fromkeys(BACKEND_NAMES, inner))
        median = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"N": N, "M": SHAPES[N][0], "B": SHAPES[N][1], "mode": "fwd+bwd" if backward else "fwd",
                     **{f"{name}_ms": 1e3 * median[name] for name in BACKEND_NAMES},
                     **{f"{name}_all_ms": [1e3 * t for t in times[name]] for name in BACKEND_NAMES},
                     "speedup": median["reference"] / median["cpp"]})
    return rows


def peak_memory_child(backend: str, run: bool) -> None:
    """Runs in a fresh process: prints its peak RSS (bytes) after warming `backend` up on a small shape (loads
    its code and torch's kernels) and then, if `run`, one forward + backward at N = 360."""
    step(*make_inputs(16, 8, 1), backend, True)
    leaves, probes, grad = make_inputs(360, *SHAPES[360])
    if run:
        step(leaves, probes, grad, backend, True)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def peak_memory() -> dict:
    peaks = {}
    for backend in BACKEND_NAMES:
        for run in (False, True):
            child = subprocess.run([sys.executable, __file__, "--peak-memory-child", backend, str(int(run))],
                                   check=True, capture_output=True, text=True,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
            peaks[backend, run] = int(child.stdout.split()[-1])
    op = {name: peaks[name, True] - peaks[name, False] for name in BACKEND_NAMES}
    return {"N": 360, "process_peak_rss_mb": {f"{k}{'' if run else ' (warm-up only)'}": v / 2**20
                                              for (k, run), v in peaks.items()},
            "op_peak_mb": {k: v / 2**20 for k, v in op.items()}, "cpp_over_reference": op["cpp"] / op["reference"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--out", default="bench/results/cpu_ops.json")
    p.add_argument("--peak-memory-child", nargs=2, metavar=("BACKEND", "RUN"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peak_memory_child:
        peak_memory_child(args.peak_memory_child[0], args.peak_memory_child[1] == "1")
        return
    if "cpp" not in BACKENDS:
        sys.exit("bench_cpu_ops: the C++ kernels are not built (see README: install with a C++ compiler)")
    # First: a child's ru_maxrss starts from the RSS of the process it was forked from (Linux keeps the high-water
    # mark across exec), so the children must start while this process is still small.
    memory = peak_memory()
    op_mb = memory["op_peak_mb"]
    print(f"peak memory of forward + backward at N = 360: reference {op_mb['reference']:.0f} MB, "
          f"cpp {op_mb['cpp']:.0f} MB ({memory['cpp_over_reference']:.2f}×)", flush=True)
    result = {"benchmark": "pe_attention_cpu", "machine_at_start": measure.environment("cpu"), "D": D, "H": H,
              "probes": K, "dtype": "float32", "repeats": args.repeats, "rows": [], "peak_memory": memory}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for N in SHAPES:
            for row in bench_shape(N, args.repeats):
                row["threads"] = threads
                result["rows"].append(row)
                print(f"threads={threads} N={N:3d} {row['mode']:7s}: reference {row['reference_ms']:8.1f} ms, "
                      f"cpp {row['cpp_ms']:8.1f} ms, {row['speedup']:.2f}×", flush=True)
    result["machine_at_end"] = measure.environment("cpu")
    measure.write_result(args.out, result)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
