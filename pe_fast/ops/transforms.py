"""How pe_fast's ops meet torch's transforms: whether a call is traced or transformed (then only a custom op's
registrations are right), and the vmap rule that folds a vmapped dimension into the model axis."""
from __future__ import annotations

import contextlib

import torch
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode


def _is_plain(t: Tensor, torch_func_wrapped_too: bool = False) -> bool:
    """Not a subclass (fake, functional) nor wrapped by a transform (unless torch_func_wrapped_too: then a
    torch.func transform's wrapping is allowed). The legacy batched tensors of a batched backward
    (autograd.grad(is_grads_batched=True)) show up nowhere else."""
    return (type(t) in (Tensor, torch.nn.Parameter)
            and (torch_func_wrapped_too or not torch._C._functorch.is_functorch_wrapped_tensor(t))
            and not torch._C._functorch.is_legacy_batchedtensor(t))


def is_traced(*tensors: Tensor | None, torch_func_too: bool = True) -> bool:
    """Whether this call is traced or transformed (torch.compile, vmap / grad, a dispatch or function mode,
    tensors that are not plain): then only the custom op's registrations (fake, vmap, autograd) are right.
    Otherwise it is plain eager mode, where calling the backend directly is the same computation.
    torch_func_too=False: torch.func's transforms (grad, vmap, jacrev) alone do not count, for an
    autograd.Function with its own vmap rule, which they support and a custom op's autograd does not."""
    return (torch.compiler.is_compiling()
            or (torch_func_too and torch._C._are_functorch_transforms_active())
            or _get_current_dispatch_mode() is not None or torch._C._is_torch_function_mode_enabled()
            or not all(_is_plain(t, not torch_func_too) for t in tensors if t is not None))


def known_values(t: Tensor) -> Tensor | None:
    """t's values as a plain tensor where this call has them (eager; under a function or dispatch mode that
    computes, such as torch.device's or a FLOP counter; inside vmap or grad: the tensor they wrap, every slice), or
    None where it has none (torch.compile's fake tensors, a functional or other wrapper subclass, meta). For value
    checks, which must hold wherever values exist, not only where the call is plain eager mode."""
    if torch.compiler.is_compiling() or t.is_meta:
        return None
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        batch_dim = torch._C._functorch.maybe_get_bdim(t) if torch._C._functorch.is_batchedtensor(t) else -1
        t = torch._C._functorch.get_unwrapped(t)
        if batch_dim > 0:  # vmap's dimension first, so that two tables batched at other dims still pair up
            t = t.movedim(batch_dim, 0)
    if torch._C._functorch.is_legacy_batchedtensor(t) or t.is_meta:
        return None
    if type(t) not in (Tensor, torch.nn.Parameter):
        # a subclass that only adds Python behaviour holds its own values; one with a dispatch of its own (fake,
        # functional, a wrapper) may not
        if getattr(type(t), "__torch_dispatch__", Tensor.__torch_dispatch__) is not Tensor.__torch_dispatch__:
            return None
        with torch._C.DisableTorchFunctionSubclass():
            t = t.as_subclass(Tensor)
    return t


@contextlib.contextmanager
def concrete():
    """Computations on known_values' tensors run as plain eager ones: no torch function or dispatch mode sees
    them (a tracer would record a check as part of the model; a FLOP counter count it)."""
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        yield


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
