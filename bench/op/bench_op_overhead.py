"""Host time per pe_attention call: the direct eager path against the same call through the custom op.

    python bench/op/bench_op_overhead.py [--device cpu|cuda] [--out bench/results/op_overhead_cpu.json]

Plain eager calls run the backend inside an autograd.Function; traced or transformed calls go through the
`torch.library` custom op, whose Python dispatch layers cost host time on every call (pe_fast.ops.transforms.is_traced).
This times both paths on the device's default backend (cpp on CPU when built, triton on CUDA), forward (no
autograd) and forward+backward, in alternating rounds (this machine's speed drifts between runs), each round
`--calls` calls and one synchronize; it reports the median µs per call and the ratio op / direct.
Shapes: "tiny" (one model, N 4, d 8: the kernels cost next to nothing, so this is the host overhead itself),
and on CUDA "lst" (M·B 4096, N 16, d 160, H 1, 3 probes: issue 3's launch-bound shape).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure

from pe_fast.ops import pe_attention
from pe_fast.ops.backends import resolve_backend

SHAPES = {"tiny": dict(M=1, B=1, N=4, D=8, H=1, K=0), "lst": dict(M=64, B=64, N=16, D=160, H=1, K=3)}
# the modules that choose between the direct path and the op, by pe_fast.ops.transforms.is_traced
CHOOSERS = ("pe_fast.ops.pe_attention", "pe_fast.ops.triton_attention")


@contextlib.contextmanager
def through_the_op():
    """Every call as if traced: the custom op in the forward, and triton's backward op in the backward."""
    modules = [importlib.import_module(m) for m in CHOOSERS if m in sys.modules]
    saved = [m.is_traced for m in modules]
    for m in modules:
        m.is_traced = lambda *tensors, **_: True
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.is_traced = f


def make_call(shape, device, mode):
    M, B, N, D, H, K = (shape[k] for k in "MBNDHK")
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    x, pe, w, b = r(M, B, N, D), r(M, N, D), r(M, D, 3 * D) / D ** 0.5, r(M, 3 * D)
    probes = (torch.rand(K, N, N, generator=g) > 0.5).float().to(device) if K else None
    if mode == "forward":
        def call():
            with torch.no_grad():
                pe_attention(x, pe, w, b, H, probes)
        return call
    leaves = [t.requires_grad_() for t in (x, pe, w, b)]
    grad_out = r(M, B, N, D)

    def call():
        for t in leaves:
            t.grad = None
        out, _ = pe_attention(x, pe, w, b, H, probes)
        out.backward(grad_out)
    return call


def per_call_us(call, calls, sync):
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", help="JSON results path")
    p.add_argument("--repeats", type=int, default=15, help="alternating rounds per case (15)")
    p.add_argument("--calls", type=int, default=200, help="calls per round (200)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_op_overhead.py: --device cuda, but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.calls < 1:
        print("bench_op_overhead.py: --repeats and --calls must be at least 1", file=sys.stderr)
        return 2
    sync = lambda: measure.synchronize(args.device)  # noqa: E731
    backend = resolve_backend(None, torch.device(args.device))
    shapes = ["tiny", "lst"] if args.device == "cuda" else ["tiny"]
    results = []
    print(f"{args.device} ({measure.device_name(args.device)}), backend {backend}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'shape':6s} {'mode':17s} {'direct µs':>10s} {'op µs':>10s} {'op/direct':>9s}")
    for shape in shapes:
        for mode in ("forward", "forward+backward"):
            call = make_call(SHAPES[shape], args.device, mode)
            for _ in range(3):  # warm-up: compilation, allocator, caches
                call()
                with through_the_op():
                    call()
            direct, op = [], []
            for _ in range(args.repeats):
                direct.append(per_call_us(call, args.calls, sync))
                with through_the_op():
                    op.append(per_call_us(call, args.calls, sync))
            row = dict(shape=shape, **SHAPES[shape], mode=mode, direct_us=statistics.median(direct),
                       op_us=statistics.median(op), direct_rounds_us=direct, op_rounds_us=op)
            row["op_over_direct"] = row["op_us"] / row["direct_us"]
            results.append(row)
            print(f"{shape:6s} {mode:17s} {row['direct_us']:10.1f} {row['op_us']:10.1f} {row['op_over_direct']:9.2f}")
    if args.out:
        info = dict(device=args.device, backend=backend, torch=torch.__version__, threads=torch.get_num_threads(),
                    machine=measure.device_name(args.device),
                    repeats=args.repeats, calls=args.calls, results=results)
        measure.write_result(args.out, info)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
