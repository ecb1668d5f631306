"""`pe_attention`: PE addition + multi-head attention + attention-map statistics, for a pack of M models.

One `torch.library` custom op (schema, fake tensor, autograd, vmap) whose body dispatches to a backend. A backend is
a pair of functions with the signatures of `reference.forward` and `reference.backward`, registered in
BACKENDS with the devices it runs on and the inputs it hands to the reference instead (one logged warning per
reason); the plain-PyTorch reference runs everywhere and is the oracle.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from pe_fast.ops import reference

log = logging.getLogger("pe_fast")


@dataclasses.dataclass(frozen=True)
class Backend:
    forward: Callable
    backward: Callable
    devices: tuple[str, ...]  # torch device types it runs on
    # (x, num_heads, bias) -> why these inputs go to the reference instead (a feature or dtype the kernels
    # lack), or None
    reference_reason: Callable | None = None


# In order of preference: the first one that runs on the tensors' device is the default.
BACKENDS: dict[str, Backend] = {
    "reference": Backend(reference.forward, reference.backward, ("cpu", "cuda", "meta")),
}


def register_backend(name: str, backend: Backend) -> None:
    """Fused kernels put themselves in front of the reference, so they become the default on their devices."""
    others = {k: v for k, v in BACKENDS.items() if k != name}
    BACKENDS.clear()
    BACKENDS.update({name: backend, **others})


@functools.cache
def _warn_fallback(backend: str, reason: str) -> None:
    log.warning("pe_attention backend '%s' runs the reference instead: %s", backend, reason)


def implementation(backend: str, x: Tensor, num_heads: int, bias: Tensor | None) -> Backend:
    """The backend's functions, or the reference's where the backend cannot take these inputs (one logged
    warning per backend and reason)."""
    chosen = BACKENDS[backend]
    reason = chosen.reference_reason(x, num_heads, bias) if chosen.reference_reason else None
    if reason is None:
        return chosen
    _warn_fallback(backend, reason)
    return BACKENDS["reference"]


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """backend= argument, else $PE_FAST_BACKEND, else the first registered backend for the device."""
    chosen = backend or os.environ.get("PE_FAST_BACKEND")
    if chosen is None:
        return next(name for name, b in BACKENDS.items() if device.type in b.devices)
    if chosen not in BACKENDS:
        raise ValueError(f"unknown pe_attention backend {chosen!r}; available: {', '.join(BACKENDS)}")
    if device.type not in BACKENDS[chosen].devices:
        raise ValueError(f"pe_attention backend {chosen!r} does not run on {device.type} tensors")
    return chosen


@torch.library.custom_op("pe_fast::pe_attention", mutates_args=())
def _pe_attention(
    x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None, num_heads: int,
    probes: Tensor | None, rope_cos: Tensor | None, rope_sin: Tensor | None, bias: Tensor | None,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _forward(x, pe, w_qkv, b_qkv, num_heads, probes, rope_cos, rope_sin, bias, backend)


def _forward(x, pe, w_qkv, b_qkv, num_heads, probes, rope_cos, rope_sin, bias, backend):
    # backend is resolved before the call; every backend returns out, stats and what its backward needs: a
    # projection [M,B,N,3D] (the reference's qkv; the kernels' x @ w) and the log-sum-exp of every row.
    return tuple(t.contiguous() for t in implementation(backend, x, num_heads, bias).forward(
        x, pe, w_qkv, b_qkv, num_heads, probes, rope_cos, rope_sin, bias))


@_pe_attention.register_fake
def _(x, pe, w_qkv, b_qkv, num_heads, probes, rope_cos, rope_sin, bias, backend):
    M, B, N, D = x.shape
    num_stats = len(reference.STAT_NAMES) + (0 if probes is None else probes.shape[0])
    return (x.new_empty(M, B, N, D), x.new_empty(M, num_heads, num_stats, dtype=torch.float32),
            x.new_empty(M, B, N, 3 * D), x.new_empty(M, B, num_heads, N, dtype=reference.accumulation_dtype(x)))


def _setup_context(ctx, inputs, output):
    x, pe, w_qkv, b_qkv, num_heads, probes, rope_cos, rope_sin, bias, backend = inputs
    out, stats, qkv, lse = output
    ctx.mark_non_differentiable(stats, qkv, lse)
    # Their gradients stay None: materialised, they would be zero tensors the size of qkv, filled every step.
    ctx.set_materialize_grads(False)
    ctx.num_heads, ctx.backend = num_heads, backend
    ctx.save_for_backward(x, pe, w_qkv, b_qkv, qkv, lse, rope_cos, rope_sin, bias, out)


def _backward(ctx, grad_out, _grad_stats, _grad_qkv, _grad_lse):
    if grad_out is None:  # out did not reach the loss
        return (None,) * 10
    x, pe, w_qkv, b_qkv, qkv, lse, rope_cos, rope_sin, bias, out = ctx.saved_tensors
    dx, dpe, dw, db, dbias = implementation(ctx.backend, x, ctx.num_heads, bias).backward(
        grad_out, x, pe, w_qkv, b_qkv, qkv, lse, ctx.num_heads, rope_cos, rope_sin, bias, out=out)
    return dx, dpe, dw, db, None, None, None, None, dbias, None


_pe_attention.register_autograd(_backward, setup_context=_setup_context)


class _EagerPEAttention(torch.autograd.Function):
    """The custom op's forward and autograd, called without the op: in plain eager mode the custom-op
    dispatcher's Python layers cost more host time than the kernels themselves at small shapes (the H100
    profile at N = 16 was host-bound; bench/results/h100-20261126/profile_n16.log). Same functions, same
    numbers; whatever traces or transforms the call goes through the op (`is_traced`)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_backward)


def _is_plain(t: Tensor) -> bool:
    """Not a subclass (fake, functional) nor wrapped by a transform. The legacy batched tensors of a batched
    backward (autograd.grad(is_grads_batched=True)) show up nowhere else."""
    return (type(t) in (Tensor, torch.nn.Parameter) and not torch._C._functorch.is_functorch_wrapped_tensor(t)
            and not torch._C._functorch.is_legacy_batchedtensor(t))


def is_traced(*tensors: Tensor | None) -> bool:
    """Whether this call is traced or transformed (torch.compile, vmap / grad, a dispatch or function mode,
    tensors that are not plain): then only the custom op's registrations (fake, vmap, autograd) are right.
    Otherwise it is plain eager mode, where calling the backend directly is the same computation."""
    return (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
            or _get_current_dispatch_mode() is not None or torch._C._is_torch_function_mode_enabled()
            or not all(_is_plain(t) for t in tensors if t is not None))


def fold_into_model_axis(info, in_dims, args, per_model, op):
    """A vmap rule for an op whose tensors in positions `per_model` all lead with the model axis M: the
    vmapped dim (size V) becomes part of M (V·M models; an unbatched per-model tensor is expanded), one call
    covers everything, and each output [V·M, ...] is split back into [V, M, ...] (out_dims 0). A batched
    tensor outside `per_model` (shared by all models, e.g. probes or RoPE tables) cannot be folded: then the
    op runs once per vmapped index and the outputs are stacked."""
    V = info.batch_size
    batched = [i for i, d in enumerate(in_dims) if d is not None]
    if any(i not in per_model for i in batched):
        results = [op(*(a if d is None else a.select(d, v) for a, d in zip(args, in_dims))) for v in range(V)]
        if isinstance(results[0], Tensor):
            return torch.stack(results), 0
        return tuple(torch.stack(outs) for outs in zip(*results)), (0,) * len(results[0])

    def fold(arg, dim, i):
        if i not in per_model or arg is None:
            return arg
        arg = arg.movedim(dim, 0) if dim is not None else arg.expand(V, *arg.shape)
        return arg.reshape(V * arg.shape[1], *arg.shape[2:])

    outs = op(*(fold(a, d, i) for i, (a, d) in enumerate(zip(args, in_dims))))
    if isinstance(outs, Tensor):
        return outs.unflatten(0, (V, -1)), 0
    return tuple(o.unflatten(0, (V, -1)) for o in outs), (0,) * len(outs)


@_pe_attention.register_vmap
def _(info, in_dims, x, pe, w_qkv, b_qkv, num_heads, probes, rope_cos, rope_sin, bias, backend):
    # x, pe, w_qkv, b_qkv and bias lead with M; probes and the RoPE tables are shared by the models
    args = (x, pe, w_qkv, b_qkv, num_heads, probes, rope_cos, rope_sin, bias, backend)
    return fold_into_model_axis(info, in_dims, args, (0, 1, 2, 3, 8), _pe_attention)


def check_inputs(x, pe, w_qkv, b_qkv, num_heads, probes, rope, bias) -> None:
    """Shape errors name the argument and the expected shape, instead of failing deep inside a matmul."""
    if x.dim() != 4:
        raise ValueError(f"x must be [M,B,N,D], got shape {tuple(x.shape)}")
    M, B, N, D = x.shape
    if num_heads < 1 or D % num_heads:
        raise ValueError(f"num_heads={num_heads} must divide the model width D={D}")
    expected = {"pe": (pe, (M, N, D)), "w_qkv": (w_qkv, (M, D, 3 * D)), "b_qkv": (b_qkv, (M, 3 * D)),
                "bias": (bias, (M, num_heads, N, N))}
    for name, (tensor, shape) in expected.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
    if probes is not None and (probes.dim() != 3 or tuple(probes.shape[1:]) != (N, N)):
        raise ValueError(f"probes must be [K,{N},{N}], got {list(probes.shape)}")
    if rope is not None:
        dh = D // num_heads
        if dh % 2 or any(tuple(t.shape) != (N, dh // 2) for t in rope):
            raise ValueError(f"rope must be (cos, sin) tables of shape [{N},{dh // 2}] with an even head dim")


def pe_attention(x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None, num_heads: int,
                 probes: Tensor | None = None, *, rope: tuple[Tensor, Tensor] | None = None,
                 bias: Tensor | None = None, backend: str | None = None) -> tuple[Tensor, Tensor]:
    """Attention of a pack of M models, with the PE added to x before the QKV projection.

    Returns out [M,B,N,D] (the heads' softmax(QKᵀ/√dh + bias)·V, concatenated, before any output projection)
    and stats [M,H,3+K] (no gradient): the mean over batch and query rows of the row entropy, the row's
    largest probability, Σ_j p_ij², and Σ_j p_ij·probes[k,i,j] for each probe k.
    Optional: rope = (cos, sin) tables [N, dh/2] rotating q and k; bias [M,H,N,N] added to the logits.
    Under torch.autocast, x, pe, the projection and the bias are cast to the autocast dtype first.
    """
    check_inputs(x, pe, w_qkv, b_qkv, num_heads, probes, rope, bias)
    if torch.is_autocast_enabled(x.device.type):
        # Like a matmul under autocast: the op runs in the autocast dtype (the kernels take bf16 directly);
        # the statistics stay float32 and the gradients flow back to each input's own dtype.
        low = torch.get_autocast_dtype(x.device.type)
        x, pe, w_qkv, b_qkv, bias = (None if t is None else t.to(low) for t in (x, pe, w_qkv, b_qkv, bias))
    cos, sin = rope if rope is not None else (None, None)
    inputs = (x, pe, w_qkv, b_qkv, num_heads, probes, cos, sin, bias, resolve_backend(backend, x.device))
    op = _pe_attention if is_traced(x, pe, w_qkv, b_qkv, probes, cos, sin, bias) else _EagerPEAttention.apply
    out, stats, _, _ = op(*inputs)
    return out, stats
