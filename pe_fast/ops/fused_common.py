"""What the two fused sublayers of backend "fused" share (fused_attention_sublayer.py, the attention sublayer;
fused_mlp_sublayer.py, the MLP sublayer; each one Triton kernel forward and one backward): the tile
configuration, the Triton helpers for GELU, row products and layer norm, the accumulation dtypes, and the rules
both refuse by (a width > MAX_WIDTH; dtypes other than float32, float64 running in the interpreter for the tests,
and bfloat16 under autocast): a refused sublayer runs unfused, with one logged warning per reason.

Backward: each kernel recomputes its forward instead of storing anything, then writes dx whole and what the
weight gradients need; the bias and layer-norm gradients are per-tile partial sums ([tiles, D], small) that torch
adds up. Every launch is behind a torch.library custom op with a fake implementation, so the byte ledger
(bench/training/traffic.py) sees each kernel as one op and counts it as its sublayer_traffic says.
"""
from __future__ import annotations

import dataclasses
import functools
import logging

import torch
import triton
import triton.language as tl
from torch import Tensor

from pe_fast.ops.pe_attention import autocast_on

log = logging.getLogger("pe_fast")

FUSED_MAX_N = 16  # kernel A's tile (attention_config) holds at least one whole sequence


MAX_WIDTH = 256  # the [tile, width] accumulators are held whole, padded to a power of two
LOG2E = 1.4426950408889634


LN2 = 0.6931471805599453
INV_SQRT2 = 0.7071067811865476


INV_SQRT_2PI = 0.3989422804014327
# the kernels' copies (a @triton.jit function reads globals only as constexprs)
_LOG2E, _LN2 = tl.constexpr(LOG2E), tl.constexpr(LN2)
_INV_SQRT2, _INV_SQRT_2PI = tl.constexpr(INV_SQRT2), tl.constexpr(INV_SQRT_2PI)


@dataclasses.dataclass(frozen=True)
class FusedConfig:
    block_t: int  # rows per program
    chunk: int  # columns per tl.dot step: of the head dim, of the width reduced over, of the hidden units
    warps: int


def padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@triton.jit
def gelu(a):
    return 0.5 * a * (1.0 + tl.math.erf(a * _INV_SQRT2))


@triton.jit
def gelu_grad(a):
    return 0.5 * (1.0 + tl.math.erf(a * _INV_SQRT2)) + a * _INV_SQRT_2PI * tl.exp(-0.5 * a * a)


@triton.jit
def rows_times(a_ptr, row, ok, w_ptr, col, col_ok, K: tl.constexpr, STRIDE_K: tl.constexpr,
                STRIDE_C: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, ACC: tl.constexpr,
                PRECISION: tl.constexpr):
    """Σ_k a[row, k]·w[k·STRIDE_K + col·STRIDE_C] for the tile's rows of a [.., K] tensor: [BLOCK_T, CHUNK] in ACC
    (STRIDE_C = K, STRIDE_K = 1 multiplies by a weight's transpose). The reduction runs in chunks of CHUNK, from
    L1/L2: a [tile, width] operand held in registers would be replicated across the threads of a CUDA-core dot
    and spill (tests/test_fused_sublayers.py compiles the kernels and counts the spills)."""
    acc = tl.zeros([BLOCK_T, CHUNK], ACC)
    for k0 in range(0, K, CHUNK):
        k = k0 + tl.arange(0, CHUNK)
        k_ok = k < K
        ak = tl.load(a_ptr + row[:, None] * K + k[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        wk = tl.load(w_ptr + k[:, None] * STRIDE_K + col[None, :] * STRIDE_C, mask=k_ok[:, None] & col_ok[None, :],
                     other=0.0)
        acc += tl.dot(ak, wk.to(ak.dtype), input_precision=PRECISION, out_dtype=ACC)
    return acc


@triton.jit
def layer_norm_rows(z, d_ok, eps, D: tl.constexpr):
    """(ẑ, rstd) of each row of z [BLOCK_T, DP] over its first D columns; ẑ is 0 in the padding."""
    mean = tl.sum(tl.where(d_ok[None, :], z, 0.0), 1) / D
    zc = tl.where(d_ok[None, :], z - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, 1) / D + eps)
    return zc * rstd[:, None], rstd


@triton.jit
def store_layer_norm(z, lnw_ptr, lnb_ptr, y_ptr, row, m, dcol, d_ok, io_mask, eps, D: tl.constexpr, ACC: tl.constexpr):
    """y = LN(z)·w + b of model m, stored at rows `row` of y [R, D]: the end of both forward kernels."""
    zhat, _ = layer_norm_rows(z, d_ok, eps, D)
    y = zhat * tl.load(lnw_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)[None, :]
    y += tl.load(lnb_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)[None, :]
    tl.store(y_ptr + row[:, None] * D + dcol[None, :], y.to(y_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def store_part(part_ptr, index, rows, m, tile, num_tiles, dcol, d_ok, D: tl.constexpr):
    """The tile's column sums of rows [BLOCK_T, DP] (its invalid rows are 0) into part[index, m, tile]: parts
    [3, M, tiles, D] of a bias or layer-norm gradient, which torch adds up over the tiles."""
    plane = tl.num_programs(1) * num_tiles * D
    tl.store(part_ptr + index * plane + (m * num_tiles + tile) * D + dcol,
             tl.sum(rows, 0).to(part_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def layer_norm_backward(z, dy_ptr, lnw_ptr, part_ptr, row, m, tile, num_tiles, dcol, d_ok, io_mask, eps,
                         D: tl.constexpr, ACC: tl.constexpr):
    """dz of y = LN(z)·γ + β (ẑ recomputed from z; dy read at rows `row` of dy [R, D]), and this tile's partial
    sums of dγ = Σ dy·ẑ and dβ = Σ dy (parts 0 and 1): the layer norm of both backward kernels."""
    zhat, rstd = layer_norm_rows(z, d_ok, eps, D)
    dy = tl.load(dy_ptr + row[:, None] * D + dcol[None, :], mask=io_mask, other=0.0).to(ACC)
    lnw = tl.load(lnw_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)
    g = dy * lnw[None, :]
    dz = rstd[:, None] * (g - (tl.sum(g, 1) / D)[:, None] - zhat * (tl.sum(g * zhat, 1) / D)[:, None])
    dz = tl.where(io_mask, dz, 0.0)
    store_part(part_ptr, 0, dy * zhat, m, tile, num_tiles, dcol, d_ok, D)
    store_part(part_ptr, 1, dy, m, tile, num_tiles, dcol, d_ok, D)
    return dz


def tl_accumulation(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def accumulation(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def grads_to(grads, params):
    return tuple(None if g is None else g.to(p.dtype) for g, p in zip(grads, params))


def dtype_refusal(x: Tensor) -> str | None:
    if x.shape[-1] > MAX_WIDTH:
        return f"width {x.shape[-1]} > {MAX_WIDTH}"
    if autocast_on(x.device):
        low = torch.get_autocast_dtype(x.device.type)
        return None if low == torch.bfloat16 else f"autocast {low} is not fused"
    if x.dtype not in (torch.float32, torch.float64):
        return f"the fused kernels take float32 (float64 in the interpreter), not {x.dtype}"
    return None


@functools.cache
def warn_unfused(sublayer: str, reason: str) -> None:
    log.warning("backend 'fused' runs the %s sublayer unfused: %s", sublayer, reason)


def activations(h: Tensor) -> Tensor:
    """h in the autocast dtype where autocast is on (the parameters and the PE's addend stay float32)."""
    return h.to(torch.get_autocast_dtype(h.device.type)) if autocast_on(h.device) else h
