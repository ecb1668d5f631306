"""Layers whose parameters carry a leading model axis M: one module holds a pack of independent models.

Each model's slice is initialised from that model's own torch.Generator, so a model gets the same initial
weights whether it is trained alone or inside a pack.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def uniform_per_model(generators: Sequence[torch.Generator], shape: tuple[int, ...], bound: float) -> Tensor:
    """U(-bound, bound) of `shape` for each model, drawn from that model's generator: [M, *shape]."""
    return torch.stack([(torch.rand(shape, generator=g) * 2 - 1) * bound for g in generators])


def normal_per_model(generators: Sequence[torch.Generator], shape: tuple[int, ...], std: Sequence[float]) -> Tensor:
    return torch.stack([torch.randn(shape, generator=g) * s for g, s in zip(generators, std)])


def xavier_uniform_per_model(generators: Sequence[torch.Generator], fan_in: int, fan_out: int) -> Tensor:
    return uniform_per_model(generators, (fan_in, fan_out), math.sqrt(6.0 / (fan_in + fan_out)))


class StackedLinear(nn.Module):
    """y = x @ W_m + b_m for every model m; x [M, ..., in] -> [M, ..., out]. Initialised like nn.Linear."""

    def __init__(self, generators: Sequence[torch.Generator], d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)
        self.weight = nn.Parameter(uniform_per_model(generators, (d_in, d_out), bound))
        self.bias = nn.Parameter(uniform_per_model(generators, (d_out,), bound)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(shape[0], -1, shape[-1])
        y = torch.bmm(flat, self.weight) if self.bias is None else torch.baddbmm(self.bias[:, None], flat, self.weight)
        return y.reshape(*shape[:-1], self.weight.shape[-1])


class StackedLayerNorm(nn.Module):
    def __init__(self, num_models: int, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_models, width))
        self.bias = nn.Parameter(torch.zeros(num_models, width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        y = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        extra = (1,) * (x.dim() - 2)
        M, D = self.weight.shape
        return torch.addcmul(self.bias.view(M, *extra, D), y, self.weight.view(M, *extra, D))
