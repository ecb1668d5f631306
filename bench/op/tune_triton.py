"""Block sizes of the Triton kernels, measured: each candidate configuration against the one `kernel_config` picks.

    python bench/op/tune_triton.py --out bench/results/tune_gpu.json [--budget-s 150]

`triton_attention.kernel_config` is an untuned heuristic. For each (shape, precision) of bench_ops.py, in
priority order, this times the fused op with the forward's tiles varied (forward only, the default backward) and
then the backward's (forward + backward, the default forward), every candidate against the default in the same
run: triton.testing.do_bench, median ms. A candidate the GPU cannot compile or run (shared memory) is recorded
with its error. The table says which configuration to make the default, and by how much; it changes nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
from measure import environment, write_result  # bench/measure.py (`measure` below is bench_ops' op timing)

from op.bench_ops import PRECISIONS, SHAPES, measure, set_tf32
from pe_fast.ops import pe_attention, triton_attention

# (shape, precision), most important first: N = 16 (the paper's LST sweep, issue 13), then N = 360 against SDPA
PLAN = [("lst", "bf16"), ("lst", "tf32"), ("fmri", "bf16"), ("fmri", "tf32"), ("mid", "bf16"), ("fmri", "fp32")]


def forward_candidates(cfg: triton_attention.KernelConfig) -> list[triton_attention.KernelConfig]:
    if cfg.packed:  # tile = BLOCK // N whole problems; keys are the tile's own rows; the head dim in chunks
        return [dataclasses.replace(cfg, fwd_block_m=b, fwd_block_n=b, fwd_warps=w, chunk=c)
                for b in (32, 64, 128) for w in (2, 4, 8) for c in (16, 32, 64)]
    tiles = [(64, 64, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2), (64, 128, 4, 2), (128, 128, 8, 2),
             (64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 2), (32, 64, 4, 2)]
    return [dataclasses.replace(cfg, fwd_block_m=m, fwd_block_n=n, fwd_warps=w, fwd_stages=s) for m, n, w, s in tiles]


def backward_candidates(cfg: triton_attention.KernelConfig) -> list[triton_attention.KernelConfig]:
    if cfg.packed:  # the forward's chunk stays: one chunk serves both kernels
        return [dataclasses.replace(cfg, bwd_block=b, bwd_warps=w) for b in (16, 32, 64) for w in (2, 4, 8)]
    tiles = [(b, w, s) for b in (32, 64, 128) for w in (4, 8) for s in (1, 2)]
    return [dataclasses.replace(cfg, bwd_block=b, bwd_warps=w, bwd_stages=s) for b, w, s in tiles]


def valid(cfg: triton_attention.KernelConfig, N: int) -> bool:
    """A packed tile must hold at least one whole problem (long tiles take any N)."""
    return not cfg.packed or min(cfg.fwd_block_m, cfg.bwd_block) >= N


@contextlib.contextmanager
def configured(cfg: triton_attention.KernelConfig):
    """The launchers read their tiles from `kernel_config` at every call: it returns cfg for the duration."""
    default = triton_attention.kernel_config
    triton_attention.kernel_config = lambda N, head_dim, dtype: cfg
    try:
        yield
    finally:
        triton_attention.kernel_config = default


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--budget-s", type=float, default=150.0, help="start no measurement after this (150 s)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_triton.py: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    op = lambda *a: pe_attention(*a, backend="triton")  # noqa: E731
    start, results = time.perf_counter(), []
    report = {**environment("cuda"), "results": results}

    def write_report():
        write_result(args.out, {**report, "wall_s": time.perf_counter() - start})

    for shape, prec in PLAN:
        M, B, N, D, H, K = SHAPES[shape]
        dtype = PRECISIONS[prec]
        set_tf32(prec == "tf32")
        default = triton_attention.kernel_config(N, D // H, dtype)
        for mode, candidates in (("forward", forward_candidates(default)),
                                 ("forward+backward", backward_candidates(default))):
            timed = {}
            for cfg in [default] + [c for c in dict.fromkeys(candidates) if c != default and valid(c, N)]:
                write_report()
                if time.perf_counter() - start > args.budget_s:
                    break
                row = dict(shape=shape, precision=prec, mode=mode, default=cfg == default,
                           config={k: v for k, v in dataclasses.asdict(cfg).items() if k != "dtype"})
                try:
                    with configured(cfg):
                        row["ms"] = measure(op, SHAPES[shape], dtype, mode)[0]
                    timed[cfg] = row["ms"]
                except Exception as e:  # shared memory, registers: record and go on
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                finally:
                    torch.cuda.empty_cache()
                results.append(row)
            if timed and default in timed:
                best = min(timed, key=timed.get)
                tiles = ((best.fwd_block_m, best.fwd_block_n, best.fwd_warps, best.fwd_stages, best.chunk)
                         if mode == "forward" else (best.bwd_block, best.bwd_warps, best.bwd_stages))
                print(f"{shape:5s} {prec:5s} {mode:17s} default {timed[default]:.3f} ms, best {timed[best]:.3f} ms "
                      f"({timed[default] / timed[best]:.2f}×) with {tiles}; {len(timed)} configs timed", flush=True)
    set_tf32(False)
    write_report()
    print(f"wrote {args.out} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
