"""The QKV projection of the fused kernels, split so that the kernels add the PE and the bias as they load q, k, v.

    (x + pe) @ W + b  =  x @ W  +  (pe @ W + b)
                         xw         addend [M, N, 3D]

The addend does not depend on the batch element: M·N rows of work instead of M·B·N. Adding it on load saves
whole passes over the activations: x + pe, and the broadcast bias (baddbmm first copies it into all of
[M, B·N, 3D], then its GEMM reads that back). In the backward the batch sum of dqkv, which the bias gradient
needs anyway, is the addend's gradient: dpe, db and pe's share of dW follow from it by small GEMMs, instead
of recomputing x + pe and summing dx over the batch. The reference keeps the direct form, as the oracle.

Mixed precision (the op under autocast: x in bf16, the parameters in float32; the op's body runs with autocast
off, pe_attention.py): x @ W runs in bf16, the addend in float32, and the kernels add the two in float32 before
rounding q, k, v once. Rounded to bf16 first, a PE of σ = 2 would move in steps of 2⁻⁸–2⁻⁷ of its values
(0.4–0.8 %), about its whole drift over a training run at the paper's rate (0.8 % after 16,000 steps at lr 1e-4,
docs/reproduction-lst.md): attention would see it frozen.
"""
from __future__ import annotations

import torch
from torch import Tensor

from pe_fast.ops import reference


def token_addend(pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None, num_tokens: int) -> Tensor | None:
    """pe @ W + b [M,N,3D] in the parameters' dtype (None when there is neither pe nor b): small, so the backward
    recomputes it."""
    if pe is not None:
        return torch.bmm(pe, w_qkv) if b_qkv is None else torch.baddbmm(b_qkv[:, None, :], pe, w_qkv)
    if b_qkv is None:
        return None
    M, D3 = b_qkv.shape
    return b_qkv[:, None, :].expand(M, num_tokens, D3).contiguous()


def split_projection(x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """xw [M,B,N,3D] = x @ W in x's dtype, and `token_addend`."""
    M, B, N, D = x.shape
    xw = torch.bmm(x.reshape(M, B * N, D), w_qkv.to(x.dtype)).reshape(M, B, N, 3 * D)
    return xw, token_addend(pe, w_qkv, b_qkv, N)


def full_projection(xw: Tensor, addend: Tensor | None) -> Tensor:
    """(x + pe) @ W + b itself in xw's dtype, for the paths that transform q and k before the kernel (RoPE)."""
    return xw if addend is None else (xw + addend[:, None]).to(xw.dtype)


def kernel_operands(xw: Tensor, addend: Tensor | None, add_on_load: bool, num_heads: int,
                    rope_cos: Tensor | None, rope_sin: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """(qkv, addend) as a kernel reads them: xw and the addend apart when the kernel adds them as it loads
    q, k, v (add_on_load); else, and whenever RoPE turns q and k (it needs them whole), their sum, turned."""
    if add_on_load and rope_cos is None:
        return xw, addend
    qkv = full_projection(xw, addend)
    if rope_cos is not None:
        qkv = reference.turn_qk(qkv, num_heads, rope_cos, rope_sin, reference.rotate)
    return qkv, None


def backward_around(kernel_backward, add_on_load: bool, grad_out: Tensor, x: Tensor, pe: Tensor | None,
                    w_qkv: Tensor, b_qkv: Tensor | None, xw: Tensor, lse: Tensor, out: Tensor, num_heads: int,
                    rope_cos: Tensor | None, rope_sin: Tensor | None):
    """(dx, dpe, dw_qkv, db_qkv) of a kernel backend whose forward saved xw: recompute the small addend, hand
    the kernel its operands (`kernel_operands`), turn dq and dk back through RoPE, then the projection's own
    backward. kernel_backward(qkv, addend, grad_out, out, lse, num_heads) -> dqkv is the backend's op."""
    addend = token_addend(pe, w_qkv, b_qkv, x.shape[2])
    dqkv = kernel_backward(*kernel_operands(xw, addend, add_on_load, num_heads, rope_cos, rope_sin), grad_out, out,
                           lse, num_heads)
    if rope_cos is not None:
        dqkv = reference.turn_qk(dqkv, num_heads, rope_cos, rope_sin, reference.unrotate)
    return split_projection_backward(dqkv, x, pe, w_qkv, b_qkv)


def split_projection_backward(dqkv: Tensor, x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None):
    """(dx, dpe, dw_qkv, db_qkv) from dqkv [M,B,N,3D] (in x's dtype), the gradient of xw + addend; each in its
    input's dtype, the addend's share computed in the parameters'."""
    M, B, N, D = x.shape
    rows = dqkv.reshape(M, B * N, 3 * D)
    dx = torch.bmm(rows, w_qkv.to(rows.dtype).transpose(1, 2)).reshape(M, B, N, D)
    dw = torch.bmm(x.reshape(M, B * N, D).transpose(1, 2), rows).to(w_qkv.dtype)
    if pe is None and b_qkv is None:
        return dx, None, dw, None
    d_addend = dqkv.sum(1, dtype=w_qkv.dtype)  # [M,N,3D]
    dpe = None
    if pe is not None:
        dpe = torch.bmm(d_addend, w_qkv.transpose(1, 2))
        dw = dw.baddbmm(pe.transpose(1, 2), d_addend)  # out of place: torch.func's vmap has a rule for it
    db = d_addend.sum(1) if b_qkv is not None else None
    return dx, dpe, dw, db
