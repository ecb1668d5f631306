"""Fused sublayers (backend "fused"): a Post-LN block's attention sublayer and its MLP sublayer, each one Triton
kernel forward and one backward, for N ≤ FUSED_MAX_N (the LST task's N = 16).

    A:  h = LN0(((x + pe) W_qkv + b_qkv → attention) W_o + b_o + x + pe)     (with the statistics and probes)
    B:  y = LN1(GELU(GELU(h W_1 + b_1) W_2 + b_2) + h)                        (exact erf GELU, after both linears)

Kernel A: a program owns a tile of BLOCK_T rows holding BLOCK_T // N whole sequences of one model, so the
attention never leaves the tile; q, k, v are computed chunk by chunk from x (plus the PE's addend pe·W + b,
computed once per model as in projection.py), the [tile, tile] scores are masked to "same sequence", and each
head's output goes straight into the output projection's accumulator, then + b_o + residual (+ PE) → layer
norm. Only x is read and h written; the q, k, v and attention tensors stay on chip.
Kernel B: a program owns BLOCK_T rows of one model; the hidden layer is streamed through in chunks of HIDDEN_CHUNK
units (GELU(h W_1 + b_1) for a chunk, then straight into W_2's accumulator): it never reaches HBM in the forward.

Backward: each kernel recomputes its forward instead of storing anything, then writes dx whole and what the
weight gradients need. A writes dz (the pre-norm gradient: the out-projection's output gradient and the
residual's), o (the attention output, for dW_o) and dqkv (for dW_qkv), whose weight gradients are then grouped
GEMMs over the pack (torch.bmm: per-tile partial sums of a [D, 3D] weight cost more bytes than the tile's
activations). B writes d a2 = dz·GELU'(a2), and a third kernel gives dW_1, dW_2 and d b_1 from x and d a2,
recomputing GELU(a1) and d a1 per hidden chunk: the hidden layer never reaches HBM in the backward either. The
other bias and the layer-norm gradients are per-tile partial sums ([tiles, D], small) that torch adds up.

Refused, each sublayer on its own (it runs unfused, the attention with backend "triton"'s op; one logged warning
per reason): kernel A refuses RoPE, a relative-position bias, PE dropout and N > FUSED_MAX_N (`attention_refusal`),
both refuse a width > MAX_WIDTH and dtypes other than float32 (float64 runs in the interpreter, for the tests) and
bfloat16 under autocast (`mlp_refusal`). So the fMRI shapes (N = 100, 360) run kernel B and the unfused attention.
Every launch is behind a torch.library custom op with a fake implementation, so the byte ledger
(bench/training/traffic.py) sees each kernel as one op, and counts it as `sublayer_traffic` says.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from pe_fast.ops import projection, triton_attention
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


def attention_config(head_dim: int) -> FusedConfig:
    """Kernel A: 16 rows (one LST sequence) and 8 warps. The IEEE fp32 dots run on the CUDA cores, whose operand
    layouts replicate rows across threads: 32 rows spilled ~450 bytes per thread at width 160 (sm_90), 16 do
    not (tests/test_fused_sublayers.py compiles every configuration and counts the spills)."""
    return FusedConfig(block_t=16, chunk=min(32, max(16, triton.next_power_of_2(head_dim))), warps=8)


def mlp_config() -> FusedConfig:
    """Kernel B: 16 rows of one model, 32 hidden units per step, 8 warps (its backward at 32 rows spilled 624 bytes
    per thread in IEEE fp32, 32 in bf16)."""
    return FusedConfig(block_t=16, chunk=32, warps=8)


# Kernel A's weight gradients: [32, 32] blocks of dW per program, 16 rows a step
WEIGHT_GRAD = FusedConfig(block_t=16, chunk=32, warps=4)


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ---- kernels ----

@triton.jit
def _gelu(a):
    return 0.5 * a * (1.0 + tl.math.erf(a * _INV_SQRT2))


@triton.jit
def _gelu_grad(a):
    return 0.5 * (1.0 + tl.math.erf(a * _INV_SQRT2)) + a * _INV_SQRT_2PI * tl.exp(-0.5 * a * a)


@triton.jit
def _sequence_rows(tile, B, N: tl.constexpr, BLOCK_T: tl.constexpr):
    """Kernel A's rows of tile `tile` of a model: (sequence, token, valid), BLOCK_T // N whole sequences end to
    end; rows past the last whole sequence (N need not divide BLOCK_T) and past the batch are invalid."""
    r = tl.arange(0, BLOCK_T)
    group = BLOCK_T // N
    seq = tile * group + r // N
    return seq, r % N, (r < group * N) & (seq < B)


@triton.jit
def _rows_times(a_ptr, row, ok, w_ptr, col, col_ok, K: tl.constexpr, STRIDE_K: tl.constexpr,
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
def _project(x_ptr, w_ptr, add_ptr, row, tok, ok, m, col, col_ok, D: tl.constexpr, W_COLS: tl.constexpr,
             N: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HAS_ADD: tl.constexpr, ACC: tl.constexpr,
             PRECISION: tl.constexpr):
    """x[rows] @ W[m][:, col] (+ addend[m, tok, col] with HAS_ADD): [BLOCK_T, CHUNK] in ACC (x's chunks come
    from L1/L2 again for every output chunk; HBM reads x once)."""
    acc = _rows_times(x_ptr, row, ok, w_ptr + m * (D * W_COLS), col, col_ok, D, W_COLS, 1, BLOCK_T, CHUNK, ACC,
                      PRECISION)
    if HAS_ADD:
        acc += tl.load(add_ptr + (m * N + tok)[:, None] * W_COLS + col[None, :], mask=ok[:, None] & col_ok[None, :],
                       other=0.0).to(ACC)
    return acc


@triton.jit
def _operand(x_ptr, w_ptr, add_ptr, row, tok, ok, m, col, col_ok, D: tl.constexpr, N: tl.constexpr,
             BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HAS_ADD: tl.constexpr, ACC: tl.constexpr,
             PRECISION: tl.constexpr):
    """A chunk of q, k or v (col: its columns in the 3D of the projection), rounded once to x's dtype."""
    t = _project(x_ptr, w_ptr, add_ptr, row, tok, ok, m, col, col_ok, D, 3 * D, N, BLOCK_T, CHUNK, HAS_ADD, ACC,
                 PRECISION)
    return t.to(x_ptr.dtype.element_ty)


@triton.jit
def _attention_probabilities(x_ptr, w_ptr, add_ptr, row, seq, tok, ok, m, head, qk_scale, D: tl.constexpr,
                             H: tl.constexpr, N: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr,
                             HAS_ADD: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr):
    """One head's scores of the tile (log2 units) and its same-sequence softmax: (s, e, denom, rowmax, same),
    p = e / denom."""
    HEAD_DIM: tl.constexpr = D // H
    s = tl.zeros([BLOCK_T, BLOCK_T], ACC)
    for c0 in range(0, HEAD_DIM, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        c_ok = c < HEAD_DIM
        q = _operand(x_ptr, w_ptr, add_ptr, row, tok, ok, m, head * HEAD_DIM + c, c_ok, D, N, BLOCK_T, CHUNK,
                     HAS_ADD, ACC, PRECISION)
        k = _operand(x_ptr, w_ptr, add_ptr, row, tok, ok, m, D + head * HEAD_DIM + c, c_ok, D, N, BLOCK_T, CHUNK,
                     HAS_ADD, ACC, PRECISION)
        s += tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=ACC)
    s = s * qk_scale  # finite: masked loads are 0
    same = ok[None, :] & (seq[:, None] == seq[None, :])
    s_valid = tl.where(same, s, float("-inf"))
    mx = tl.maximum(tl.max(s_valid, 1), -1.0e30)  # invalid rows have no key: no inf − inf
    e = tl.exp2(s_valid - mx[:, None])  # other sequences' keys contribute exactly 0
    denom = tl.where(ok, tl.sum(e, 1), 1.0)
    return s, e, denom, mx, same


@triton.jit
def _layer_norm_rows(z, d_ok, eps, D: tl.constexpr):
    """(ẑ, rstd) of each row of z [BLOCK_T, DP] over its first D columns; ẑ is 0 in the padding."""
    mean = tl.sum(tl.where(d_ok[None, :], z, 0.0), 1) / D
    zc = tl.where(d_ok[None, :], z - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, 1) / D + eps)
    return zc * rstd[:, None], rstd


@triton.jit
def _store_layer_norm(z, lnw_ptr, lnb_ptr, y_ptr, row, m, dcol, d_ok, io_mask, eps, D: tl.constexpr, ACC: tl.constexpr):
    """y = LN(z)·w + b of model m, stored at rows `row` of y [R, D]: the end of both forward kernels."""
    zhat, _ = _layer_norm_rows(z, d_ok, eps, D)
    y = zhat * tl.load(lnw_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)[None, :]
    y += tl.load(lnb_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)[None, :]
    tl.store(y_ptr + row[:, None] * D + dcol[None, :], y.to(y_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _store_part(part_ptr, index, rows, m, tile, num_tiles, dcol, d_ok, D: tl.constexpr):
    """The tile's column sums of rows [BLOCK_T, DP] (its invalid rows are 0) into part[index, m, tile]: parts
    [3, M, tiles, D] of a bias or layer-norm gradient, which torch adds up over the tiles."""
    plane = tl.num_programs(1) * num_tiles * D
    tl.store(part_ptr + index * plane + (m * num_tiles + tile) * D + dcol,
             tl.sum(rows, 0).to(part_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _layer_norm_backward(z, dy_ptr, lnw_ptr, part_ptr, row, m, tile, num_tiles, dcol, d_ok, io_mask, eps,
                         D: tl.constexpr, ACC: tl.constexpr):
    """dz of y = LN(z)·γ + β (ẑ recomputed from z; dy read at rows `row` of dy [R, D]), and this tile's partial
    sums of dγ = Σ dy·ẑ and dβ = Σ dy (parts 0 and 1): the layer norm of both backward kernels."""
    zhat, rstd = _layer_norm_rows(z, d_ok, eps, D)
    dy = tl.load(dy_ptr + row[:, None] * D + dcol[None, :], mask=io_mask, other=0.0).to(ACC)
    lnw = tl.load(lnw_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)
    g = dy * lnw[None, :]
    dz = rstd[:, None] * (g - (tl.sum(g, 1) / D)[:, None] - zhat * (tl.sum(g * zhat, 1) / D)[:, None])
    dz = tl.where(io_mask, dz, 0.0)
    _store_part(part_ptr, 0, dy * zhat, m, tile, num_tiles, dcol, d_ok, D)
    _store_part(part_ptr, 1, dy, m, tile, num_tiles, dcol, d_ok, D)
    return dz


@triton.jit
def _attention_out_projection(x_ptr, w_ptr, add_ptr, wo_ptr, o_ptr, probe_ptr, stat_ptr, row, seq, tok, ok, m, B,
                              qk_scale, dcol, d_ok, D: tl.constexpr, DP: tl.constexpr, H: tl.constexpr,
                              N: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HAS_ADD: tl.constexpr,
                              NUM_PROBES: tl.constexpr, STORE_O: tl.constexpr, STORE_STATS: tl.constexpr,
                              ACC: tl.constexpr, PRECISION: tl.constexpr):
    """Σ_heads attention(head) @ W_o[head rows] for the tile: [BLOCK_T, DP]. STORE_STATS: the statistics rows
    [M, H, S, B, N] (as triton_attention's kernels); STORE_O: the attention output o [M, B, N, D] (the backward's,
    for dW_o)."""
    HEAD_DIM: tl.constexpr = D // H
    acc = tl.zeros([BLOCK_T, DP], ACC)
    for head in range(H):
        s, e, denom, mx, same = _attention_probabilities(x_ptr, w_ptr, add_ptr, row, seq, tok, ok, m, head, qk_scale,
                                                     D, H, N, BLOCK_T, CHUNK, HAS_ADD, ACC, PRECISION)
        p = e / denom[:, None]
        if STORE_STATS:
            plane = B * N
            stat_row = (m * H + head) * ((3 + NUM_PROBES) * plane) + seq * N + tok
            lse2 = mx + tl.log2(denom)
            tl.store(stat_ptr + stat_row, ((lse2 - tl.sum(p * s, 1)) * _LN2).to(stat_ptr.dtype.element_ty), mask=ok)
            tl.store(stat_ptr + stat_row + plane, (1.0 / denom).to(stat_ptr.dtype.element_ty), mask=ok)
            tl.store(stat_ptr + stat_row + 2 * plane, tl.sum(p * p, 1).to(stat_ptr.dtype.element_ty), mask=ok)
            for k in tl.static_range(NUM_PROBES):
                probe = tl.load(probe_ptr + k * N * N + tok[:, None] * N + tok[None, :], mask=same, other=0).to(ACC)
                tl.store(stat_ptr + stat_row + (3 + k) * plane, tl.sum(p * probe, 1).to(stat_ptr.dtype.element_ty),
                         mask=ok)
        p = p.to(x_ptr.dtype.element_ty)
        for c0 in range(0, HEAD_DIM, CHUNK):
            c = c0 + tl.arange(0, CHUNK)
            c_ok = c < HEAD_DIM
            v = _operand(x_ptr, w_ptr, add_ptr, row, tok, ok, m, 2 * D + head * HEAD_DIM + c, c_ok, D, N, BLOCK_T,
                         CHUNK, HAS_ADD, ACC, PRECISION)
            o = tl.dot(p, v, input_precision=PRECISION, out_dtype=ACC).to(x_ptr.dtype.element_ty)
            if STORE_O:
                tl.store(o_ptr + row[:, None] * D + (head * HEAD_DIM + c)[None, :], o,
                         mask=ok[:, None] & c_ok[None, :])
            wo = tl.load(wo_ptr + m * (D * D) + (head * HEAD_DIM + c)[:, None] * D + dcol[None, :],
                         mask=c_ok[:, None] & d_ok[None, :], other=0.0)
            acc += tl.dot(o, wo.to(o.dtype), input_precision=PRECISION, out_dtype=ACC)
    return acc


@triton.jit
def _attention_residual(acc, x_ptr, pe_ptr, bo_ptr, row, tok, m, dcol, d_ok, io_mask, D: tl.constexpr,
                        N: tl.constexpr, HAS_PE: tl.constexpr, ACC: tl.constexpr):
    """z = attention·W_o + b_o + x (+ pe): the layer norm's input."""
    z = acc + tl.load(bo_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)[None, :]
    z += tl.load(x_ptr + row[:, None] * D + dcol[None, :], mask=io_mask, other=0.0).to(ACC)
    if HAS_PE:
        z += tl.load(pe_ptr + (m * N + tok)[:, None] * D + dcol[None, :], mask=io_mask, other=0.0).to(ACC)
    return z


@triton.jit(do_not_specialize=["B", "num_tiles"])
def _attention_sublayer_fwd_kernel(
    x_ptr, pe_ptr, add_ptr, w_ptr, wo_ptr, bo_ptr, lnw_ptr, lnb_ptr, probe_ptr, y_ptr, stat_ptr, B, num_tiles,
    qk_scale, eps, N: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, H: tl.constexpr, NUM_PROBES: tl.constexpr,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HAS_PE: tl.constexpr, HAS_ADD: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):
    tile, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
    seq, tok, ok = _sequence_rows(tile, B, N, BLOCK_T)
    row = (m * B + seq) * N + tok
    dcol = tl.arange(0, DP)
    d_ok = dcol < D
    io_mask = ok[:, None] & d_ok[None, :]
    acc = _attention_out_projection(x_ptr, w_ptr, add_ptr, wo_ptr, y_ptr, probe_ptr, stat_ptr, row, seq, tok, ok, m,
                                    B, qk_scale, dcol, d_ok, D, DP, H, N, BLOCK_T, CHUNK, HAS_ADD, NUM_PROBES, False,
                                    True, ACC, PRECISION)
    z = _attention_residual(acc, x_ptr, pe_ptr, bo_ptr, row, tok, m, dcol, d_ok, io_mask, D, N, HAS_PE, ACC)
    _store_layer_norm(z, lnw_ptr, lnb_ptr, y_ptr, row, m, dcol, d_ok, io_mask, eps, D, ACC)


@triton.jit(do_not_specialize=["B", "num_tiles"])
def _attention_sublayer_bwd_kernel(
    dy_ptr, x_ptr, pe_ptr, add_ptr, w_ptr, wo_ptr, bo_ptr, lnw_ptr, dx_ptr, dz_ptr, o_ptr, dqkv_ptr, part_ptr, B,
    num_tiles,
    sm_scale, eps, N: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, H: tl.constexpr, BLOCK_T: tl.constexpr,
    CHUNK: tl.constexpr, HAS_PE: tl.constexpr, HAS_ADD: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    # Pass 1 recomputes the forward up to the layer norm (storing o) and gives dz; pass 2 recomputes each head's
    # probabilities and runs the attention backward with dO = dz·W_oᵀ, chunk by chunk, and dx = dqkv·W_qkvᵀ + dz.
    HEAD_DIM: tl.constexpr = D // H
    tile, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
    seq, tok, ok = _sequence_rows(tile, B, N, BLOCK_T)
    row = (m * B + seq) * N + tok
    dcol = tl.arange(0, DP)
    d_ok = dcol < D
    io_mask = ok[:, None] & d_ok[None, :]
    acc = _attention_out_projection(x_ptr, w_ptr, add_ptr, wo_ptr, o_ptr, x_ptr, x_ptr, row, seq, tok, ok, m, B,
                                    sm_scale * _LOG2E, dcol, d_ok, D, DP, H, N, BLOCK_T, CHUNK, HAS_ADD, 0, True,
                                    False, ACC, PRECISION)
    z = _attention_residual(acc, x_ptr, pe_ptr, bo_ptr, row, tok, m, dcol, d_ok, io_mask, D, N, HAS_PE, ACC)
    dz = _layer_norm_backward(z, dy_ptr, lnw_ptr, part_ptr, row, m, tile, num_tiles, dcol, d_ok, io_mask, eps, D, ACC)
    tl.store(dz_ptr + row[:, None] * D + dcol[None, :], dz.to(dz_ptr.dtype.element_ty), mask=io_mask)
    tl.debug_barrier()  # dz is read back below, by other threads of the program
    dx = tl.zeros([BLOCK_T, DP], ACC)
    w_m = w_ptr + m * (D * 3 * D)
    for head in range(H):
        s, e, denom, mx, same = _attention_probabilities(x_ptr, w_ptr, add_ptr, row, seq, tok, ok, m, head,
                                                     sm_scale * _LOG2E, D, H, N, BLOCK_T, CHUNK, HAS_ADD, ACC,
                                                     PRECISION)
        p = e / denom[:, None]
        dp = tl.zeros([BLOCK_T, BLOCK_T], ACC)
        for c0 in range(0, HEAD_DIM, CHUNK):
            c = c0 + tl.arange(0, CHUNK)
            c_ok = c < HEAD_DIM
            v = _operand(x_ptr, w_ptr, add_ptr, row, tok, ok, m, 2 * D + head * HEAD_DIM + c, c_ok, D, N, BLOCK_T,
                         CHUNK, HAS_ADD, ACC, PRECISION)
            do = _rows_times(dz_ptr, row, ok, wo_ptr + m * (D * D), head * HEAD_DIM + c, c_ok, D, 1, D, BLOCK_T,
                             CHUNK, ACC, PRECISION).to(v.dtype)  # dz·W_oᵀ
            dp += tl.dot(do, tl.trans(v), input_precision=PRECISION, out_dtype=ACC)
        ds = (p * (dp - tl.sum(p * dp, 1)[:, None])).to(x_ptr.dtype.element_ty)
        p = p.to(x_ptr.dtype.element_ty)
        for c0 in range(0, HEAD_DIM, CHUNK):
            c = c0 + tl.arange(0, CHUNK)
            c_ok = c < HEAD_DIM
            col = head * HEAD_DIM + c
            q = _operand(x_ptr, w_ptr, add_ptr, row, tok, ok, m, col, c_ok, D, N, BLOCK_T, CHUNK, HAS_ADD, ACC,
                         PRECISION)
            k = _operand(x_ptr, w_ptr, add_ptr, row, tok, ok, m, D + col, c_ok, D, N, BLOCK_T, CHUNK, HAS_ADD, ACC,
                         PRECISION)
            do = _rows_times(dz_ptr, row, ok, wo_ptr + m * (D * D), col, c_ok, D, 1, D, BLOCK_T, CHUNK, ACC,
                             PRECISION).to(q.dtype)
            dq = tl.dot(ds, k, input_precision=PRECISION, out_dtype=ACC) * sm_scale
            dk = tl.dot(tl.trans(ds), q, input_precision=PRECISION, out_dtype=ACC) * sm_scale
            dv = tl.dot(tl.trans(p), do, input_precision=PRECISION, out_dtype=ACC)
            out = dqkv_ptr + row[:, None] * (3 * D) + col[None, :]
            mask = ok[:, None] & c_ok[None, :]
            tl.store(out, dq.to(dqkv_ptr.dtype.element_ty), mask=mask)
            tl.store(out + D, dk.to(dqkv_ptr.dtype.element_ty), mask=mask)
            tl.store(out + 2 * D, dv.to(dqkv_ptr.dtype.element_ty), mask=mask)
            # dx += [dq dk dv]·W_qkv[:, (col, D + col, 2D + col)]ᵀ
            w_t = w_m + dcol[None, :] * (3 * D) + col[:, None]
            w_mask = c_ok[:, None] & d_ok[None, :]
            dx += tl.dot(dq.to(q.dtype), tl.load(w_t, mask=w_mask, other=0.0).to(q.dtype), input_precision=PRECISION,
                         out_dtype=ACC)
            dx += tl.dot(dk.to(q.dtype), tl.load(w_t + D, mask=w_mask, other=0.0).to(q.dtype),
                         input_precision=PRECISION, out_dtype=ACC)
            dx += tl.dot(dv.to(q.dtype), tl.load(w_t + 2 * D, mask=w_mask, other=0.0).to(q.dtype),
                         input_precision=PRECISION, out_dtype=ACC)
    dx += tl.load(dz_ptr + row[:, None] * D + dcol[None, :], mask=io_mask, other=0.0).to(ACC)  # the residual
    tl.store(dx_ptr + row[:, None] * D + dcol[None, :], dx.to(dx_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _mlp_hidden(x_ptr, w1_ptr, b1_ptr, row, ok, m, f, f_ok, D: tl.constexpr, F: tl.constexpr,
                BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HIDDEN_CHUNK: tl.constexpr, ACC: tl.constexpr,
                PRECISION: tl.constexpr):
    """a1 = x W_1 + b_1 for hidden units f: [BLOCK_T, HIDDEN_CHUNK]."""
    a1 = _rows_times(x_ptr, row, ok, w1_ptr + m * (D * F), f, f_ok, D, F, 1, BLOCK_T, HIDDEN_CHUNK, ACC, PRECISION)
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
        g1 = _gelu(_mlp_hidden(x_ptr, w1_ptr, b1_ptr, row, ok, m, f, f_ok, D, F, BLOCK_T, CHUNK, HIDDEN_CHUNK, ACC,
                               PRECISION)).to(x_ptr.dtype.element_ty)
        w2 = tl.load(w2_ptr + m * (F * D) + f[:, None] * D + dcol[None, :], mask=f_ok[:, None] & d_ok[None, :],
                     other=0.0)
        acc += tl.dot(g1, w2.to(g1.dtype), input_precision=PRECISION, out_dtype=ACC)
    a2 = acc + tl.load(b2_ptr + m * D + dcol, mask=d_ok, other=0.0).to(ACC)[None, :]
    z = _gelu(a2) + tl.load(x_ptr + row[:, None] * D + dcol[None, :], mask=io_mask, other=0.0).to(ACC)
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
    _store_layer_norm(z, lnw_ptr, lnb_ptr, y_ptr, row, m, dcol, d_ok, io_mask, eps, D, ACC)


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
    dz = _layer_norm_backward(z, dy_ptr, lnw_ptr, part_ptr, row, m, tile, num_tiles, dcol, d_ok, io_mask, eps, D, ACC)
    da2 = (dz * _gelu_grad(a2)).to(x_ptr.dtype.element_ty)
    tl.store(da2_ptr + row[:, None] * D + dcol[None, :], da2, mask=io_mask)
    _store_part(part_ptr, 2, da2.to(ACC), m, tile, num_tiles, dcol, d_ok, D)  # d b_2
    tl.debug_barrier()  # d a2 is read back below, by other threads of the program
    dx = dz  # the residual's share
    for f0 in range(0, F, HIDDEN_CHUNK):
        f = f0 + tl.arange(0, HIDDEN_CHUNK)
        f_ok = f < F
        a1 = _mlp_hidden(x_ptr, w1_ptr, b1_ptr, row, ok, m, f, f_ok, D, F, BLOCK_T, CHUNK, HIDDEN_CHUNK, ACC,
                         PRECISION)
        dg1 = _rows_times(da2_ptr, row, ok, w2_ptr + m * (F * D), f, f_ok, D, 1, D, BLOCK_T, HIDDEN_CHUNK, ACC,
                          PRECISION)  # d a2·W_2ᵀ
        da1 = (dg1 * _gelu_grad(a1)).to(da2.dtype)
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
        dg1 = _rows_times(da2_ptr, row, ok, w2_ptr + m * (F * D), f, f_ok, D, 1, D, BLOCK_T, HIDDEN_CHUNK, ACC,
                          PRECISION)  # d a2·W_2ᵀ, 0 in the invalid rows
        da1 = (dg1 * _gelu_grad(a1)).to(x_ptr.dtype.element_ty)
        g1 = tl.where(ok[:, None], _gelu(a1), 0.0).to(x_ptr.dtype.element_ty)  # invalid rows: a1 = b1, not 0
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


@triton.jit(do_not_specialize=["R"])
def _weight_grad_kernel(
    a_ptr, add_ptr, g_ptr, s_ptr, dw_ptr, col_sum_ptr, tok_sum_ptr, R, N: tl.constexpr, K: tl.constexpr,
    G_COLS: tl.constexpr, NP: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HAS_ADD: tl.constexpr,
    TOK_SUM: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    # Kernel A's weight gradients, one [CHUNK, CHUNK] block of dW per program, summed over one model's R rows in
    # order (deterministic): dW[k, c] = Σ_rows (a + add[token])[k]·g[c] for a [.., K] (x, or o), add [M, N, K] (the
    # PE: x + pe is the projection's input, never stored), g [.., G_COLS] (dqkv, or dz). The programs of the first
    # k-block also give Σ_rows g[c] (a bias gradient) and, with TOK_SUM, Σ over the batch of s[token, c] (s = dx:
    # the PE's gradient).
    block, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
    K_BLOCKS: tl.constexpr = (K + CHUNK - 1) // CHUNK
    k = (block % K_BLOCKS) * CHUNK + tl.arange(0, CHUNK)
    c = (block // K_BLOCKS) * CHUNK + tl.arange(0, CHUNK)
    k_ok, c_ok = k < K, c < G_COLS
    first = block % K_BLOCKS == 0
    n = tl.arange(0, NP)
    dw = tl.zeros([CHUNK, CHUNK], ACC)
    col_sum = tl.zeros([CHUNK], ACC)
    tok_sum = tl.zeros([NP, CHUNK], ACC)
    r0 = 0
    while r0 < R:  # not range(0, R, ...): the interpreter (triton 3.6, numpy 2) fails on a runtime range bound
        r = r0 + tl.arange(0, BLOCK_T)
        r0 += BLOCK_T
        ok = r < R
        row = m * R + r
        tok = r % N
        g = tl.load(g_ptr + row[:, None] * G_COLS + c[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0)
        a = tl.load(a_ptr + row[:, None] * K + k[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        if HAS_ADD:
            a = (a.to(ACC) + tl.load(add_ptr + (m * N + tok)[:, None] * K + k[None, :],
                                     mask=ok[:, None] & k_ok[None, :], other=0.0).to(ACC)).to(g.dtype)
        dw += tl.dot(tl.trans(a.to(g.dtype)), g, input_precision=PRECISION, out_dtype=ACC)
        if first:
            col_sum += tl.sum(g.to(ACC), 0)
            if TOK_SUM:
                sv = tl.load(s_ptr + row[:, None] * G_COLS + c[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0)
                one_hot = ((n[:, None] == tok[None, :]) & ok[None, :]).to(sv.dtype)  # [NP, BLOCK_T]
                tok_sum += tl.dot(one_hot, sv, input_precision=PRECISION, out_dtype=ACC)
    tl.store(dw_ptr + m * (K * G_COLS) + k[:, None] * G_COLS + c[None, :], dw.to(dw_ptr.dtype.element_ty),
             mask=k_ok[:, None] & c_ok[None, :])
    if first:
        tl.store(col_sum_ptr + m * G_COLS + c, col_sum.to(col_sum_ptr.dtype.element_ty), mask=c_ok)
        if TOK_SUM:
            tl.store(tok_sum_ptr + (m * N + n)[:, None] * G_COLS + c[None, :], tok_sum.to(tok_sum_ptr.dtype.element_ty),
                     mask=(n < N)[:, None] & c_ok[None, :])


# ---- launchers, behind custom ops (fake implementations: shapes only, for the ledger and torch.compile) ----

def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _attention_tiles(B: int, N: int, cfg: FusedConfig) -> int:
    return triton.cdiv(B, cfg.block_t // N)


def _attention_constants(x: Tensor, pe: Tensor | None, addend: Tensor | None, num_heads: int) -> dict:
    N, D = x.shape[2:]
    cfg = attention_config(D // num_heads)
    return dict(N=N, D=D, DP=triton.next_power_of_2(D), H=num_heads, BLOCK_T=cfg.block_t, CHUNK=cfg.chunk,
                HAS_PE=pe is not None, HAS_ADD=addend is not None, ACC=_acc(x.dtype),
                PRECISION=triton_attention.dot_precision(x.dtype), num_warps=cfg.warps, num_stages=1)


@torch.library.custom_op("pe_fast::fused_attention_sublayer", mutates_args=())
def attention_sublayer_forward(x: Tensor, pe: Tensor | None, addend: Tensor | None, w_qkv: Tensor, w_o: Tensor,
                               b_o: Tensor, ln_w: Tensor, ln_b: Tensor, probes: Tensor | None, num_heads: int,
                               eps: float) -> tuple[Tensor, Tensor]:
    """Kernel A's forward: (y [M,B,N,D], stats [M,H,3+K] float32)."""
    M, B, N, D = x.shape
    H, K = num_heads, 0 if probes is None else probes.shape[0]
    tiles = _attention_tiles(B, N, attention_config(D // H))
    y = torch.empty_like(x)
    rows = x.new_empty(M, H, 3 + K, B, N, dtype=_accumulation(x.dtype))
    probes = rows if K == 0 else triton_attention.kernel_probes(probes, x.device)  # rows: never read
    _attention_sublayer_fwd_kernel[(tiles, M)](
        x, x if pe is None else pe, x if addend is None else addend, w_qkv, w_o, b_o, ln_w, ln_b, probes, y, rows, B,
        tiles, LOG2E / math.sqrt(D // H), eps, NUM_PROBES=K, **_attention_constants(x, pe, addend, H))
    return y, rows.view(M, H, 3 + K, B * N).mean(-1).float()


@attention_sublayer_forward.register_fake
def _(x, pe, addend, w_qkv, w_o, b_o, ln_w, ln_b, probes, num_heads, eps):
    M = x.shape[0]
    K = 0 if probes is None else probes.shape[0]
    return torch.empty_like(x), x.new_empty(M, num_heads, 3 + K, dtype=torch.float32)


@torch.library.custom_op("pe_fast::fused_attention_sublayer_backward", mutates_args=())
def attention_sublayer_backward(dy: Tensor, x: Tensor, pe: Tensor | None, addend: Tensor | None, w_qkv: Tensor,
                                w_o: Tensor, b_o: Tensor, ln_w: Tensor, num_heads: int,
                                eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Kernel A's backward: (dx [M,B,N,D], dz [M,B,N,D], o [M,B,N,D], dqkv [M,B,N,3D], partial sums
    [2,M,tiles,D] of dγ and dβ)."""
    M, B, N, D = x.shape
    H = num_heads
    tiles = _attention_tiles(B, N, attention_config(D // H))
    dx, dz, o = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    dqkv = x.new_empty(M, B, N, 3 * D)
    parts = x.new_empty(2, M, tiles, D, dtype=_accumulation(x.dtype))
    _attention_sublayer_bwd_kernel[(tiles, M)](
        dy.contiguous(), x, x if pe is None else pe, x if addend is None else addend, w_qkv, w_o, b_o, ln_w, dx, dz,
        o, dqkv, parts, B, tiles, 1.0 / math.sqrt(D // H), eps, **_attention_constants(x, pe, addend, H))
    return dx, dz, o, dqkv, parts


@attention_sublayer_backward.register_fake
def _(dy, x, pe, addend, w_qkv, w_o, b_o, ln_w, num_heads, eps):
    M, B, N, D = x.shape
    tiles = _attention_tiles(B, N, attention_config(D // num_heads))
    return (torch.empty_like(x), torch.empty_like(x), torch.empty_like(x), x.new_empty(M, B, N, 3 * D),
            x.new_empty(2, M, tiles, D, dtype=_accumulation(x.dtype)))


@torch.library.custom_op("pe_fast::fused_attention_weight_gradients", mutates_args=())
def attention_weight_gradients(x: Tensor, pe: Tensor | None, dqkv: Tensor, o: Tensor, dz: Tensor,
                               dx: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Kernel A's weight gradients, two launches of `_weight_grad_kernel`: (dW_qkv [M,D,3D], d b_qkv [M,3D],
    dW_o [M,D,D], d b_o [M,D], dpe [M,N,D], empty without a PE), in the accumulation dtype."""
    M, B, N, D = x.shape
    R, acc, chunk = B * N, _accumulation(x.dtype), WEIGHT_GRAD.chunk
    dw_qkv, db_qkv = x.new_empty(M, D, 3 * D, dtype=acc), x.new_empty(M, 3 * D, dtype=acc)
    dw_o, db_o = x.new_empty(M, D, D, dtype=acc), x.new_empty(M, D, dtype=acc)
    dpe = x.new_empty(M, N, D, dtype=acc) if pe is not None else x.new_empty(0, dtype=acc)
    common = dict(N=N, K=D, NP=max(16, triton.next_power_of_2(N)), BLOCK_T=WEIGHT_GRAD.block_t, CHUNK=chunk,
                  ACC=_acc(x.dtype), PRECISION=triton_attention.dot_precision(x.dtype), num_warps=WEIGHT_GRAD.warps,
                  num_stages=1)
    k_blocks = triton.cdiv(D, chunk)
    _weight_grad_kernel[(k_blocks * triton.cdiv(3 * D, chunk), M)](
        x, x if pe is None else pe, dqkv, dqkv, dw_qkv, db_qkv, db_qkv, R, G_COLS=3 * D, HAS_ADD=pe is not None,
        TOK_SUM=False, **common)
    _weight_grad_kernel[(k_blocks * triton.cdiv(D, chunk), M)](
        o, o, dz, dx, dw_o, db_o, dpe, R, G_COLS=D, HAS_ADD=False, TOK_SUM=pe is not None, **common)
    return dw_qkv, db_qkv, dw_o, db_o, dpe


@attention_weight_gradients.register_fake
def _(x, pe, dqkv, o, dz, dx):
    M, B, N, D = x.shape
    acc = _accumulation(x.dtype)
    return (x.new_empty(M, D, 3 * D, dtype=acc), x.new_empty(M, 3 * D, dtype=acc), x.new_empty(M, D, D, dtype=acc),
            x.new_empty(M, D, dtype=acc),
            x.new_empty(M, N, D, dtype=acc) if pe is not None else x.new_empty(0, dtype=acc))


def _mlp_tiles(x: Tensor) -> int:
    return triton.cdiv(x[0].numel() // x.shape[-1], mlp_config().block_t)


def _mlp_constants(x: Tensor, w1: Tensor) -> dict:
    D, F = w1.shape[1:]
    cfg = mlp_config()
    return dict(D=D, F=F, DP=triton.next_power_of_2(D), BLOCK_T=cfg.block_t, CHUNK=cfg.chunk,
                HIDDEN_CHUNK=cfg.chunk, ACC=_acc(x.dtype), PRECISION=triton_attention.dot_precision(x.dtype),
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
    parts = x.new_empty(3, M, tiles, D, dtype=_accumulation(x.dtype))
    _mlp_sublayer_bwd_kernel[(tiles, M)](dy.contiguous(), x, w1, b1, w2, b2, ln_w, dx, da2, parts, R, tiles, eps,
                                         **_mlp_constants(x, w1))
    return dx, da2, parts


@mlp_sublayer_backward.register_fake
def _(dy, x, w1, b1, w2, b2, ln_w, eps):
    M, D = x.shape[0], x.shape[-1]
    return torch.empty_like(x), torch.empty_like(x), x.new_empty(3, M, _mlp_tiles(x), D, dtype=_accumulation(x.dtype))


@torch.library.custom_op("pe_fast::fused_mlp_weight_gradients", mutates_args=())
def mlp_weight_gradients(x: Tensor, da2: Tensor, w1: Tensor, b1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dW_1 [M,D,F], dW_2 [M,F,D], d b_1 [M,F]) in the accumulation dtype, GELU(a1) and d a1 recomputed."""
    M, R, (D, F) = x.shape[0], x[0].numel() // x.shape[-1], w1.shape[1:]
    acc = _accumulation(x.dtype)
    dw1, dw2, db1 = x.new_empty(M, D, F, dtype=acc), x.new_empty(M, F, D, dtype=acc), x.new_empty(M, F, dtype=acc)
    constants = _mlp_constants(x, w1)
    _mlp_weight_grad_kernel[(triton.cdiv(F, constants["HIDDEN_CHUNK"]), M)](x, da2, w1, b1, w2, dw1, dw2, db1, R,
                                                                            **constants)
    return dw1, dw2, db1


@mlp_weight_gradients.register_fake
def _(x, da2, w1, b1, w2):
    M, (D, F), acc = x.shape[0], w1.shape[1:], _accumulation(x.dtype)
    return x.new_empty(M, D, F, dtype=acc), x.new_empty(M, F, D, dtype=acc), x.new_empty(M, F, dtype=acc)


# ---- the kernels' HBM traffic, for the byte ledger ----

def sublayer_traffic(kernel: str, *, M: int, B: int, N: int, D: int, H: int = 1, F: int = 0, K: int = 0,
                     act: int = 4, param: int = 4, probe: int = 1, pe: bool = True,
                     addend: bool = True) -> tuple[int, int, float]:
    """(bytes read, bytes written, FLOPs) of one call of `kernel` (attention_fwd, attention_bwd,
    attention_wgrad, mlp_fwd, mlp_bwd, mlp_wgrad) over a pack, counted from the kernels' code: every tensor a
    program loads, once (the weights and the PE's addend once per launch: every tile of a model re-reads them, from
    L2), every tensor it stores, once; dz and d a2, read back by the program that wrote them, from L2, and the
    activations the weight-gradient kernels' programs of one model all read, from L2 after the first. act, param,
    probe: bytes per activation, parameter and probe element. The attention forward's statistics rows [M,H,S,B,N]
    (in the accumulation dtype) are written by the kernel and read once by the mean over (B, N) after it. FLOPs:
    the dots the programs run, with their padding rows and recomputations (2 per multiply-add), at the true width:
    the [rows, width] products padded to a power of two (160 -> 256) run up to 60 % more."""
    acc = 8 if act == 8 else 4
    rows = M * B * N * D * act  # one activation tensor [M,B,N,D]
    pe_bytes = M * N * D * param if pe else 0
    addend_bytes = M * N * 3 * D * param if addend else 0
    if kernel.startswith("attention"):
        cfg = attention_config(D // H)
        executed = M * _attention_tiles(B, N, cfg) * cfg.block_t
        parts = 2 * M * _attention_tiles(B, N, cfg) * D * acc
        weights = M * (3 * D * D + D * D + 2 * D) * param  # W_qkv, W_o, b_o, γ
        if kernel == "attention_fwd":
            stat_rows = M * H * (3 + K) * B * N * acc
            read = rows + pe_bytes + addend_bytes + weights + M * D * param + K * N * N * probe + stat_rows
            written = rows + stat_rows + M * H * (3 + K) * 4
            return read, written, executed * (8 * D * D + 4 * cfg.block_t * D)
        if kernel == "attention_bwd":
            read = 2 * rows + pe_bytes + addend_bytes + weights  # dy, x
            written = 3 * rows + 3 * rows + parts  # dx, dz, o, dqkv
            return read, written, executed * (28 * D * D + 14 * cfg.block_t * D)
        if kernel == "attention_wgrad":  # two launches of _weight_grad_kernel
            chunk = WEIGHT_GRAD.chunk
            rows_run = M * _padded(B * N, WEIGHT_GRAD.block_t)
            read = 6 * rows + (rows + pe_bytes if pe else 0)  # x, dqkv (3), o, dz; with a PE, dx and pe
            written = M * (4 * D * D + 4 * D + (N * D if pe else 0)) * acc  # dW_qkv, d b_qkv, dW_o, d b_o, dpe
            flops = 2 * _padded(D, chunk) * (_padded(3 * D, chunk) + _padded(D, chunk))
            if pe:  # the per-token sums of dx: a one-hot [16, rows] dot per column block
                flops += 2 * max(16, triton.next_power_of_2(N)) * _padded(D, chunk)
            return read, written, rows_run * flops
    cfg = mlp_config()
    tiles = -(-(B * N) // cfg.block_t)
    executed = M * tiles * cfg.block_t
    weights = M * (2 * D * F + F + 2 * D) * param  # W_1, W_2, b_1, b_2, γ
    if kernel == "mlp_fwd":
        return rows + weights + M * D * param, rows, executed * 4 * D * F
    if kernel == "mlp_bwd":
        return 2 * rows + weights, 2 * rows + M * tiles * 3 * D * acc, executed * 10 * D * F
    if kernel == "mlp_wgrad":  # every hidden chunk's program runs over all rows: x and d a2 from L2 after the first
        padded_f = -(-F // cfg.chunk) * cfg.chunk
        return 2 * rows + M * (2 * D * F + F) * param, M * (2 * D * F + F) * acc, executed * 8 * D * padded_f
    raise ValueError(f"unknown fused kernel {kernel!r}")


def op_traffic(func, args) -> tuple[str, int, int, float] | None:
    """(name, bytes read, bytes written, FLOPs) of a call of one of the fused sublayer ops (a torch OpOverload and
    its arguments, as a dispatch mode sees them), from `sublayer_traffic`; None for any other op."""
    kernel = _OP_KERNELS.get(func.overloadpacket)
    if kernel is None:
        return None
    names = [a.name for a in func._schema.arguments]
    a = dict(zip(names, args))
    x = a["x"]
    M, B, N, D = x.shape if x.dim() == 4 else (x.shape[0], 1, x[0].numel() // x.shape[-1], x.shape[-1])
    param = next((a[k].element_size() for k in ("w_qkv", "w1", "pe") if a.get(k) is not None), 4)  # parameters
    probes = a.get("probes")
    counts = sublayer_traffic(
        kernel, M=M, B=B, N=N, D=D, H=a.get("num_heads", 1), F=a["w1"].shape[-1] if "w1" in a else 0,
        K=0 if probes is None else probes.shape[0], act=x.element_size(), param=param,
        probe=1 if probes is None else 4 if probes.dtype == torch.float64 else probes.element_size(),  # kernel_probes
        pe=a.get("pe") is not None, addend=a.get("addend") is not None)
    return f"pe_fast::fused {kernel}", *counts


_OP_KERNELS = {attention_sublayer_forward._opoverload.overloadpacket: "attention_fwd",
               attention_sublayer_backward._opoverload.overloadpacket: "attention_bwd",
               mlp_sublayer_forward._opoverload.overloadpacket: "mlp_fwd",
               mlp_sublayer_backward._opoverload.overloadpacket: "mlp_bwd",
               mlp_weight_gradients._opoverload.overloadpacket: "mlp_wgrad",
               attention_weight_gradients._opoverload.overloadpacket: "attention_wgrad"}


# ---- autograd ----

def _to(grads, params):
    return tuple(None if g is None else g.to(p.dtype) for g, p in zip(grads, params))


class AttentionSublayer(torch.autograd.Function):
    """LN0(Attn(x + pe) W_o + b_o + x + pe) -> (y, stats)."""

    @staticmethod
    def forward(ctx, x, pe, w_qkv, b_qkv, w_o, b_o, ln_w, ln_b, probes, num_heads, eps):
        addend = projection.token_addend(pe, w_qkv, b_qkv, x.shape[2])  # pe·W + b [M,N,3D], once per model
        y, stats = attention_sublayer_forward(x, pe, addend, w_qkv, w_o, b_o, ln_w, ln_b, probes, num_heads, eps)
        ctx.mark_non_differentiable(stats)
        ctx.save_for_backward(x, pe, w_qkv, b_qkv, w_o, b_o, ln_w, ln_b)
        ctx.num_heads, ctx.eps = num_heads, eps
        return y, stats

    @staticmethod
    def backward(ctx, dy, _dstats):
        x, pe, w_qkv, b_qkv, w_o, b_o, ln_w, ln_b = ctx.saved_tensors
        addend = projection.token_addend(pe, w_qkv, b_qkv, x.shape[2])
        dx, dz, o, dqkv, parts = attention_sublayer_backward(dy, x, pe, addend, w_qkv, w_o, b_o, ln_w,
                                                             ctx.num_heads, ctx.eps)
        dw_qkv, db_qkv, dw_o, db_o, dpe = attention_weight_gradients(x, pe, dqkv, o, dz, dx)
        dln_w, dln_b = parts.sum(2)
        dpe = dpe.to(pe.dtype) if pe is not None else None
        db_qkv = db_qkv if b_qkv is not None else None
        return (dx, dpe, *_to((dw_qkv, db_qkv, dw_o, db_o, dln_w, dln_b), (w_qkv, b_qkv, w_o, b_o, ln_w, ln_b)),
                None, None, None)


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
        return (dx, *_to(grads, (w1, b1, w2, b2, ln_w, ln_b)), None)


# ---- the block's switch ----

def _dtype_refusal(x: Tensor) -> str | None:
    if x.shape[-1] > MAX_WIDTH:
        return f"width {x.shape[-1]} > {MAX_WIDTH}"
    if autocast_on(x.device):
        low = torch.get_autocast_dtype(x.device.type)
        return None if low == torch.bfloat16 else f"autocast {low} is not fused"
    if x.dtype not in (torch.float32, torch.float64):
        return f"the fused kernels take float32 (float64 in the interpreter), not {x.dtype}"
    return None


def attention_refusal(x: Tensor, rope, bias, pe_dropout_mask) -> str | None:
    """Why this block call's attention sublayer cannot take kernel A (it runs unfused), or None."""
    if rope is not None:
        return "RoPE is not fused (q and k are turned outside the kernels)"
    if bias is not None:
        return "a relative-position bias is not fused"
    if pe_dropout_mask is not None:
        return "PE dropout is not fused"
    if x.shape[2] > FUSED_MAX_N:
        return f"N = {x.shape[2]} > {FUSED_MAX_N}: a sequence does not fit kernel A's tile"
    return _dtype_refusal(x)


def mlp_refusal(x: Tensor) -> str | None:
    """Why kernel B cannot take this MLP sublayer (it runs unfused), or None: any N, sequences play no part."""
    return _dtype_refusal(x)


@functools.cache
def warn_unfused(sublayer: str, reason: str) -> None:
    log.warning("backend 'fused' runs the %s sublayer unfused: %s", sublayer, reason)


def takes_attention(h: Tensor, rope, bias, pe_dropout_mask) -> bool:
    reason = attention_refusal(h, rope, bias, pe_dropout_mask)
    if reason is not None:
        warn_unfused("attention", reason)  # once per reason; the attention op itself runs as "triton"
    return reason is None


def takes_mlp(h: Tensor) -> bool:
    reason = mlp_refusal(h)
    if reason is not None:
        warn_unfused("MLP", reason)
    return reason is None


def _activations(h: Tensor) -> Tensor:
    """h in the autocast dtype where autocast is on (the parameters and the PE's addend stay float32)."""
    return h.to(torch.get_autocast_dtype(h.device.type)) if autocast_on(h.device) else h


def attention_forward(h: Tensor, pe: Tensor | None, probes: Tensor | None, only_token: int | None, w_qkv: Tensor,
                      b_qkv: Tensor | None, w_o: Tensor, b_o: Tensor, ln_w: Tensor, ln_b: Tensor, num_heads: int,
                      eps: float):
    """A Post-LN block's attention sublayer through kernel A: (LN0(Attn(h + pe) W_o + b_o + h + pe), stats), at
    only_token alone if given."""
    probes = None if probes is None else probes.to(h.device)
    h, stats = AttentionSublayer.apply(_activations(h), pe, w_qkv, b_qkv, w_o, b_o, ln_w, ln_b, probes, num_heads,
                                       eps)
    if only_token is not None:
        h = h[:, :, only_token:only_token + 1].contiguous()
    return h, stats


def mlp_forward(h: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, ln_w: Tensor, ln_b: Tensor,
                eps: float) -> Tensor:
    """A Post-LN block's MLP sublayer through kernel B: LN1(GELU(GELU(h W_1 + b_1) W_2 + b_2) + h)."""
    return MLPSublayer.apply(_activations(h), w1, b1, w2, b2, ln_w, ln_b, eps)
