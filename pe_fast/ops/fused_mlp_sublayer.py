"""The MLP sublayer of backend "fused", one Triton kernel forward and one backward, at any N:

    y = LN1(GELU(GELU(h W_1 + b_1) W_2 + b_2) + h)                        (exact erf GELU, after both linears)

A program owns BLOCK_T rows of one model; the hidden layer is streamed through in chunks of HIDDEN_CHUNK units
(GELU(h W_1 + b_1) for a chunk, then straight into W_2's accumulator): it never reaches HBM in the forward. The
backward recomputes it and writes dx and d a2 = dz·GELU'(a2); a third kernel gives dW_1, dW_2 and d b_1 from x and
d a2, recomputing GELU(a1) and d a1 per hidden chunk: the hidden layer never reaches HBM in the backward either.

Kernel → launcher (a custom op with its fake) → autograd Function → `mlp_forward`, which the block calls with its
tensors. Refused (the sublayer runs unfused): what fused_common.py refuses (`mlp_refusal`). So the fMRI shapes
(N = 100, 360) run this kernel and the unfused attention.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from pe_fast.ops import triton_attention
from pe_fast.ops.fused_common import (FusedConfig, accumulation, activations, dtype_refusal, gelu, gelu_grad,
                                     grads_to, layer_norm_backward, rows_times, store_layer_norm, store_part,
                                     tl_accumulation, warn_unfused)

def mlp_config() -> FusedConfig:
    """Kernel B: 16 rows of one model, 32 hidden units per step, 8 warps (its backward at 32 rows spilled 624 bytes
    per thread in IEEE fp32, 32 in bf16)."""
    return FusedConfig(block_t=16, chunk=32, warps=8)


@triton.jit
def _mlp_hidden(x_ptr, w1_ptr, b1_ptr, row, ok, m, f, f_ok, D: tl.constexpr, F: tl.constexpr,
                BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HIDDEN_CHUNK: tl.constexpr, ACC: tl.constexpr,
                PRECISION: tl.constexpr):
    """a1 = x W_1 + b_1 for hidden units f: [BLOCK_T, HIDDEN_CHUNK]."""
    a1 = rows_times(x_ptr, row, ok, w1_ptr + m * (D * F), f, f_ok, D, F, 1, BLOCK_T, HIDDEN_CHUNK, ACC, PRECISION)
    return a1 + tl.load(b1_ptr + m * F + f, mask=f_ok, other=0.0).to(ACC)[None, :]


@triton.jit
def _mlp_pre_norm(x_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, row, ok, m, dcol, d_ok, io_mask, D: tl.constexpr,
                  F: tl.constexpr, DP: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr,
                  HIDDEN_CHUNK: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr):
    """(a2 = GELU(x W_1 + b_1) W_2 + b_2, z = GELU(a2) + x), the hidden layer streamed through in chunks."""
    acc = tl.zeros([BLOCK_T, DP], ACC)
    for f0 in range(0, F, HIDDEN_CHUNK):
        f = f0 + tl.arange(0, HIDDEN_CHUNK)
        f_ok = f < F
        g1 = gelu(_mlp_hidden(x_ptr, w1_ptr, b1_ptr, row, ok, m, f, f_ok, D, F, BLOCK_T, CHUNK, HIDDEN_CHUNK, ACC,
                               PRECISION)).to(x_ptr.dtype.element_ty)
        w2 = tl.load(w2_ptr + m * (F * D) + f[:, None] * D + dcol[None, :], mask=f_ok[:, None] & d_ok[None, :],
                     other=0.0)
        acc += tl.dot(g1, w2.to(g1.dtype), input_precision=PRECISION, out_dtype=ACC)
    a2 = acc + tl.load(b2_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)[None, :]
    z = gelu(a2) + tl.load(x_ptr + row[:, None] * D + dcol[None, :], mask=io_mask, other=0.0).to(ACC)
    return a2, z


@triton.jit(do_not_specialize=["R"])
def _mlp_sublayer_fwd_kernel(
    x_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, lnw_ptr, lnb_ptr, y_ptr, R, eps, D: tl.constexpr, F: tl.constexpr,
    DP: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HIDDEN_CHUNK: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):
    tile, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
    r = tile * BLOCK_T + tl.arange(0, BLOCK_T)  # a model's rows, B·N of them: no sequence structure needed
    ok = r < R
    row = m * R + r
    dcol = tl.arange(0, DP)
    d_ok = dcol < D
    io_mask = ok[:, None] & d_ok[None, :]
    _, z = _mlp_pre_norm(x_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, row, ok, m, dcol, d_ok, io_mask, D, F, DP, BLOCK_T,
                         CHUNK, HIDDEN_CHUNK, ACC, PRECISION)
    store_layer_norm(z, lnw_ptr, lnb_ptr, y_ptr, row, m, dcol, d_ok, io_mask, eps, D, ACC)


@triton.jit(do_not_specialize=["R", "num_tiles"])
def _mlp_sublayer_bwd_kernel(
    dy_ptr, x_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, lnw_ptr, dx_ptr, da2_ptr, part_ptr, R, num_tiles, eps,
    D: tl.constexpr, F: tl.constexpr, DP: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr,
    HIDDEN_CHUNK: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    # Pass 1 recomputes the forward to the layer norm: dz, and d a2 = dz·GELU'(a2) (stored: the weight gradients'
    # kernel reads it). Pass 2 recomputes each hidden chunk's d a1 = (d a2 W_2ᵀ)·GELU'(a1) and adds d a1 W_1ᵀ to dx.
    tile, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
    r = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = r < R
    row = m * R + r
    dcol = tl.arange(0, DP)
    d_ok = dcol < D
    io_mask = ok[:, None] & d_ok[None, :]
    a2, z = _mlp_pre_norm(x_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, row, ok, m, dcol, d_ok, io_mask, D, F, DP, BLOCK_T,
                          CHUNK, HIDDEN_CHUNK, ACC, PRECISION)
    dz = layer_norm_backward(z, dy_ptr, lnw_ptr, part_ptr, row, m, tile, num_tiles, dcol, d_ok, io_mask, eps, D, ACC)
    da2 = (dz * gelu_grad(a2)).to(x_ptr.dtype.element_ty)
    tl.store(da2_ptr + row[:, None] * D + dcol[None, :], da2, mask=io_mask)
    store_part(part_ptr, 2, da2.to(ACC), m, tile, num_tiles, dcol, d_ok, D)  # d b_2
    tl.debug_barrier()  # d a2 is read back below, by other threads of the program
    dx = dz  # the residual's share
    for f0 in range(0, F, HIDDEN_CHUNK):
        f = f0 + tl.arange(0, HIDDEN_CHUNK)
        f_ok = f < F
        a1 = _mlp_hidden(x_ptr, w1_ptr, b1_ptr, row, ok, m, f, f_ok, D, F, BLOCK_T, CHUNK, HIDDEN_CHUNK, ACC,
                         PRECISION)
        dg1 = rows_times(da2_ptr, row, ok, w2_ptr + m * (F * D), f, f_ok, D, 1, D, BLOCK_T, HIDDEN_CHUNK, ACC,
                          PRECISION)  # d a2·W_2ᵀ
        da1 = (dg1 * gelu_grad(a1)).to(da2.dtype)
        w1t = tl.load(w1_ptr + m * (D * F) + dcol[None, :] * F + f[:, None], mask=f_ok[:, None] & d_ok[None, :],
                      other=0.0).to(da1.dtype)  # W_1[:, f]ᵀ
        dx += tl.dot(da1, w1t, input_precision=PRECISION, out_dtype=ACC)
    tl.store(dx_ptr + row[:, None] * D + dcol[None, :], dx.to(dx_ptr.dtype.element_ty), mask=io_mask)


@triton.jit(do_not_specialize=["R"])
def _mlp_weight_grad_kernel(
    x_ptr, da2_ptr, w1_ptr, b1_ptr, w2_ptr, dw1_ptr, dw2_ptr, db1_ptr, R, D: tl.constexpr, F: tl.constexpr,
    DP: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HIDDEN_CHUNK: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # dW_1[:, f], dW_2[f, :] and d b_1[f] of one model's hidden units f, summed over all its rows in order (no
    # atomics: deterministic): GELU(a1) and d a1 are recomputed from x and d a2, so the hidden layer never reaches
    # HBM in the backward either. A model's programs sit next to each other in the grid and share x and d a2 in L2.
    fc, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
    f = fc * HIDDEN_CHUNK + tl.arange(0, HIDDEN_CHUNK)
    f_ok = f < F
    dcol = tl.arange(0, DP)
    d_ok = dcol < D
    dw1 = tl.zeros([DP, HIDDEN_CHUNK], ACC)
    dw2 = tl.zeros([HIDDEN_CHUNK, DP], ACC)
    db1 = tl.zeros([HIDDEN_CHUNK], ACC)
    r0 = 0
    while r0 < R:  # not range(0, R, ...): the interpreter (triton 3.6, numpy 2) fails on a runtime range bound
        r = r0 + tl.arange(0, BLOCK_T)
        r0 += BLOCK_T
        ok = r < R
        row = m * R + r
        io_mask = ok[:, None] & d_ok[None, :]
        a1 = _mlp_hidden(x_ptr, w1_ptr, b1_ptr, row, ok, m, f, f_ok, D, F, BLOCK_T, CHUNK, HIDDEN_CHUNK, ACC,
                         PRECISION)
        dg1 = rows_times(da2_ptr, row, ok, w2_ptr + m * (F * D), f, f_ok, D, 1, D, BLOCK_T, HIDDEN_CHUNK, ACC,
                          PRECISION)  # d a2·W_2ᵀ, 0 in the invalid rows
        da1 = (dg1 * gelu_grad(a1)).to(x_ptr.dtype.element_ty)
        g1 = tl.where(ok[:, None], gelu(a1), 0.0).to(x_ptr.dtype.element_ty)  # invalid rows: a1 = b1, not 0
        xt = tl.load(x_ptr + row[:, None] * D + dcol[None, :], mask=io_mask, other=0.0)
        da2 = tl.load(da2_ptr + row[:, None] * D + dcol[None, :], mask=io_mask, other=0.0).to(g1.dtype)
        dw2 += tl.dot(tl.trans(g1), da2, input_precision=PRECISION, out_dtype=ACC)
        dw1 += tl.dot(tl.trans(xt), da1, input_precision=PRECISION, out_dtype=ACC)
        db1 += tl.sum(da1.to(ACC), 0)
    w_mask = d_ok[:, None] & f_ok[None, :]
    tl.store(dw1_ptr + m * (D * F) + dcol[:, None] * F + f[None, :], dw1.to(dw1_ptr.dtype.element_ty), mask=w_mask)
    tl.store(dw2_ptr + m * (F * D) + f[:, None] * D + dcol[None, :], dw2.to(dw2_ptr.dtype.element_ty),
             mask=f_ok[:, None] & d_ok[None, :])
    tl.store(db1_ptr + m * F + f, db1.to(db1_ptr.dtype.element_ty), mask=f_ok)


def _mlp_tiles(x: Tensor) -> int:
    return triton.cdiv(x[0].numel() // x.shape[-1], mlp_config().block_t)


def _mlp_constants(x: Tensor, w1: Tensor) -> dict:
    D, F = w1.shape[1:]
    cfg = mlp_config()
    return dict(D=D, F=F, DP=triton.next_power_of_2(D), BLOCK_T=cfg.block_t, CHUNK=cfg.chunk,
                HIDDEN_CHUNK=cfg.chunk, ACC=tl_accumulation(x.dtype), PRECISION=triton_attention.dot_precision(x.dtype),
                num_warps=cfg.warps, num_stages=1)


@torch.library.custom_op("pe_fast::fused_mlp_sublayer", mutates_args=())
def mlp_sublayer_forward(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, ln_w: Tensor, ln_b: Tensor,
                         eps: float) -> Tensor:
    """Kernel B's forward: y [M,B,N,D]."""
    y = torch.empty_like(x)
    _mlp_sublayer_fwd_kernel[(_mlp_tiles(x), x.shape[0])](x, w1, b1, w2, b2, ln_w, ln_b, y,
                                                           x[0].numel() // x.shape[-1], eps, **_mlp_constants(x, w1))
    return y


@mlp_sublayer_forward.register_fake
def _(x, w1, b1, w2, b2, ln_w, ln_b, eps):
    return torch.empty_like(x)


@torch.library.custom_op("pe_fast::fused_mlp_sublayer_backward", mutates_args=())
def mlp_sublayer_backward(dy: Tensor, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, ln_w: Tensor,
                          eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Kernel B's backward: (dx, d a2 [.., D], partial sums [3,M,tiles,D] of dγ, dβ and d b_2)."""
    M, R, D = x.shape[0], x[0].numel() // x.shape[-1], x.shape[-1]
    tiles = _mlp_tiles(x)
    dx, da2 = torch.empty_like(x), torch.empty_like(x)
    parts = x.new_empty(3, M, tiles, D, dtype=accumulation(x.dtype))
    _mlp_sublayer_bwd_kernel[(tiles, M)](dy.contiguous(), x, w1, b1, w2, b2, ln_w, dx, da2, parts, R, tiles, eps,
                                         **_mlp_constants(x, w1))
    return dx, da2, parts


@mlp_sublayer_backward.register_fake
def _(dy, x, w1, b1, w2, b2, ln_w, eps):
    M, D = x.shape[0], x.shape[-1]
    return torch.empty_like(x), torch.empty_like(x), x.new_empty(3, M, _mlp_tiles(x), D, dtype=accumulation(x.dtype))


@torch.library.custom_op("pe_fast::fused_mlp_weight_gradients", mutates_args=())
def mlp_weight_gradients(x: Tensor, da2: Tensor, w1: Tensor, b1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dW_1 [M,D,F], dW_2 [M,F,D], d b_1 [M,F]) in the accumulation dtype, GELU(a1) and d a1 recomputed."""
    M, R, (D, F) = x.shape[0], x[0].numel() // x.shape[-1], w1.shape[1:]
    acc = accumulation(x.dtype)
    dw1, dw2, db1 = x.new_empty(M, D, F, dtype=acc), x.new_empty(M, F, D, dtype=acc), x.new_empty(M, F, dtype=acc)
    constants = _mlp_constants(x, w1)
    _mlp_weight_grad_kernel[(triton.cdiv(F, constants["HIDDEN_CHUNK"]), M)](x, da2, w1, b1, w2, dw1, dw2, db1, R,
                                                                            **constants)
    return dw1, dw2, db1


@mlp_weight_gradients.register_fake
def _(x, da2, w1, b1, w2):
    M, (D, F), acc = x.shape[0], w1.shape[1:], accumulation(x.dtype)
    return x.new_empty(M, D, F, dtype=acc), x.new_empty(M, F, D, dtype=acc), x.new_empty(M, F, dtype=acc)


class MLPSublayer(torch.autograd.Function):
    """LN1(GELU(GELU(x W_1 + b_1) W_2 + b_2) + x)."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, ln_w, ln_b, eps):
        ctx.save_for_backward(x, w1, b1, w2, b2, ln_w, ln_b)
        ctx.eps = eps
        return mlp_sublayer_forward(x, w1, b1, w2, b2, ln_w, ln_b, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w1, b1, w2, b2, ln_w, ln_b = ctx.saved_tensors
        dx, da2, parts = mlp_sublayer_backward(dy, x, w1, b1, w2, b2, ln_w, ctx.eps)
        dw1, dw2, db1 = mlp_weight_gradients(x, da2, w1, b1, w2)
        dln_w, dln_b, db2 = parts.sum(2)
        grads = (dw1, db1, dw2, db2, dln_w, dln_b)
        return (dx, *grads_to(grads, (w1, b1, w2, b2, ln_w, ln_b)), None)


def mlp_refusal(x: Tensor) -> str | None:
    """Why kernel B cannot take this MLP sublayer (it runs unfused), or None: any N, sequences play no part."""
    return dtype_refusal(x)


def takes_mlp(h: Tensor) -> bool:
    reason = mlp_refusal(h)
    if reason is not None:
        warn_unfused("MLP", reason)
    return reason is None


def mlp_forward(h: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, ln_w: Tensor, ln_b: Tensor,
                eps: float) -> Tensor:
    """A Post-LN block's MLP sublayer through kernel B: LN1(GELU(GELU(h W_1 + b_1) W_2 + b_2) + h)."""
    return MLPSublayer.apply(activations(h), w1, b1, w2, b2, ln_w, ln_b, eps)
