"""Where the time of pe_attention goes: a torch.profiler breakdown on a CUDA GPU, at one of the benchmark's shapes.

    python bench/op/profile_op.py --out bench/results/profile_n16.json [--shape lst] [--iters 10] [--top 12]

Shapes: lst (default; M = 64 models × B = 64, N = 16, d = 160, H = 1, K = 3 probes: M·B = 4096, the issue's LST
shape) and bench_ops.py's fmri (N = 360) and mid (N = 100).
For the fused op (backend="triton") and the eager reference, in fp32 (IEEE), tf32 and bf16, forward (no
autograd) and forward+backward, it reports:
  * GPU time per iteration (CUDA events, median) and the host time to enqueue one iteration: when the host
    time is the larger, the op is launch-bound and the GPU idles;
  * kernel launches per iteration (CUDA kernels, memsets and memcpys seen by the profiler);
  * the top kernels by total CUDA time per iteration, with their share and launch count.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
import measure
from op.bench_ops import PRECISIONS, SHAPES, make_inputs, set_tf32

from pe_fast.ops import pe_attention

PROFILE_SHAPES = {"lst": dict(M=64, B=64, N=16, D=160, H=1, K=3),
                  **{name: dict(zip("MBNDHK", shape)) for name, shape in SHAPES.items() if name != "lst"}}


def make_step(shape, backend, dtype, mode):
    M, B, N, D, H, K = (shape[k] for k in "MBNDHK")
    (x, pe, w, b), probes = make_inputs(M, B, N, D, K, dtype, grad=mode != "forward")
    if mode == "forward":
        def step():
            with torch.no_grad():
                pe_attention(x, pe, w, b, H, probes, backend=backend)
        return step
    grad_out = torch.randn(M, B, N, D, device="cuda", dtype=dtype)

    def step():
        for t in (x, pe, w, b):
            t.grad = None
        out, _ = pe_attention(x, pe, w, b, H, probes, backend=backend)
        out.backward(grad_out)
    return step


def timings(step, iters):
    """(GPU ms per iteration, median of CUDA-event timings; host ms to enqueue one iteration, median)."""
    gpu, host = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        step()
        end.record()
        host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end))
    return statistics.median(gpu), statistics.median(host)


def kernel_breakdown(step, iters):
    """GPU activities per iteration, by name: {name: [launches, total µs]}, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    kernels = defaultdict(lambda: [0, 0.0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels[evt.name]
            entry[0] += 1
            entry[1] += evt.time_range.elapsed_us()
    return {name: [n / iters, us / iters] for name, (n, us) in kernels.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--shape", choices=PROFILE_SHAPES, default="lst", help="lst (default), fmri or mid")
    p.add_argument("--iters", type=int, default=10, help="profiled iterations per case (10)")
    p.add_argument("--top", type=int, default=12, help="kernels listed per case (12)")
    p.add_argument("--precisions", default="fp32,tf32,bf16")
    p.add_argument("--backends", default="triton,reference")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_op.py: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    shape = PROFILE_SHAPES[args.shape]
    report = {**measure.environment("cuda"), "shape_name": args.shape, "shape": shape, "iters": args.iters, "cases": []}
    start = time.perf_counter()
    for prec in args.precisions.split(","):
        for mode in ("forward", "forward+backward"):
            for backend in args.backends.split(","):
                set_tf32(prec == "tf32")
                case = dict(precision=prec, mode=mode, backend=backend)
                report["cases"].append(case)
                try:
                    step = make_step(shape, backend, PRECISIONS[prec], mode)
                    for _ in range(3):  # compile, autotune cuBLAS, warm caches
                        step()
                    gpu_ms, host_ms = timings(step, max(args.iters, 5))
                    kernels = kernel_breakdown(step, args.iters)
                except Exception as e:  # record and go on: one broken case must not lose the others
                    case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    print(f"{prec} {mode} {backend}: failed: {case['error']}", flush=True)
                    continue
                finally:
                    torch.cuda.empty_cache()
                launches = sum(n for n, _ in kernels.values())
                kernel_us = sum(us for _, us in kernels.values())
                top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:args.top]
                case.update(gpu_ms=gpu_ms, host_ms=host_ms, launches_per_iter=launches,
                            kernel_us_per_iter=kernel_us,
                            top_kernels=[dict(name=name, launches=n, us=us, share=us / kernel_us if kernel_us else 0)
                                         for name, (n, us) in top])
                print(f"\n== {prec} {mode} {backend}: {gpu_ms:.3f} ms GPU/iter, host enqueue {host_ms:.3f} ms/iter, "
                      f"{launches:.0f} launches/iter, kernels {kernel_us / 1e3:.3f} ms/iter", flush=True)
                for row in case["top_kernels"]:
                    print(f"  {row['us']:9.1f} us {row['share']:6.1%} x{row['launches']:<4.0f} {row['name'][:110]}")
    set_tf32(False)
    report["wall_s"] = time.perf_counter() - start
    measure.write_result(args.out, report)
    print(f"\nwrote {args.out} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
