"""Plain-PyTorch reference of the fused PE-attention op: the oracle every kernel is tested against.

Shapes (M models, B batch, N tokens, D model width, H heads, dh = D / H, K probes):
    x [M,B,N,D], pe [M,N,D] | None, w_qkv [M,D,3D], b_qkv [M,3D] | None, probes [K,N,N] | None,
    rope_cos / rope_sin [N, dh/2] | None (rotate q and k pairwise), bias [M,H,N,N] | None (added to the logits).
Forward returns out [M,B,N,D], stats [M,H,3+K], and what the backward needs: qkv [M,B,N,3D] and the
log-sum-exp of every attention row [M,B,H,N] (flash-attention style: the N×N map is recomputed, not saved).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

STAT_NAMES = ("entropy", "max_prob", "sum_p2")


def projection_input(x: Tensor, pe: Tensor | None, dtype: torch.dtype) -> Tensor:
    """x + pe [M,B,N,D] (x alone without a PE) in `dtype`, the parameters'."""
    h = x.to(dtype)
    return h if pe is None else h + pe[:, None]


def project_qkv(x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None) -> Tensor:
    """(x + pe) @ w_qkv + b_qkv for every model at once, as one batched matmul, in x's dtype.

    Mixed precision (x in bf16, the parameters in float32: the op under autocast) computes it in the parameters'
    dtype and rounds once to x's, so the PE reaches q, k, v unrounded (projection.py says why)."""
    M, B, N, D = x.shape
    h = projection_input(x, pe, w_qkv.dtype).reshape(M, B * N, D)
    qkv = torch.bmm(h, w_qkv) if b_qkv is None else torch.baddbmm(b_qkv[:, None, :], h, w_qkv)
    return qkv.reshape(M, B, N, 3 * D).to(x.dtype)


def split_heads(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """[M,B,N,3D] -> three [M,B,H,N,dh] views."""
    M, B, N, D3 = qkv.shape
    dh = D3 // (3 * num_heads)
    q, k, v = qkv.reshape(M, B, N, 3, num_heads, dh).permute(3, 0, 1, 4, 2, 5).unbind(0)
    return q, k, v


def rotate(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding: rotate the pairs (t[2i], t[2i+1]) by the angle whose cos/sin are given per token. In t's
    dtype: under autocast t is 16-bit and the tables float32, and q and k turned float32 would not meet v."""
    even, odd = t[..., 0::2], t[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(t.dtype)


def unrotate(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The transpose of `rotate` (a rotation by the opposite angle): carries gradients back through RoPE."""
    return rotate(t, cos, -sin)


def turn_qk(qkv: Tensor, num_heads: int, cos: Tensor, sin: Tensor, turn) -> Tensor:
    """qkv [M,B,N,3D] with q and k turned by `turn` (rotate; unrotate for gradients), in qkv's layout: for
    kernels that take the packed projection and apply RoPE outside."""
    q, k, v = split_heads(qkv, num_heads)  # [M,B,H,N,dh]
    turned = torch.stack((turn(q, cos, sin), turn(k, cos, sin), v), dim=2)
    return turned.permute(0, 1, 4, 2, 3, 5).reshape(qkv.shape)  # [M,B,3,H,N,dh] -> [M,B,N,3,H,dh]


def accumulation_dtype(t: Tensor) -> torch.dtype:
    """Softmax normalisers are kept in float32 at least (float64 stays float64)."""
    return torch.promote_types(t.dtype, torch.float32)


def attention_logits(q: Tensor, k: Tensor, bias: Tensor | None) -> Tensor:
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q * scale, k.transpose(-1, -2))  # scaled first: q·k may pass float's range where q·k/√dh does not
    if bias is not None:
        s = s + bias[:, None]
    return s


def attention_statistics(p: Tensor, log_p: Tensor, probes: Tensor | None) -> Tensor:
    """Mean over batch and query rows of the per-row statistics. p, log_p [M,B,H,N,N] -> [M,H,3+K] float32."""
    p32, log_p32 = p.to(accumulation_dtype(p)), log_p.to(accumulation_dtype(p))
    rows = [
        # entropy; log_p is −inf where finite logits differ by more than float's range, and p there 0
        -torch.where(p32 > 0, p32 * log_p32, 0).sum(-1),
        p32.amax(-1),
        (p32 * p32).sum(-1),
    ]
    if probes is not None:
        rows.extend(torch.einsum("mbhij,kij->kmbhi", p32, probes.to(p32.dtype)).unbind(0))
    return torch.stack(rows, dim=-1).mean(dim=(1, 3)).float()


def attention_map(x, pe, w_qkv, b_qkv, num_heads, rope_cos=None, rope_sin=None, bias=None):
    """(log p [M,B,H,N,N], its logsumexp, v, qkv): the attention probabilities that the fused kernels never
    materialise, for analyses that need the map itself."""
    qkv = project_qkv(x, pe, w_qkv, b_qkv)
    q, k, v = split_heads(qkv, num_heads)
    if rope_cos is not None:
        q, k = rotate(q, rope_cos, rope_sin), rotate(k, rope_cos, rope_sin)
    s = attention_logits(q, k, bias)
    log_p, lse = log_softmax_and_lse(s)
    return log_p, lse, v, qkv


def log_softmax_and_lse(s: Tensor) -> tuple[Tensor, Tensor]:
    """(log p in s's dtype, the rows' logsumexp in the accumulation dtype), log p taken as (s − max) − log Σ
    exp(s − max): s − lse rounds lse's log Σ away where every logit of a row shares a large offset (a bias of
    −1e9 masking a whole row, logits near 1e8, bf16 logits near 100), and the row's p no longer sums to 1."""
    wide = s.to(accumulation_dtype(s))
    largest = wide.amax(-1, keepdim=True)
    shifted = wide - largest
    log_sum = shifted.exp().sum(-1, keepdim=True).log()
    return (shifted - log_sum).to(s.dtype), (largest + log_sum).squeeze(-1)


def forward(x, pe, w_qkv, b_qkv, num_heads, probes=None, rope_cos=None, rope_sin=None, bias=None):
    log_p, lse, v, qkv = attention_map(x, pe, w_qkv, b_qkv, num_heads, rope_cos, rope_sin, bias)
    p = log_p.exp()
    o = torch.matmul(p, v)  # [M,B,H,N,dh]
    M, B, H, N, dh = o.shape
    out = o.permute(0, 1, 3, 2, 4).reshape(M, B, N, H * dh)
    stats = attention_statistics(p, log_p, probes)
    return out, stats, qkv, lse


def backward(grad_out, x, pe, w_qkv, b_qkv, qkv, lse, num_heads, rope_cos=None, rope_sin=None, bias=None, out=None):
    """Gradients of `forward`'s out w.r.t. x, pe, w_qkv, b_qkv, bias (statistics are not differentiated).
    `out`, the forward's output, is part of every backend's signature (flash-style kernels need it for
    Δ = rowsum(dO·O)); the reference recomputes the attention map and does not use it."""
    M, B, N, D = x.shape
    q, k, v = split_heads(qkv, num_heads)
    if rope_cos is not None:
        q, k = rotate(q, rope_cos, rope_sin), rotate(k, rope_cos, rope_sin)
    s = attention_logits(q, k, bias)
    p = log_softmax_and_lse(s)[0].exp().to(s.dtype)  # from s, not lse (log_softmax_and_lse says why)
    dh = q.shape[-1]
    do = grad_out.reshape(M, B, N, num_heads, dh).transpose(2, 3)  # [M,B,H,N,dh]
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, v.transpose(-1, -2))
    # dp shifted by its value at the row's largest p: at a saturated row (p one-hot) p·(dp − Σ p·dp) cancels to
    # nothing at that entry, while Σ p·(dp − dp at the largest) keeps the small terms it is made of
    dp.sub_(dp.gather(-1, s.argmax(-1, keepdim=True)))  # in place: dp is this backward's own, as is ds below
    ds = dp.sub_((dp * p).sum(-1, keepdim=True)).mul_(p)
    dbias = ds.sum(1) if bias is not None else None
    scale = 1.0 / math.sqrt(dh)
    dq = torch.matmul(ds, k) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale
    if rope_cos is not None:
        dq, dk = unrotate(dq, rope_cos, rope_sin), unrotate(dk, rope_cos, rope_sin)
    dqkv = torch.stack((dq, dk, dv), dim=0).permute(1, 2, 4, 0, 3, 5).reshape(M, B, N, 3 * D)
    return (*project_qkv_backward(dqkv, x, pe, w_qkv, b_qkv), dbias)


def project_qkv_backward(dqkv: Tensor, x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None):
    """Gradients of `project_qkv` given dqkv [M,B,N,3D]: (dx, dpe, dw_qkv, db_qkv), each in its input's dtype
    (computed in the parameters')."""
    M, B, N, D = x.shape
    dqkv = dqkv.reshape(M, B * N, 3 * D).to(w_qkv.dtype)
    h = projection_input(x, pe, w_qkv.dtype)
    dw = torch.bmm(h.reshape(M, B * N, D).transpose(1, 2), dqkv)
    dx = torch.bmm(dqkv, w_qkv.transpose(1, 2)).reshape(M, B, N, D)
    db = dqkv.sum(1) if b_qkv is not None else None
    dpe = dx.sum(1) if pe is not None else None
    return dx.to(x.dtype), dpe, dw, db
