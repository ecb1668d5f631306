"""pe_attention on a CUDA GPU: the fused Triton op against unfused ways of getting the same outputs.

    python bench/op/bench_ops.py --out bench/results/ops_gpu.json [--budget-s 200]

Providers, each computing out AND the statistics from x, pe, w_qkv, b_qkv, probes:
  triton       pe_attention(backend="triton"): QKV GEMM + one fused attention/statistics kernel
  reference    pe_attention(backend="reference"): eager PyTorch, N×N map materialised
  sdpa+stats   QKV GEMM, F.scaled_dot_product_attention for out, then a separate pass computing the
               statistics from a materialised softmax map (what one would write without pe_fast)
  flex+stats   the same with FlexAttention (torch.compile'd) instead of SDPA, where it runs
  sdpa         QKV GEMM + F.scaled_dot_product_attention WITHOUT the statistics (issue 3's speed bar: the fused
               op with statistics should beat plain SDPA without them); its stats are a zero placeholder
Shapes: LST (M·B 4096, N 16, d 160, H 1), fMRI (M·B 256, N 360, d 64, H 4), mid (M·B 1024, N 100, d 64, H 4).
Precisions: fp32 (IEEE), tf32 (PE_FAST_TF32=1 and torch's allow_tf32), bf16. Modes: forward (no autograd) and
forward+backward. Time: triton.testing.do_bench (CUDA events, L2 flushed), median and 20/80 % quantiles.
Reported: ms; attention TFLOP/s by flash-attention's convention (fwd 4·MB·N²·H·dh, bwd 2.5× fwd); total
TFLOP/s with the QKV GEMMs; an estimate of the bytes the fused op must move (HBM) and the resulting GB/s; the
fraction of the H100 roofline, max(bytes / 3.0 TB/s, flops / peak) / time, with peak 67 (fp32 FMA), 495
(TF32) or 989 (bf16) TFLOP/s (dense). Measurements run in priority order and stop at --budget-s.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py, the scripts as kind.name
from measure import environment, write_result  # bench/measure.py (this file's `measure` times one op)

from pe_fast.ops import pe_attention, reference

SHAPES = {  # name: (M, B, N, D, H, K probes)
    "lst": (32, 128, 16, 160, 1, 3),
    "fmri": (16, 16, 360, 64, 4, 3),
    "mid": (16, 64, 100, 64, 4, 2),
}
PRECISIONS = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
PEAK_TFLOPS = {"fp32": 67.0, "tf32": 495.0, "bf16": 989.0}  # H100 SXM dense
PEAK_BYTES_PER_S = 3.0e12


def map_statistics(q, k, probes, M):
    """The statistics from a materialised softmax map (fp32), as a separate pass: q, k [M·B, H, N, dh]."""
    s = reference.attention_logits(q.float(), k.float(), None)
    log_p = torch.log_softmax(s, dim=-1)
    MB, H, N, _ = s.shape
    shape = (M, MB // M, H, N, N)
    return reference.attention_statistics(log_p.exp().view(shape), log_p.view(shape), probes)


def unfused(attention, with_statistics: bool = True):
    """An op made of the QKV GEMM, `attention(q, k, v)` for out, and (if asked) the statistics pass."""
    def op(x, pe, w, b, heads, probes):
        M, B, N, D = x.shape
        qkv = reference.project_qkv(x, pe, w, b)
        q, k, v = (t.flatten(0, 1) for t in reference.split_heads(qkv, heads))  # [M·B, H, N, dh]
        out = attention(q, k, v).transpose(1, 2).reshape(M, B, N, D)
        if not with_statistics:
            return out, None
        with torch.no_grad():
            stats = map_statistics(q, k, probes, M)
        return out, stats
    return op


def compiled_flex_attention():
    """torch.compile'd FlexAttention, or None where this torch has none. Every (shape, dtype, grad mode) is a
    recompilation of the same function: past dynamo's recompile limit (8) it would silently run the unfused
    eager version, so the limit is raised and each case starts from a reset (see `measure`)."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return None
    for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.6
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    return torch.compile(flex_attention, dynamic=False)


def providers():
    found = {
        "triton": lambda *a: pe_attention(*a, backend="triton"),
        "reference": lambda *a: pe_attention(*a, backend="reference"),
        "sdpa+stats": unfused(F.scaled_dot_product_attention),
        "sdpa": unfused(F.scaled_dot_product_attention, with_statistics=False),
    }
    flex = compiled_flex_attention()
    if flex is not None:
        found["flex+stats"] = unfused(flex)
    return found


# The fused op's kernels: the forward's two, then the backward's two. The per-kernel counts below are the one
# model of the op's cost (bench/training/traffic.py counts the training step's pe_attention calls with them too).
FORWARD_KERNELS = ("projection", "attention")
BACKWARD_KERNELS = ("attention_backward", "projection_backward")


def fused_kernel_flops(M, B, N, D, H) -> dict[str, float]:
    """FLOPs of each kernel: attention by flash-attention's convention (fwd 4·MB·N²·H·dh, bwd 2.5× fwd), the QKV
    GEMM (bwd: dx and dw, 2× fwd)."""
    attn = 4.0 * M * B * N * N * D  # 4·MB·N²·H·dh
    gemm = 2.0 * M * B * N * D * 3 * D
    return {"projection": gemm, "attention": attn, "attention_backward": 2.5 * attn, "projection_backward": 2 * gemm}


def fused_kernel_bytes(M, B, N, D, H, K, itemsize) -> dict[str, tuple[int, int]]:
    """(bytes read, bytes written) of HBM that each kernel of a fused implementation must move: each tensor read or
    written once per kernel."""
    act = M * B * N * D * itemsize  # one [M,B,N,D] activation
    weights = M * D * 3 * D * itemsize
    rows = M * B * H * N * 4  # one fp32 value per attention row
    return {
        "projection": (act + weights, 3 * act),  # read x (pe is small), w; write qkv
        "attention": (3 * act + K * N * N * 4, act + rows * (1 + 3 + K)),  # read qkv, probes; write out, lse, stats
        # read qkv, out, dO, lse, Δ; write Δ, dqkv
        "attention_backward": (3 * act + 2 * act + 2 * rows, rows + 3 * act),
        "projection_backward": ((act + 3 * act) + (3 * act + weights), weights + act),  # dw = hᵀ·dqkv; dx = dqkv·wᵀ
    }


def _kernels_of(mode: str) -> tuple[str, ...]:
    return FORWARD_KERNELS if mode == "forward" else FORWARD_KERNELS + BACKWARD_KERNELS


def flops(M, B, N, D, H, mode):
    """(attention FLOPs by flash-attention's convention, total FLOPs with the QKV GEMMs)."""
    per_kernel = fused_kernel_flops(M, B, N, D, H)
    kernels = _kernels_of(mode)
    return (sum(per_kernel[k] for k in kernels if k.startswith("attention")), sum(per_kernel[k] for k in kernels))


def fused_bytes(M, B, N, D, H, K, itemsize, mode):
    """HBM bytes a fused implementation must move: each tensor read or written once per kernel."""
    per_kernel = fused_kernel_bytes(M, B, N, D, H, K, itemsize)
    return sum(sum(per_kernel[k]) for k in _kernels_of(mode))


def make_inputs(M, B, N, D, K, dtype, grad):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=dtype)  # noqa: E731
    tensors = [r(M, B, N, D), r(M, N, D), r(M, D, 3 * D) / math.sqrt(D), r(M, 3 * D)]
    if grad:
        for t in tensors:
            t.requires_grad_()
    probes = (torch.rand(K, N, N, generator=g, device="cuda") > 0.5).to(dtype)
    return tensors, probes


def measure(op, shape, dtype, mode):
    import triton.testing

    M, B, N, D, H, K = shape
    (x, pe, w, b), probes = make_inputs(M, B, N, D, K, dtype, grad=mode != "forward")
    if mode == "forward":
        def fn():
            with torch.no_grad():
                op(x, pe, w, b, H, probes)
        grads = None
    else:
        grad_out = torch.randn(M, B, N, D, device="cuda", dtype=dtype)

        def fn():
            out, _ = op(x, pe, w, b, H, probes)
            out.backward(grad_out)
        grads = [x, pe, w, b]
    return triton.testing.do_bench(fn, grad_to_none=grads, quantiles=[0.5, 0.2, 0.8])


def set_tf32(enabled: bool):
    os.environ["PE_FAST_TF32"] = "1" if enabled else "0"
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--budget-s", type=float, default=200.0, help="start no measurement after this (200 s)")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of {','.join(SHAPES)}")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_ops.py: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    shapes = args.shapes.split(",")
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        print(f"bench_ops.py: --shapes: unknown {', '.join(sorted(unknown))}; known: {', '.join(SHAPES)}",
              file=sys.stderr)
        return 2

    ops = providers()
    # priority order: the fused op and its cheap baselines everywhere first, FlexAttention (compiles) last
    plan = [(s, prec, prov, mode) for prov in ops if prov != "flex+stats" for mode in ("forward", "forward+backward")
            for s in shapes for prec in PRECISIONS]
    plan += [(s, prec, "flex+stats", mode) for prec in ("bf16", "tf32", "fp32") for s in shapes
             for mode in ("forward", "forward+backward") if "flex+stats" in ops]
    if "flex+stats" not in ops:
        print("bench_ops.py: torch.nn.attention.flex_attention is not available in this torch; no FlexAttention "
              "baseline", file=sys.stderr)
    start, results = time.perf_counter(), []
    report = {**environment("cuda"), "shapes": {k: dict(zip("MBNDHK", v)) for k, v in SHAPES.items() if k in shapes},
              "peak_tflops": PEAK_TFLOPS, "peak_bytes_per_s": PEAK_BYTES_PER_S, "results": results}

    def write_report():
        write_result(args.out, {**report, "wall_s": time.perf_counter() - start})

    print(f"{'shape':6s} {'prec':5s} {'provider':11s} {'mode':17s} {'ms':>9s} {'attn TF/s':>9s} {'GB/s':>7s} "
          f"{'roofline':>8s}")
    for name, prec, provider, mode in plan:
        write_report()  # so that a run cut short by a time limit keeps what it measured
        row = dict(shape=name, precision=prec, provider=provider, mode=mode)
        results.append(row)
        if time.perf_counter() - start > args.budget_s:
            row["skipped"] = f"time budget of {args.budget_s:.0f} s spent"
            continue
        M, B, N, D, H, K = SHAPES[name]
        set_tf32(prec == "tf32")
        if provider == "flex+stats":
            torch._dynamo.reset()  # a fresh compilation per case (see compiled_flex_attention)
        try:
            ms, ms20, ms80 = measure(ops[provider], SHAPES[name], PRECISIONS[prec], mode)
        except Exception as e:  # e.g. FlexAttention rejecting a shape: record why, go on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{name:6s} {prec:5s} {provider:11s} {mode:17s} failed: {row['error'][:80]}")
            continue
        finally:
            torch.cuda.empty_cache()
        attn, total = flops(M, B, N, D, H, mode)
        moved = fused_bytes(M, B, N, D, H, K, PRECISIONS[prec].itemsize, mode)
        seconds = ms / 1e3
        roofline = max(moved / PEAK_BYTES_PER_S, total / (PEAK_TFLOPS[prec] * 1e12))
        row.update(ms=ms, ms_p20=ms20, ms_p80=ms80, attn_tflops=attn / seconds / 1e12,
                   total_tflops=total / seconds / 1e12, bytes_estimate=moved, gbytes_per_s=moved / seconds / 1e9,
                   roofline_fraction=roofline / seconds)
        print(f"{name:6s} {prec:5s} {provider:11s} {mode:17s} {ms:9.3f} {row['attn_tflops']:9.2f} "
              f"{row['gbytes_per_s']:7.0f} {row['roofline_fraction']:8.1%}")
    set_tf32(False)
    write_report()
    print(f"wrote {args.out} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
