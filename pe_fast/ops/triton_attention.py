"""The "triton" backend of `pe_attention`: Triton kernels for CUDA tensors, with their launchers.

Forward: x @ w stays one batched torch GEMM, and pe @ w + b a small one per model (projection.py); then ONE
attention kernel covers every model, batch element and head of the pack. The long kernel runs an online
softmax in base 2 (exp2, logits scaled by log2 e) and keeps the statistics as extra running sums, rescaled
like the softmax normaliser l = Σ e (the packed one holds whole rows: the same sums, in one go):
    entropy  = ln2 · (lse2 − Σ e·s / l)     max prob = 1 / l   (the running max is the row max)
    Σ p²     = Σ e² / l²  (rescaled by α²)   probe k  = Σ e·T_k / l
Each query row's statistics go to a [M, H, S, B, N] float32 buffer that torch averages over (B, N):
deterministic, and small next to the q/k/v traffic. The N×N map never leaves the chip.

Two kernel pairs, picked by `kernel_config`:
* packed (N ≤ 32): a program owns tile // N whole (model, batch, head) problems laid end to end (N need not be a
  power of two); the tile's scores are one block-diagonal matmul, masked to "same problem", summed over chunks
  of the head dim (32 columns), so registers hold [tile, chunk] operands and never a whole padded head. The
  kernels add the addend to q, k, v as they load them: no pass over the activations for x + pe or the bias.
* long: a program owns BLOCK_M query rows of one problem and loops over key blocks, the head dim whole (padded
  to a power of two); the grid is flat, with a problem's row blocks next to each other (they share K/V in L2).

Backward (flash-attention 2, P recomputed from the saved lse). Packed: one kernel, no preprocess: the tile
holds whole rows, so Δ = Σ_j p·dp, and dq, dk, dv come out of one pass (scores and dP over the chunks first,
then dq, dk, dv chunk by chunk). Long: a preprocess kernel Δ = rowsum(dO·O), then one kernel whose programs
compute dk, dv of their key block (loop over query blocks) and dq of their query block (loop over key blocks):
no atomics, deterministic. These launches are an op of their own (pe_fast::triton_attention_backward, with a
vmap rule) so that autograd tracing sees an op, not kernels. The parameter gradients are then torch GEMMs
(projection.py).

fp32 matmuls run in IEEE fp32 (matches the reference to ~1e-6); PE_FAST_TF32=1 switches them to TF32 tensor
cores, with every operand rounded to TF32 first (`_tc`: the tensor cores would truncate it, which biases the
averaged statistics). bf16 inputs use bf16 tensor-core matmuls with fp32 accumulation; softmax and statistics are fp32.
RoPE turns q and k with torch before the kernel (and the gradients after). A relative-position bias, other
dtypes and head dims > 256 run the reference instead (one logged warning per reason).
N, H and D are compile-time constants (one compilation per model shape; batch sizes share it). Block sizes
come from one deterministic heuristic (`kernel_config`; no autotuning, which needs a GPU at first call);
`all_kernel_configs` lists what it can pick, for the ahead-of-time compile test.
"""
from __future__ import annotations

import dataclasses
import logging
import math

import torch
import triton
import triton.language as tl

from pe_fast.ops import projection
from pe_fast.ops.backends import Backend, register_backend, tf32_dots
from pe_fast.ops.transforms import fold_into_model_axis, is_traced

log = logging.getLogger("pe_fast")

PACK_MAX_N = 32  # sequences up to this length are packed several to a tile
MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634


@triton.jit
def _tc(x, PRECISION: tl.constexpr):
    """A tl.dot operand as the tensor cores will read it. TF32: rounded to nearest (ties away), because the
    MMA instructions read an fp32 register as TF32 by dropping its 13 low bits, which truncates toward zero:
    every product shrinks by ~1e-3 on average, a bias that the averaged statistics do not average away
    (cuBLAS, the reference's TF32 path, rounds). Integer bit arithmetic, so the interpreter runs it too."""
    if PRECISION == "tf32":
        bits = x.to(tl.int32, bitcast=True)
        x = ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True)
    return x


@triton.jit
def _load_operand(qkv_ptr, add_ptr, mb, tok, column, B, mask, N: tl.constexpr, D: tl.constexpr,
                  HAS_ADDEND: tl.constexpr):
    """q, k or v (column = the operand's first column in a token's 3D: head offset, + D for k, + 2D for v):
    x·W from qkv [M,B,N,3D] plus, with HAS_ADDEND, the token's pe·W + b from add [M,N,3D] (projection.py),
    summed in fp32 and rounded once to the operand's dtype. mb = m·B + b (int64) and tok broadcast with column."""
    t = tl.load(qkv_ptr + (mb * N + tok) * (3 * D) + column, mask=mask, other=0.0)
    if HAS_ADDEND:
        a = tl.load(add_ptr + ((mb // B) * N + tok) * (3 * D) + column, mask=mask, other=0.0)
        t = (t.to(tl.float32) + a.to(tl.float32)).to(t.dtype)
    return t


@triton.jit
def _packed_rows(pid, num_problems, N: tl.constexpr, BLOCK: tl.constexpr):
    """The BLOCK rows program pid owns in the packed kernels, as (problem, token, valid) per row: BLOCK // N
    whole problems laid end to end (row t is token t % N of problem t // N). A "problem" is one (model, batch,
    head): prob = (m·B + b)·H + h, the row order of lse [M,B,H,N]."""
    t = tl.arange(0, BLOCK)
    group = BLOCK // N
    prob = pid * group + t // N
    return prob, t % N, (t < group * N) & (prob < num_problems)


@triton.jit
def _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, column, start, B, N: tl.constexpr, D: tl.constexpr,
                  HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr, HAS_ADDEND: tl.constexpr, PRECISION: tl.constexpr):
    """Head-dim columns start … start + CHUNK of q, k or v (column: the operand's first column, as in
    `_load_operand`) for the tile's rows, [BLOCK, CHUNK], rounded for tl.dot."""
    c = start + tl.arange(0, CHUNK)
    mask = ok[:, None] & (c < HEAD_DIM)[None, :]
    return _tc(_load_operand(qkv_ptr, add_ptr, mb[:, None], tok[:, None], column[:, None] + c[None, :], B, mask, N,
                             D, HAS_ADDEND), PRECISION)


@triton.jit(do_not_specialize=["num_problems", "B"])
def _packed_fwd_kernel(
    qkv_ptr, add_ptr, probe_ptr, out_ptr, lse_ptr, stat_ptr, num_problems, B, qk_scale,
    N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, NUM_PROBES: tl.constexpr, BLOCK: tl.constexpr,
    CHUNK: tl.constexpr, PRECISION: tl.constexpr, HAS_ADDEND: tl.constexpr,
):
    # The tile's scores are one block-diagonal [BLOCK, BLOCK] matmul (keys = the tile's own rows), summed over
    # head-dim chunks: registers hold [BLOCK, CHUNK] operand tiles, never a whole padded head.
    HEAD_DIM: tl.constexpr = D // H
    pid = tl.program_id(0)
    prob, tok, ok = _packed_rows(pid, num_problems, N, BLOCK)
    mb = (prob // H).to(tl.int64)  # m·B + b
    head = prob % H
    column = head * HEAD_DIM
    s = tl.zeros([BLOCK, BLOCK], tl.float32)
    for start in range(0, HEAD_DIM, CHUNK):
        q = _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, column, start, B, N, D, HEAD_DIM, CHUNK, HAS_ADDEND,
                          PRECISION)
        k = _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, D + column, start, B, N, D, HEAD_DIM, CHUNK, HAS_ADDEND,
                          PRECISION)
        s += tl.dot(q, tl.trans(k), input_precision=PRECISION)
    s = s * qk_scale  # finite (masked loads are 0)
    valid = ok[None, :] & (prob[:, None] == prob[None, :])  # implies the query row is valid
    s_valid = tl.where(valid, s, float("-inf"))
    m = tl.maximum(tl.max(s_valid, 1), -1.0e30)  # padding rows (no valid key) stay free of inf − inf = NaN
    e = tl.exp2(s_valid - m[:, None])  # masked keys contribute exactly 0
    l = tl.where(ok, tl.sum(e, 1), 1.0)
    for start in range(0, HEAD_DIM, CHUNK):
        v = _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, 2 * D + column, start, B, N, D, HEAD_DIM, CHUNK, HAS_ADDEND,
                          PRECISION)
        o = tl.dot(_tc(e, PRECISION).to(v.dtype), v, input_precision=PRECISION) / l[:, None]
        c = start + tl.arange(0, CHUNK)
        tl.store(out_ptr + ((mb * N + tok) * D + column)[:, None] + c[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=ok[:, None] & (c < HEAD_DIM)[None, :])
    lse2 = m + tl.log2(l)
    ln2 = 0.6931471805599453
    tl.store(lse_ptr + prob.to(tl.int64) * N + tok, lse2 * ln2, mask=ok)
    # statistics buffer [M, H, S, B, N], as the long kernel writes it
    plane = B * N
    stat_row = ((mb // B) * H + head) * ((3 + NUM_PROBES) * plane) + (mb % B) * N + tok
    tl.store(stat_ptr + stat_row, ln2 * (lse2 - tl.sum(e * s, 1) / l), mask=ok)  # s: 0·(−inf) would be NaN
    tl.store(stat_ptr + stat_row + plane, 1.0 / l, mask=ok)
    tl.store(stat_ptr + stat_row + 2 * plane, tl.sum(e * e, 1) / (l * l), mask=ok)
    for k in tl.static_range(NUM_PROBES):
        probe = tl.load(probe_ptr + k * N * N + tok[:, None] * N + tok[None, :], mask=valid, other=0).to(tl.float32)
        tl.store(stat_ptr + stat_row + (3 + k) * plane, tl.sum(e * probe, 1) / l, mask=ok)


@triton.jit(do_not_specialize=["num_problems", "B"])
def _packed_bwd_kernel(
    qkv_ptr, add_ptr, do_ptr, lse_ptr, dqkv_ptr, num_problems, B, sm_scale,
    N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
    PRECISION: tl.constexpr, HAS_ADDEND: tl.constexpr,
):
    # The tile holds whole rows, so one pass gives dq, dk, dv and Δ = Σ_j p·dp (no preprocess). First the
    # [BLOCK, BLOCK] scores and dP = dO·Vᵀ, summed over head-dim chunks; then each chunk of dq, dk, dv. The chunk
    # loops stay loops (range, not static_range): unrolled, the compiler kept the first pass's chunks live for
    # the second and spilled (tests/test_triton_compile.py checks the spills).
    HEAD_DIM: tl.constexpr = D // H
    pid = tl.program_id(0)
    prob, tok, ok = _packed_rows(pid, num_problems, N, BLOCK)
    mb = (prob // H).to(tl.int64)
    column = (prob % H) * HEAD_DIM
    o_row = (mb * N + tok) * D + column
    s = tl.zeros([BLOCK, BLOCK], tl.float32)
    dp = tl.zeros([BLOCK, BLOCK], tl.float32)
    for start in range(0, HEAD_DIM, CHUNK):
        q = _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, column, start, B, N, D, HEAD_DIM, CHUNK, HAS_ADDEND,
                          PRECISION)
        k = _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, D + column, start, B, N, D, HEAD_DIM, CHUNK, HAS_ADDEND,
                          PRECISION)
        v = _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, 2 * D + column, start, B, N, D, HEAD_DIM, CHUNK, HAS_ADDEND,
                          PRECISION)
        c = start + tl.arange(0, CHUNK)
        do = _tc(tl.load(do_ptr + o_row[:, None] + c[None, :], mask=ok[:, None] & (c < HEAD_DIM)[None, :], other=0.0),
                 PRECISION)
        s += tl.dot(q, tl.trans(k), input_precision=PRECISION)
        dp += tl.dot(do, tl.trans(v), input_precision=PRECISION)
    lse2 = tl.load(lse_ptr + prob.to(tl.int64) * N + tok, mask=ok, other=0.0) * 1.4426950408889634
    valid = ok[None, :] & (prob[:, None] == prob[None, :])
    p = tl.exp2(tl.where(valid, s * (sm_scale * 1.4426950408889634) - lse2[:, None], float("-inf")))
    ds = p * (dp - tl.sum(p * dp, 1)[:, None])
    p = _tc(p, PRECISION)
    ds = _tc(ds, PRECISION)
    for start in range(0, HEAD_DIM, CHUNK):
        q = _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, column, start, B, N, D, HEAD_DIM, CHUNK, HAS_ADDEND,
                          PRECISION)
        k = _packed_chunk(qkv_ptr, add_ptr, mb, tok, ok, D + column, start, B, N, D, HEAD_DIM, CHUNK, HAS_ADDEND,
                          PRECISION)
        c = start + tl.arange(0, CHUNK)
        mask = ok[:, None] & (c < HEAD_DIM)[None, :]
        do = _tc(tl.load(do_ptr + o_row[:, None] + c[None, :], mask=mask, other=0.0), PRECISION)
        dq = tl.dot(ds.to(k.dtype), k, input_precision=PRECISION) * sm_scale
        dk = tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION) * sm_scale
        dv = tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
        dq_ptr = dqkv_ptr + ((mb * N + tok) * (3 * D) + column)[:, None] + c[None, :]
        tl.store(dq_ptr, dq.to(dqkv_ptr.dtype.element_ty), mask=mask)
        tl.store(dq_ptr + D, dk.to(dqkv_ptr.dtype.element_ty), mask=mask)
        tl.store(dq_ptr + 2 * D, dv.to(dqkv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _long_rows(pid, N: tl.constexpr, BLOCK: tl.constexpr):
    """The long kernels' rows of program pid, as (problem, token, valid): BLOCK consecutive tokens of problem
    pid // cdiv(N, BLOCK), the grid holding a problem's row blocks next to each other (they share K/V in L2)."""
    blocks = tl.cdiv(N, BLOCK)
    tok = (pid % blocks) * BLOCK + tl.arange(0, BLOCK)
    return pid // blocks, tok, tok < N


@triton.jit(do_not_specialize=["B"])
def _long_fwd_kernel(
    qkv_ptr, probe_ptr, out_ptr, lse_ptr, stat_ptr, B, qk_scale,
    N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, NUM_PROBES: tl.constexpr, PROBE_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    # N, H, D are compile-time: cheap index arithmetic, and loop bounds the interpreter can iterate.
    pid = tl.program_id(0)
    head_dim = D // H
    prob, tok_q, q_ok = _long_rows(pid, N, BLOCK_M)
    mb = (prob // H).to(tl.int64)  # m·B + b
    head_col = (prob % H) * head_dim
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < head_dim
    q = _tc(_load_operand(qkv_ptr, qkv_ptr, mb, tok_q[:, None], head_col + d[None, :], B,
                          q_ok[:, None] & d_ok[None, :], N, D, False), PRECISION)

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    es_i = tl.zeros([BLOCK_M], tl.float32)  # Σ e·s   (entropy)
    e2_i = tl.zeros([BLOCK_M], tl.float32)  # Σ e²    (Σ p²)
    mass = tl.zeros([BLOCK_M, PROBE_PAD], tl.float32)  # Σ e·T_k (probe k in column k)
    probe_col = tl.arange(0, PROBE_PAD)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    for start in range(0, N, BLOCK_N):
        tok_k = start + tl.arange(0, BLOCK_N)
        k_ok = tok_k < N
        valid = k_ok[None, :] & q_ok[:, None]
        kt = _load_operand(qkv_ptr, qkv_ptr, mb, tok_k[None, :], D + head_col + d[:, None], B,
                           k_ok[None, :] & d_ok[:, None], N, D, False)
        v = _load_operand(qkv_ptr, qkv_ptr, mb, tok_k[:, None], 2 * D + head_col + d[None, :], B,
                          k_ok[:, None] & d_ok[None, :], N, D, False)

        s = tl.dot(q, _tc(kt, PRECISION), input_precision=PRECISION) * qk_scale  # finite (masked loads are 0)
        s_valid = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s_valid, 1))
        alpha = tl.exp2(m_i - m_new)
        e = tl.exp2(s_valid - m_new[:, None])  # masked keys contribute exactly 0
        l_i = l_i * alpha + tl.sum(e, 1)
        es_i = es_i * alpha + tl.sum(e * s, 1)  # s, not a −inf-masked copy: 0·(−inf) would be NaN
        e2_i = e2_i * alpha * alpha + tl.sum(e * e, 1)
        if NUM_PROBES > 0:
            tile_mass = tl.zeros([BLOCK_M, PROBE_PAD], tl.float32)
            for k in tl.static_range(NUM_PROBES):
                probe = tl.load(probe_ptr + k * N * N + tok_q[:, None] * N + tok_k[None, :], mask=valid,
                                other=0).to(tl.float32)
                tile_mass += tl.where(probe_col[None, :] == k, tl.sum(e * probe, 1)[:, None], 0.0)
            mass = mass * alpha[:, None] + tile_mass
        acc = acc * alpha[:, None] + tl.dot(_tc(e, PRECISION).to(v.dtype), _tc(v, PRECISION),
                                            input_precision=PRECISION)
        m_i = m_new

    l_i = tl.where(q_ok, l_i, 1.0)
    out_row = (mb * N + tok_q) * D + head_col
    tl.store(out_ptr + out_row[:, None] + d[None, :], (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
             mask=q_ok[:, None] & d_ok[None, :])
    lse2 = m_i + tl.log2(l_i)
    ln2 = 0.6931471805599453
    tl.store(lse_ptr + prob.to(tl.int64) * N + tok_q, lse2 * ln2, mask=q_ok)
    # statistics buffer [M, H, S, B, N]: plane s of (model, head) holds every (batch, token) row
    plane = B * N
    stat_row = ((mb // B) * H + prob % H) * ((3 + NUM_PROBES) * plane) + (mb % B) * N + tok_q
    tl.store(stat_ptr + stat_row, ln2 * (lse2 - es_i / l_i), mask=q_ok)
    tl.store(stat_ptr + stat_row + plane, 1.0 / l_i, mask=q_ok)
    tl.store(stat_ptr + stat_row + 2 * plane, e2_i / (l_i * l_i), mask=q_ok)
    if NUM_PROBES > 0:
        tl.store(stat_ptr + stat_row[:, None] + (3 + probe_col[None, :]) * plane, mass / l_i[:, None],
                 mask=q_ok[:, None] & (probe_col[None, :] < NUM_PROBES))


@triton.jit(do_not_specialize=["num_rows"])
def _pe_attention_bwd_preprocess_kernel(out_ptr, do_ptr, delta_ptr, num_rows, N: tl.constexpr, H: tl.constexpr,
                                        D: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_R: tl.constexpr):
    # Δ = rowsum(dO·O) per query row. out viewed as [M·B·N·H, dh]: row r = (mb·N + tok)·H + head.
    head_dim = D // H
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < num_rows
    d = tl.arange(0, HEAD_PAD)
    offs = r.to(tl.int64)[:, None] * head_dim + d[None, :]
    mask = r_ok[:, None] & (d[None, :] < head_dim)
    o = tl.load(out_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mb = (r // (N * H)).to(tl.int64)
    tl.store(delta_ptr + (mb * H + r % H) * N + (r // H) % N, tl.sum(o * do, 1), mask=r_ok)


@triton.jit
def _long_bwd_kernel(
    qkv_ptr, do_ptr, lse_ptr, delta_ptr, dqkv_ptr, sm_scale,
    N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Programs compute dk, dv of their key block (loop over query blocks) and dq of their query block (loop over
    # key blocks), with Δ from the preprocess kernel: no atomics, deterministic.
    pid = tl.program_id(0)
    head_dim = D // H
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < head_dim
    qk_scale = sm_scale * 1.4426950408889634  # logits in log2 units, as in the forward
    prob, tok_k, k_ok = _long_rows(pid, N, BLOCK)
    mb = (prob // H).to(tl.int64)
    head_col = (prob % H) * head_dim + d[None, :]
    row_base = prob.to(tl.int64) * N  # lse and Δ rows [M,B,H,N] of this problem
    # Part 1: dk, dv of this program's key block, looping over the query blocks that attend to it.
    kv_mask = k_ok[:, None] & d_ok[None, :]
    k = _tc(_load_operand(qkv_ptr, qkv_ptr, mb, tok_k[:, None], D + head_col, 1, kv_mask, N, D, False), PRECISION)
    v = _tc(_load_operand(qkv_ptr, qkv_ptr, mb, tok_k[:, None], 2 * D + head_col, 1, kv_mask, N, D, False),
            PRECISION)
    dk = tl.zeros([BLOCK, HEAD_PAD], tl.float32)
    dv = tl.zeros([BLOCK, HEAD_PAD], tl.float32)
    for start in range(0, N, BLOCK):
        tok_q = start + tl.arange(0, BLOCK)
        q_ok = tok_q < N
        q_mask = q_ok[:, None] & d_ok[None, :]
        q = _tc(_load_operand(qkv_ptr, qkv_ptr, mb, tok_q[:, None], head_col, 1, q_mask, N, D, False), PRECISION)
        do = _tc(tl.load(do_ptr + (mb * N + tok_q[:, None]) * D + head_col, mask=q_mask, other=0.0), PRECISION)
        lse2 = tl.load(lse_ptr + row_base + tok_q, mask=q_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_ptr + row_base + tok_q, mask=q_ok, other=0.0)
        # transposed tiles [keys, queries]
        st = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale
        pt = tl.exp2(tl.where(k_ok[:, None] & q_ok[None, :], st - lse2[None, :], float("-inf")))
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dst = _tc(pt * (dpt - delta[None, :]), PRECISION)
        dv += tl.dot(_tc(pt, PRECISION).to(do.dtype), do, input_precision=PRECISION)
        dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
    dk_ptr = dqkv_ptr + (mb * N + tok_k[:, None]) * (3 * D) + D + head_col
    tl.store(dk_ptr, (dk * sm_scale).to(dqkv_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dk_ptr + D, dv.to(dqkv_ptr.dtype.element_ty), mask=kv_mask)

    # Part 2: dq of the query block with the same index, looping over all key blocks.
    tok_q = tok_k
    q_ok = k_ok
    q_mask = kv_mask
    q = _tc(_load_operand(qkv_ptr, qkv_ptr, mb, tok_q[:, None], head_col, 1, q_mask, N, D, False), PRECISION)
    do = _tc(tl.load(do_ptr + (mb * N + tok_q[:, None]) * D + head_col, mask=q_mask, other=0.0), PRECISION)
    lse2 = tl.load(lse_ptr + row_base + tok_q, mask=q_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + row_base + tok_q, mask=q_ok, other=0.0)
    dq = tl.zeros([BLOCK, HEAD_PAD], tl.float32)
    for start in range(0, N, BLOCK):
        tok_k = start + tl.arange(0, BLOCK)
        k_ok = tok_k < N
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = _tc(_load_operand(qkv_ptr, qkv_ptr, mb, tok_k[:, None], D + head_col, 1, kv_mask, N, D, False),
                PRECISION)
        v = _tc(_load_operand(qkv_ptr, qkv_ptr, mb, tok_k[:, None], 2 * D + head_col, 1, kv_mask, N, D, False),
                PRECISION)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        p = tl.exp2(tl.where(q_ok[:, None] & k_ok[None, :], s - lse2[:, None], float("-inf")))
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        dq += tl.dot(_tc(p * (dp - delta[:, None]), PRECISION).to(k.dtype), k, input_precision=PRECISION)
    dq_ptr = dqkv_ptr + (mb * N + tok_q[:, None]) * (3 * D) + head_col
    tl.store(dq_ptr, (dq * sm_scale).to(dqkv_ptr.dtype.element_ty), mask=q_mask)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    dtype: torch.dtype
    packed: bool  # N ≤ PACK_MAX_N: tiles of whole problems, head dim in chunks (else the long kernels)
    chunk: int  # packed: head-dim columns per tl.dot step, a power of two ≥ 16 (the GPU's smallest inner size)
    head_pad: int  # long: the head dim padded to a power of two ≥ 16, held whole
    fwd_block_m: int  # packed: the tile (fwd_block_n the same)
    fwd_block_n: int
    fwd_warps: int
    fwd_stages: int
    bwd_block: int  # packed: the tile; long: query and key block
    bwd_warps: int
    bwd_stages: int
    pre_block: int  # long: rows per program of the Δ preprocess (0 when packed: that backward sums Δ itself)


def kernel_config(N: int, head_dim: int, dtype: torch.dtype) -> KernelConfig:
    """Tiles sized by register and shared-memory budget (tests/test_triton_compile.py checks the latter).

    Packed: tiles of 32 rows (64 for bf16 past N = 16); the [tile, tile] scores and dP stay in registers while
    the head dim streams through in chunks of 32, so the tile does not shrink with the head dim (at d 160, held
    whole and padded to 256, it did: one problem per program, 60 % padding, and spills).
    Long: a tile's row is head_pad·itemsize bytes; past 256 bytes (fp32 above 64, bf16 above 128) the tiles
    shrink. Untuned starting points, measured on the GPU by bench/op/tune_triton.py."""
    head_pad = max(16, triton.next_power_of_2(head_dim))
    if N <= PACK_MAX_N:
        # fp32 takes one problem per tile past N = 16: its IEEE dots run on the CUDA cores, where [64, 64] tiles
        # spill even at 8 warps (the TF32 ones reuse the configuration)
        tile = 32 if N <= 16 or dtype == torch.float32 else 64
        return KernelConfig(dtype, True, min(head_pad, 32), head_pad, tile, tile, 4, 1, tile, 4, 1, 0)
    row_bytes = head_pad * dtype.itemsize
    warps = 4 if head_pad <= 64 else 8
    fwd_block_m = 64 if head_pad <= 128 else 32
    fwd_block_n = 64 if row_bytes <= 256 else 32
    bwd_block = 64 if head_pad <= 32 else (32 if head_pad <= 128 else 16)
    return KernelConfig(dtype, False, head_pad, head_pad, fwd_block_m, fwd_block_n, warps, 2, bwd_block, warps, 2,
                        max(16, 4096 // head_pad))


def all_kernel_configs() -> list[KernelConfig]:
    """Every configuration `kernel_config` can return, for the supported dtypes and head dims."""
    configs = [kernel_config(N, head_pad, dtype)
               for dtype in (torch.float32, torch.bfloat16)
               for head_pad in (16, 32, 64, 128, 256)
               for N in (16, 32, PACK_MAX_N + 1)]  # stand for N ≤ 16, 16 < N ≤ 32, N > PACK_MAX_N
    return list(dict.fromkeys(configs))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 matmuls in IEEE fp32 unless PE_FAST_TF32=1 (about 1e-3 relative error, several times faster)."""
    return "tf32" if dtype == torch.float32 and tf32_dots() else "ieee"


def _reference_reason(x, num_heads, bias) -> str | None:
    """Why these inputs go to the reference instead of the kernels, or None."""
    if bias is not None:
        return "a relative-position bias is not fused into the Triton kernels"
    if x.dtype not in (torch.float32, torch.bfloat16):
        return f"the Triton kernels take float32 and bfloat16, not {x.dtype}"
    if x.shape[-1] // num_heads > MAX_HEAD_DIM:
        return f"head dim {x.shape[-1] // num_heads} > {MAX_HEAD_DIM}"
    return None


def kernel_probes(probes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The probes as the forward kernel reads them: in the dtype they came in where it holds them exactly and the
    kernel can load it (bool as uint8), else float32. Every score reads K probe values, from L2 (the probes are
    shared by all problems): at N = 360 that is ten times the q, k, v traffic in float32, so binary probes
    given as bool or uint8 cut it fourfold, bf16 ones twofold."""
    if probes.dtype == torch.bool:
        probes = probes.view(torch.uint8)
    elif probes.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.uint8):
        probes = probes.float()
    return probes.to(device).contiguous()


def forward(x, pe, w_qkv, b_qkv, num_heads, probes=None, rope_cos=None, rope_sin=None, bias=None):
    M, B, N, D = x.shape
    H, dh = num_heads, D // num_heads
    P = M * B * H
    K = 0 if probes is None else probes.shape[0]
    cfg = kernel_config(N, dh, x.dtype)
    xw, addend = projection.split_projection(x, pe, w_qkv, b_qkv)
    # The long kernels pipeline their loads through shared memory, where the addend's tiles would double it
    # (past the A100's limit at head dim 256: tests/test_triton_compile.py): torch adds it first for them
    # (one pass; at N > 32 the attention dominates).
    qkv, addend = projection.kernel_operands(xw, addend, cfg.packed, num_heads, rope_cos, rope_sin)
    out = x.new_empty(M, B, N, D)
    lse = x.new_empty(M, B, H, N, dtype=torch.float32)
    rows = x.new_empty(M, H, 3 + K, B, N, dtype=torch.float32)
    probes = lse if K == 0 else kernel_probes(probes, x.device)  # lse: never read
    qk_scale, precision = LOG2E / math.sqrt(dh), dot_precision(x.dtype)
    if cfg.packed:
        _packed_fwd_kernel[(triton.cdiv(P, cfg.fwd_block_m // N),)](
            qkv, qkv if addend is None else addend, probes, out, lse, rows, P, B, qk_scale, N=N, H=H, D=D,
            NUM_PROBES=K, BLOCK=cfg.fwd_block_m, CHUNK=cfg.chunk, PRECISION=precision,
            HAS_ADDEND=addend is not None, num_warps=cfg.fwd_warps, num_stages=cfg.fwd_stages)
    else:
        _long_fwd_kernel[(P * triton.cdiv(N, cfg.fwd_block_m),)](
            qkv, probes, out, lse, rows, B, qk_scale, N=N, H=H, D=D, NUM_PROBES=K,
            PROBE_PAD=triton.next_power_of_2(max(K, 1)), HEAD_PAD=cfg.head_pad, BLOCK_M=cfg.fwd_block_m,
            BLOCK_N=cfg.fwd_block_n, PRECISION=precision, num_warps=cfg.fwd_warps, num_stages=cfg.fwd_stages)
    # xw is what the backward needs (it recomputes the small addend)
    return out, rows.view(M, H, 3 + K, B * N).mean(-1), xw, lse


def launch_backward(qkv: torch.Tensor, addend: torch.Tensor | None, grad_out: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, num_heads: int) -> torch.Tensor:
    """dqkv [M,B,N,3D] of the attention alone, q, k, v being qkv + addend (projection.py): the kernel launches
    behind the op `attention_backward`."""
    M, B, N, D3 = qkv.shape
    H, D = num_heads, D3 // 3
    dh, P = D // num_heads, M * B * num_heads
    cfg = kernel_config(N, dh, qkv.dtype)
    grad_out = grad_out.contiguous()
    dqkv = torch.empty_like(qkv)
    sm_scale, precision = 1.0 / math.sqrt(dh), dot_precision(qkv.dtype)
    if cfg.packed:
        _packed_bwd_kernel[(triton.cdiv(P, cfg.bwd_block // N),)](
            qkv, qkv if addend is None else addend, grad_out, lse, dqkv, P, B, sm_scale, N=N, H=H, D=D,
            BLOCK=cfg.bwd_block, CHUNK=cfg.chunk, PRECISION=precision, HAS_ADDEND=addend is not None,
            num_warps=cfg.bwd_warps, num_stages=cfg.bwd_stages)
    else:
        delta = torch.empty_like(lse)
        _pe_attention_bwd_preprocess_kernel[(triton.cdiv(P * N, cfg.pre_block),)](
            out, grad_out, delta, P * N, N=N, H=H, D=D, HEAD_PAD=cfg.head_pad, BLOCK_R=cfg.pre_block, num_warps=4)
        _long_bwd_kernel[(P * triton.cdiv(N, cfg.bwd_block),)](
            qkv, grad_out, lse, delta, dqkv, sm_scale, N=N, H=H, D=D, HEAD_PAD=cfg.head_pad, BLOCK=cfg.bwd_block,
            PRECISION=precision, num_warps=cfg.bwd_warps, num_stages=cfg.bwd_stages)
    return dqkv


# An op of its own: autograd tracing (torch.compile, opcheck) runs `backward` with fake tensors, and must see this
# op instead of kernel launches. Plain eager backwards call `launch_backward` directly (pe_fast.ops.transforms.is_traced).
attention_backward = torch.library.custom_op("pe_fast::triton_attention_backward", launch_backward, mutates_args=())


@attention_backward.register_fake
def _(qkv, addend, grad_out, out, lse, num_heads):
    return torch.empty_like(qkv)


@attention_backward.register_vmap
def _(info, in_dims, qkv, addend, grad_out, out, lse, num_heads):
    # every tensor argument leads with the model axis: vmapped dims fold into it (a vmapped backward, e.g.
    # autograd.grad(is_grads_batched=True))
    return fold_into_model_axis(info, in_dims, (qkv, addend, grad_out, out, lse, num_heads), (0, 1, 2, 3, 4),
                                attention_backward)


def backward(grad_out, x, pe, w_qkv, b_qkv, qkv, lse, num_heads, rope_cos=None, rope_sin=None, bias=None, *,
             out):
    """`reference.backward`, plus the forward's output `out` (for Δ = rowsum(dO·O)); qkv is the forward's xw."""
    N, D = x.shape[2:]
    packed = kernel_config(N, D // num_heads, x.dtype).packed  # only the packed kernels add on load
    kernel_backward = attention_backward if is_traced(grad_out, qkv, out) else launch_backward
    return (*projection.backward_around(kernel_backward, packed, grad_out, x, pe, w_qkv, b_qkv, qkv, lse, out,
                                        num_heads, rope_cos, rope_sin), None)


# @triton.jit chose compiler or interpreter at import; under TRITON_INTERPRET=1 (the CPU tests) the kernels run
# in numpy on CPU tensors: correct, slow.
_DEVICES = ("cuda", "cpu") if triton.knobs.runtime.interpret else ("cuda",)
register_backend("triton", Backend(forward, backward, _DEVICES, _reference_reason))
