"""Layers whose parameters carry a leading model axis M: one module holds a pack of independent models.

Each model's slice is initialised from that model's own torch.Generator, so a model gets the same initial
weights whether it is trained alone or inside a pack. PEAttention is the fused op as such a layer, for pe_fast's
blocks and for other people's models.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_fast.available_memory import available_bytes
from pe_fast.ops import pe_attention
from pe_fast.ops.pe_attention import check_backend_name
from pe_fast.ops.sublayer_ends import autocasting, check_eps, fusable, linear_gelu, residual_layer_norm
from pe_fast.program_exit import brief


def uniform_per_model(generators: Sequence[torch.Generator], shape: tuple[int, ...], bound: float) -> Tensor:
    """U(-bound, bound) of `shape` for each model, drawn from that model's generator: [M, *shape]."""
    return torch.stack([(torch.rand(shape, generator=g) * 2 - 1) * bound for g in generators])


def normal_per_model(generators: Sequence[torch.Generator], shape: tuple[int, ...], std: Sequence[float]) -> Tensor:
    return torch.stack([torch.randn(shape, generator=g) * s for g, s in zip(generators, std)])


def xavier_uniform_per_model(generators: Sequence[torch.Generator], fan_in: int, fan_out: int) -> Tensor:
    return uniform_per_model(generators, (fan_in, fan_out), xavier_bound(fan_in, fan_out))


def xavier_bound(fan_in: int, fan_out: int) -> float:
    return math.sqrt(6.0 / (fan_in + fan_out))


def uniform_std(bound: float) -> float:
    """The standard deviation of U(-bound, bound)."""
    return bound / math.sqrt(3.0)


def scale_to_fan_in_power(weight: Tensor, drawn_std: float, gammas: Sequence[float | None]):
    """Rescale model m's slice of a weight [M, fan_in, fan_out], drawn with std `drawn_std`, to std fan_in^-γ_m
    (the initialisation scale of Zhang et al., arXiv 2405.05409); γ None leaves the model's slice as drawn. The
    draws themselves stay, so models of one seed differ in scale only."""
    if len(gammas) != weight.shape[0]:
        raise ValueError(f"{len(gammas)} init gammas for {weight.shape[0]} models")
    fan_in = weight.shape[1]
    with torch.no_grad():
        for m, gamma in enumerate(gammas):
            if gamma is not None:
                weight[m].mul_(fan_in ** -float(gamma) / drawn_std)


def check_sizes(**sizes):
    """Each a whole number of at least 1, or a TypeError / ValueError naming it."""
    for name, value in sizes.items():
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def check_fits(what: str, elements: int) -> None:
    """ValueError naming `what` where a float32 tensor of `elements` per-model values (drawn, then stacked: twice
    over) would not fit in the memory free now: torch's allocator fails with a RuntimeError of its own."""
    needed = 2 * 4 * elements
    if needed > (free := available_bytes()):
        raise ValueError(f"{what}: its weights need about {needed / 2**30:,.0f} GiB, more than the memory free now "
                         f"({free / 2**30:,.0f} GiB)")


def check_generators(generators):
    """One torch.Generator per model, at least one."""
    if not (isinstance(generators, Sequence) and generators
            and all(isinstance(g, torch.Generator) for g in generators)):
        raise TypeError(f"generators must be a non-empty sequence of torch.Generator, one per model, got "
                        f"{generators!r:.60}")


def check_layer_input(x, weight: Tensor) -> None:
    """x [M, ..., width] for a layer whose weight is [M, width, ...]: a tensor of that shape on the weight's device
    and (outside autocast, which casts) in its dtype, or a ValueError / TypeError naming x."""
    M, width = weight.shape[:2]
    if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[0] != M or x.shape[-1] != width:
        raise ValueError(f"x must be [M, ..., width] = [{M}, ..., {width}], got "
                         f"{list(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    if x.device != weight.device:  # a meta x gave a CPU tensor of uninitialised memory
        raise ValueError(f"x is on {x.device}, the layer's weights on {weight.device}: move one to the other")
    if x.dtype != weight.dtype and not autocasting(x.device):
        raise TypeError(f"x is {x.dtype}, the layer's weights {weight.dtype}: give x in their dtype (or run under "
                        f"torch.autocast)")


def check_switches(**switches):
    """Each a bool, or a TypeError naming it: bias="no" is a true value, and built the bias it meant to leave out."""
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {brief(value)}")


def may_overlap(t: Tensor) -> bool:
    """Whether two elements of t may share memory (an expanded tensor, an as_strided view folding on itself): its
    dimensions taken by stride, each must step past all the memory the smaller ones reach."""
    reach = 0
    for stride, size in sorted((abs(st), sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= reach or stride == 0:
            return True
        reach += stride * (size - 1)
    return False


class CheckedModule(nn.Module):
    """A module whose load_state_dict names what does not fit, in one ValueError / TypeError: torch's lists every
    mismatch over several lines (a RuntimeError), and casts a tensor of another dtype to its parameter's without a
    word (float64 weights rounded, integers made weights). DERIVED: the buffers a module computes from its
    configuration (a sinusoidal table, RoPE's angles), which a state dict must hold as they are; each module names
    its own, and a load checks those of every module inside."""

    DERIVED: tuple[str, ...] = ()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping of names to tensors, got {brief(state_dict)}")
        if (odd := next((key for key in state_dict if not isinstance(key, str)), None)) is not None:
            raise TypeError(f"state_dict's keys must be names (str), got {brief(odd)}")
        own = self.state_dict()
        buffers = {name for name, _ in self.named_buffers()}
        derived = {f"{prefix}.{name}" if prefix else name for prefix, module in self.named_modules()
                   for name in getattr(module, "DERIVED", ())}
        memory = {}  # assigned, two names on one memory tie two weights for good
        for key, value in state_dict.items():
            if key not in own:
                continue
            if not isinstance(value, Tensor):
                raise TypeError(f"state_dict[{key!r}] is {brief(value)}, not a tensor")
            if value.shape != own[key].shape:
                raise ValueError(f"state_dict[{key!r}] has shape {list(value.shape)}, this module's "
                                 f"{list(own[key].shape)}")
            if value.dtype != own[key].dtype:
                raise TypeError(f"state_dict[{key!r}] is {value.dtype}, this module's {own[key].dtype}: convert one "
                                f"to the other first")
            if value.is_meta or value.layout != torch.strided:
                raise ValueError(f"state_dict[{key!r}] is a {'meta' if value.is_meta else value.layout} tensor: load "
                                 f"a dense one with values")
            if assign:
                if value.is_inference():
                    raise ValueError(f"state_dict[{key!r}] is an inference tensor, which cannot be trained: assign a "
                                     f"copy made outside torch.inference_mode")
                # an expanded or self-overlapping tensor makes several weights one memory: the optimizer refuses it
                if may_overlap(value):
                    raise ValueError(f"state_dict[{key!r}] has elements that share memory (expanded): assign a copy "
                                     f"(.clone())")
                if value.numel() and (other := memory.setdefault(value.untyped_storage().data_ptr(), key)) != key:
                    raise ValueError(f"state_dict[{key!r}] shares memory with state_dict[{other!r}]: assign copies")
                if key in buffers and isinstance(value, nn.Parameter):  # it would become a trained weight
                    raise ValueError(f"state_dict[{key!r}] is a parameter, where this module holds a fixed buffer: "
                                     f"assign a tensor (.detach())")
            # to float rounding: sin and cos round differently on other CPUs (AVX2, AVX-512) by a unit in the last
            # place; a module built on meta has no values to compare
            if key in derived and not own[key].is_meta and not torch.allclose(
                    value.to(own[key].device).double(), own[key].double(), rtol=1e-5, atol=1e-6):
                raise ValueError(f"state_dict[{key!r}] is not this module's (computed from its configuration): a "
                                 f"state dict of another PE kind, or of other token positions")
        if strict and (missing := [key for key in own if key not in state_dict]):
            raise ValueError(f"state_dict lacks {', '.join(map(repr, missing[:3]))}"
                             f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''} of this module's tensors")
        if strict and (extra := [key for key in state_dict if key not in own]):
            raise ValueError(f"state_dict holds {', '.join(map(brief, extra[:3]))}"
                             f"{f' and {len(extra) - 3} more' if len(extra) > 3 else ''}, which this module lacks")
        return super().load_state_dict(state_dict, strict, assign)


class StackedLinear(CheckedModule):
    """y = x @ W_m + b_m for every model m; x [M, ..., in] -> [M, ..., out]. Initialised like nn.Linear."""

    def __init__(self, generators: Sequence[torch.Generator], d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        check_sizes(d_in=d_in, d_out=d_out)
        check_switches(bias=bias)
        check_generators(generators)
        check_fits(f"StackedLinear d_in={d_in:,}, d_out={d_out:,} for {len(generators)} models",
                   len(generators) * (d_in + bias) * d_out)
        bound = 1.0 / math.sqrt(d_in)
        self.weight = nn.Parameter(uniform_per_model(generators, (d_in, d_out), bound))
        self.drawn_std = uniform_std(bound)  # the weight's, for scale_to_fan_in_power
        self.bias = nn.Parameter(uniform_per_model(generators, (d_out,), bound)) if bias else None

    def forward(self, x: Tensor, *, gelu: bool = False, add_bias: bool = True) -> Tensor:
        """gelu: GELU(x @ W + b), fused on the CPU (pe_fast.ops.sublayer_ends); add_bias=False: x @ W alone, for a
        caller that adds the bias itself (folded into a later fused op)."""
        check_layer_input(x, self.weight)
        if gelu and self.bias is not None and add_bias:
            return linear_gelu(x, self.weight, self.bias)
        shape = x.shape
        flat = x.reshape(shape[0], -1, shape[-1])
        if self.bias is None or not add_bias:
            y = torch.bmm(flat, self.weight)
        else:
            y = torch.baddbmm(self.bias[:, None], flat, self.weight)
        y = y.reshape(*shape[:-1], self.weight.shape[-1])
        return F.gelu(y) if gelu else y


class StackedLayerNorm(CheckedModule):
    def __init__(self, num_models: int, width: int, eps: float = 1e-5):
        super().__init__()
        check_sizes(num_models=num_models, width=width)
        self.eps = check_eps(eps)
        self.weight = nn.Parameter(torch.ones(num_models, width))
        self.bias = nn.Parameter(torch.zeros(num_models, width))

    def forward(self, x: Tensor, residual: Tensor | None = None, add: Tensor | None = None) -> Tensor:
        """LN(x)·w + b; with a residual, LN(x + residual + add)·w + b in one fused op on the CPU
        (pe_fast.ops.sublayer_ends; add [M, T, D] repeats over each sequence's T tokens)."""
        check_layer_input(x, self.weight)
        if residual is None and fusable(x, self.weight, self.bias):  # the kernel's range (rows past 1e19), not torch's
            residual = torch.zeros_like(x)
        if residual is not None:
            return residual_layer_norm(x, residual, self.weight, self.bias, add, self.eps)
        y = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        extra = (1,) * (x.dim() - 2)
        M, D = self.weight.shape
        return torch.addcmul(self.bias.view(M, *extra, D), y, self.weight.view(M, *extra, D))


class PEAttention(CheckedModule):
    """Multi-head self-attention of a pack of `num_models` models, with an optional PE added to the input.

    Holds the QKV projection (Xavier-uniform weights, zero biases, as nn.MultiheadAttention) and, unless
    `out_proj=False`, an output projection `out` (a StackedLinear: nn.Linear's weights, zero bias).
    forward(x [M,B,N,D], pe [M,N,D] | None, probes [K,N,N] | None) returns (y [M,B,N,D], stats [M,H,3+K]); see
    `pe_fast.ops.pe_attention` for the statistics. With `generators` (one torch.Generator per model) model m's
    weights come from generators[m] alone, so a model starts the same in any pack; without, each model's
    generator is seeded from torch's global one.
    """

    def __init__(self, width: int, num_heads: int, num_models: int = 1, bias: bool = True, out_proj: bool = True,
                 backend: str | None = None, generators: Sequence[torch.Generator] | None = None):
        super().__init__()
        check_sizes(width=width, num_heads=num_heads, num_models=num_models)
        check_switches(bias=bias, out_proj=out_proj)
        if width % num_heads:
            raise ValueError(f"width {width} is not divisible by num_heads {num_heads}")
        check_fits(f"PEAttention width={width:,} for {num_models:,} models",  # QKV, then the output projection
                   num_models * ((width + bias) * 3 * width + out_proj * (width + 1) * width))
        if generators is None:
            generators = [torch.Generator().manual_seed(int(seed)) for seed in torch.randint(2 ** 62, (num_models,))]
        else:
            check_generators(generators)
            if len(generators) != num_models:
                raise ValueError(f"generators: {len(generators)} for {num_models} models")
        self.w_qkv = nn.Parameter(xavier_uniform_per_model(generators, width, 3 * width))
        self.qkv_drawn_std = uniform_std(xavier_bound(width, 3 * width))  # for scale_to_fan_in_power
        self.b_qkv = nn.Parameter(torch.zeros(num_models, 3 * width)) if bias else None
        self.out = StackedLinear(generators, width, width) if out_proj else None
        if self.out is not None:
            with torch.no_grad():
                self.out.bias.zero_()
        check_backend_name(backend)  # here, not at the first forward
        self.num_heads, self.backend = num_heads, backend

    def forward(self, x: Tensor, pe: Tensor | None = None, probes: Tensor | None = None, *,
                rope: tuple[Tensor, Tensor] | None = None, bias: Tensor | None = None,
                only_token: int | None = None) -> tuple[Tensor, Tensor]:
        """only_token: the output at this token alone, [M,B,1,D] (every token still serves as a key): a model
        that reads out one token needs no other's output projection."""
        out, stats = self.attend(x, pe, probes, rope=rope, bias=bias, only_token=only_token)
        return (out if self.out is None else self.out(out)), stats

    def attend(self, x: Tensor, pe: Tensor | None = None, probes: Tensor | None = None, *,
               rope: tuple[Tensor, Tensor] | None = None, bias: Tensor | None = None,
               only_token: int | None = None) -> tuple[Tensor, Tensor]:
        """forward without the output projection."""
        M, D = self.w_qkv.shape[:2]
        if isinstance(x, Tensor) and (x.dim() != 4 or x.shape[0] != M or x.shape[3] != D):  # else pe_attention's
            raise ValueError(f"x must be [M, B, N, D] = [{M}, B, N, {D}] for this layer, got {list(x.shape)}")
        out, stats = pe_attention(x, pe, self.w_qkv, self.b_qkv, self.num_heads, probes, rope=rope, bias=bias,
                                  backend=self.backend)
        if only_token is not None:
            # a slice past the tokens is empty, silently: the index is checked as indexing would check it
            if not isinstance(only_token, numbers.Integral) or isinstance(only_token, bool):
                raise TypeError(f"only_token must be an int, got {type(only_token).__name__}")
            if not -x.shape[2] <= only_token < x.shape[2]:
                raise ValueError(f"only_token {only_token} is not a token of x's {x.shape[2]}")
            out = out[:, :, only_token % x.shape[2]][:, :, None]
        return out, stats
