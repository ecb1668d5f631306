"""PEAttention: the fused op as an nn.Module, for use in other people's models."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pe_fast.ops import pe_attention


class PEAttention(nn.Module):
    """Multi-head self-attention of a pack of `num_models` models, with an optional PE added to the input.

    Holds the QKV projection (Xavier-uniform weights, zero biases, as nn.MultiheadAttention) and, unless
    `out_proj=False`, an output projection. forward(x [M,B,N,D], pe [M,N,D] | None, probes [K,N,N] | None)
    returns (y [M,B,N,D], stats [M,H,3+K]); see `pe_fast.ops.pe_attention` for the statistics.
    """

    def __init__(self, width: int, num_heads: int, num_models: int = 1, bias: bool = True, out_proj: bool = True,
                 backend: str | None = None):
        super().__init__()
        if width % num_heads:
            raise ValueError(f"width {width} is not divisible by num_heads {num_heads}")
        bound = math.sqrt(6.0 / (4 * width))  # Xavier-uniform for a [width, 3·width] matrix
        self.w_qkv = nn.Parameter(torch.empty(num_models, width, 3 * width).uniform_(-bound, bound))
        self.b_qkv = nn.Parameter(torch.zeros(num_models, 3 * width)) if bias else None
        if out_proj:
            self.w_out = nn.Parameter(torch.empty(num_models, width, width).uniform_(-1 / math.sqrt(width),
                                                                                    1 / math.sqrt(width)))
            self.b_out = nn.Parameter(torch.zeros(num_models, width))
        else:
            self.w_out = self.b_out = None
        self.num_heads, self.backend = num_heads, backend

    def forward(self, x: Tensor, pe: Tensor | None = None, probes: Tensor | None = None) -> tuple[Tensor, Tensor]:
        out, stats = pe_attention(x, pe, self.w_qkv, self.b_qkv, self.num_heads, probes, backend=self.backend)
        if self.w_out is not None:
            M, B, N, D = out.shape
            out = torch.baddbmm(self.b_out[:, None], out.reshape(M, B * N, D), self.w_out).reshape(M, B, N, D)
        return out, stats
