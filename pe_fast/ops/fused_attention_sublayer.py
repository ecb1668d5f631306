"""The attention sublayer of backend "fused", one Triton kernel forward and one backward, for N ≤ FUSED_MAX_N (the
LST task's N = 16):

    h = LN0(((x + pe) W_qkv + b_qkv → attention) W_o + b_o + x + pe)     (with the statistics and probes)

A program owns a tile of BLOCK_T rows holding BLOCK_T // N whole sequences of one model, so the attention never
leaves the tile; q, k, v are computed chunk by chunk from x (plus the PE's addend pe·W + b, computed once per
model as in projection.py), the [tile, tile] scores are masked to "same sequence", and each head's output goes
straight into the output projection's accumulator, then + b_o + residual (+ PE) → layer norm. Only x is read and
h written; the q, k, v and attention tensors stay on chip. The backward recomputes the forward and writes dx, dz
(the pre-norm gradient), o (the attention output, for dW_o) and dqkv (for dW_qkv); a third kernel gives the weight
gradients from them.

Kernel → launcher (a custom op with its fake) → autograd Function → `attention_forward`, which the block calls
with its tensors. Refused (the sublayer runs unfused, with backend "triton"'s op): RoPE, a relative-position bias,
PE dropout, N > FUSED_MAX_N and what fused_common.py refuses (`attention_refusal`).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from pe_fast.ops import projection, triton_attention
from pe_fast.ops.fused_common import (FUSED_MAX_N, LOG2E, _LN2, _LOG2E, FusedConfig, accumulation, activations,
                                     dtype_refusal, grads_to, layer_norm_backward, rows_times, store_layer_norm,
                                     tl_accumulation, warn_unfused)

def attention_config(head_dim: int) -> FusedConfig:
    """Kernel A: 16 rows (one LST sequence) and 8 warps. The IEEE fp32 dots run on the CUDA cores, whose operand
    layouts replicate rows across threads: 32 rows spilled ~450 bytes per thread at width 160 (sm_90), 16 do
    not (tests/test_fused_sublayers.py compiles every configuration and counts the spills)."""
    return FusedConfig(block_t=16, chunk=min(32, max(16, triton.next_power_of_2(head_dim))), warps=8)


# Kernel A's weight gradients: [32, 32] blocks of dW per program, 16 rows a step
WEIGHT_GRAD = FusedConfig(block_t=16, chunk=32, warps=4)


def attention_tiles(B: int, N: int, cfg: FusedConfig) -> int:
    """Kernel A's programs per model: each tile holds block_t // N whole sequences."""
    return triton.cdiv(B, cfg.block_t // N)


@triton.jit
def _sequence_rows(tile, B, N: tl.constexpr, BLOCK_T: tl.constexpr):
    """Kernel A's rows of tile `tile` of a model: (sequence, token, valid), BLOCK_T // N whole sequences end to
    end; rows past the last whole sequence (N need not divide BLOCK_T) and past the batch are invalid."""
    r = tl.arange(0, BLOCK_T)
    group = BLOCK_T // N
    seq = tile * group + r // N
    return seq, r % N, (r < group * N) & (seq < B)


@triton.jit
def _project(x_ptr, w_ptr, add_ptr, row, tok, ok, m, col, col_ok, D: tl.constexpr, W_COLS: tl.constexpr,
             N: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, HAS_ADD: tl.constexpr, ACC: tl.constexpr,
             PRECISION: tl.constexpr):
    """x[rows] @ W[m][:, col] (+ addend[m, tok, col] with HAS_ADD): [BLOCK_T, CHUNK] in ACC (x's chunks come
    from L1/L2 again for every output chunk; HBM reads x once)."""
    acc = rows_times(x_ptr, row, ok, w_ptr + m * (D * W_COLS), col, col_ok, D, W_COLS, 1, BLOCK_T, CHUNK, ACC,
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
    store_layer_norm(z, lnw_ptr, lnb_ptr, y_ptr, row, m, dcol, d_ok, io_mask, eps, D, ACC)


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
    dz = layer_norm_backward(z, dy_ptr, lnw_ptr, part_ptr, row, m, tile, num_tiles, dcol, d_ok, io_mask, eps, D, ACC)
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
            do = rows_times(dz_ptr, row, ok, wo_ptr + m * (D * D), head * HEAD_DIM + c, c_ok, D, 1, D, BLOCK_T,
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
            do = rows_times(dz_ptr, row, ok, wo_ptr + m * (D * D), col, c_ok, D, 1, D, BLOCK_T, CHUNK, ACC,
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


def _attention_constants(x: Tensor, pe: Tensor | None, addend: Tensor | None, num_heads: int) -> dict:
    N, D = x.shape[2:]
    cfg = attention_config(D // num_heads)
    return dict(N=N, D=D, DP=triton.next_power_of_2(D), H=num_heads, BLOCK_T=cfg.block_t, CHUNK=cfg.chunk,
                HAS_PE=pe is not None, HAS_ADD=addend is not None, ACC=tl_accumulation(x.dtype),
                PRECISION=triton_attention.dot_precision(x.dtype), num_warps=cfg.warps, num_stages=1)


@torch.library.custom_op("pe_fast::fused_attention_sublayer", mutates_args=())
def attention_sublayer_forward(x: Tensor, pe: Tensor | None, addend: Tensor | None, w_qkv: Tensor, w_o: Tensor,
                               b_o: Tensor, ln_w: Tensor, ln_b: Tensor, probes: Tensor | None, num_heads: int,
                               eps: float) -> tuple[Tensor, Tensor]:
    """Kernel A's forward: (y [M,B,N,D], stats [M,H,3+K] float32)."""
    M, B, N, D = x.shape
    H, K = num_heads, 0 if probes is None else probes.shape[0]
    tiles = attention_tiles(B, N, attention_config(D // H))
    y = torch.empty_like(x)
    rows = x.new_empty(M, H, 3 + K, B, N, dtype=accumulation(x.dtype))
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
    tiles = attention_tiles(B, N, attention_config(D // H))
    dx, dz, o = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    dqkv = x.new_empty(M, B, N, 3 * D)
    parts = x.new_empty(2, M, tiles, D, dtype=accumulation(x.dtype))
    _attention_sublayer_bwd_kernel[(tiles, M)](
        dy.contiguous(), x, x if pe is None else pe, x if addend is None else addend, w_qkv, w_o, b_o, ln_w, dx, dz,
        o, dqkv, parts, B, tiles, 1.0 / math.sqrt(D // H), eps, **_attention_constants(x, pe, addend, H))
    return dx, dz, o, dqkv, parts


@attention_sublayer_backward.register_fake
def _(dy, x, pe, addend, w_qkv, w_o, b_o, ln_w, num_heads, eps):
    M, B, N, D = x.shape
    tiles = attention_tiles(B, N, attention_config(D // num_heads))
    return (torch.empty_like(x), torch.empty_like(x), torch.empty_like(x), x.new_empty(M, B, N, 3 * D),
            x.new_empty(2, M, tiles, D, dtype=accumulation(x.dtype)))


@torch.library.custom_op("pe_fast::fused_attention_weight_gradients", mutates_args=())
def attention_weight_gradients(x: Tensor, pe: Tensor | None, dqkv: Tensor, o: Tensor, dz: Tensor,
                               dx: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Kernel A's weight gradients, two launches of `_weight_grad_kernel`: (dW_qkv [M,D,3D], d b_qkv [M,3D],
    dW_o [M,D,D], d b_o [M,D], dpe [M,N,D], empty without a PE), in the accumulation dtype."""
    M, B, N, D = x.shape
    R, acc, chunk = B * N, accumulation(x.dtype), WEIGHT_GRAD.chunk
    dw_qkv, db_qkv = x.new_empty(M, D, 3 * D, dtype=acc), x.new_empty(M, 3 * D, dtype=acc)
    dw_o, db_o = x.new_empty(M, D, D, dtype=acc), x.new_empty(M, D, dtype=acc)
    dpe = x.new_empty(M, N, D, dtype=acc) if pe is not None else x.new_empty(0, dtype=acc)
    common = dict(N=N, K=D, NP=max(16, triton.next_power_of_2(N)), BLOCK_T=WEIGHT_GRAD.block_t, CHUNK=chunk,
                  ACC=tl_accumulation(x.dtype), PRECISION=triton_attention.dot_precision(x.dtype), num_warps=WEIGHT_GRAD.warps,
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
    acc = accumulation(x.dtype)
    return (x.new_empty(M, D, 3 * D, dtype=acc), x.new_empty(M, 3 * D, dtype=acc), x.new_empty(M, D, D, dtype=acc),
            x.new_empty(M, D, dtype=acc),
            x.new_empty(M, N, D, dtype=acc) if pe is not None else x.new_empty(0, dtype=acc))


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
        return (dx, dpe, *grads_to((dw_qkv, db_qkv, dw_o, db_o, dln_w, dln_b), (w_qkv, b_qkv, w_o, b_o, ln_w, ln_b)),
                None, None, None)


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
    return dtype_refusal(x)


def takes_attention(h: Tensor, rope, bias, pe_dropout_mask) -> bool:
    reason = attention_refusal(h, rope, bias, pe_dropout_mask)
    if reason is not None:
        warn_unfused("attention", reason)  # once per reason; the attention op itself runs as "triton"
    return reason is None


def attention_forward(h: Tensor, pe: Tensor | None, probes: Tensor | None, only_token: int | None, w_qkv: Tensor,
                      b_qkv: Tensor | None, w_o: Tensor, b_o: Tensor, ln_w: Tensor, ln_b: Tensor, num_heads: int,
                      eps: float):
    """A Post-LN block's attention sublayer through kernel A: (LN0(Attn(h + pe) W_o + b_o + h + pe), stats), at
    only_token alone if given."""
    probes = None if probes is None else probes.to(h.device)
    h, stats = AttentionSublayer.apply(activations(h), pe, w_qkv, b_qkv, w_o, b_o, ln_w, ln_b, probes, num_heads,
                                       eps)
    if only_token is not None:
        h = h[:, :, only_token:only_token + 1].contiguous()
    return h, stats
