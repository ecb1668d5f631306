"""The element-wise ends of a block's sublayers, fused on the CPU: a stacked linear layer followed by GELU, and the
residual add followed by layer norm. Each is one pass of C++ (kernels/sublayer.h) over the activations where torch
makes several (the bias copy, GELU and its backward, the adds, layer norm, the affine scale and the parameter
gradients' sums): at the fMRI default these passes were about a third of a CPU training step.

The fused path runs for plain eager CPU tensors of float32 or float64 without autocast, when the C++ extension is
built; anything else (CUDA, bf16, torch.compile, vmap) runs the same computation as torch ops, the code path the
model had before these kernels existed. Both compute the same function (tests/test_sublayer_ends.py, against torch
in float64); in float32 they differ by rounding.
"""
from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from pe_fast.ops import extension
from pe_fast.ops.transforms import is_traced

FUSED_DTYPES = (torch.float32, torch.float64)

# cpp_attention.py warns when the extension is missing
BUILT = extension.MODULE is not None and hasattr(torch.ops.pe_fast_cpp, "residual_layer_norm_forward")


def fusable(*tensors: Tensor | None) -> bool:
    """Whether the C++ kernels take these tensors: CPU, not empty, one float32/float64 dtype, plain eager, no
    autocast."""
    present = [t for t in tensors if t is not None]
    return (BUILT and all(t.device.type == "cpu" and t.numel() > 0 for t in present)
            and len({t.dtype for t in present}) == 1 and present[0].dtype in FUSED_DTYPES
            and not torch.is_autocast_enabled("cpu") and not is_traced(*present))


def _rows(x: Tensor) -> Tensor:
    """[M, ..., width] as contiguous [M, R, width]."""
    return x.reshape(x.shape[0], -1, x.shape[-1]).contiguous()


class _LinearGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        flat, bias = _rows(x), bias.contiguous()  # a strided bias (a slice of a larger pack's) is legal
        z = torch.bmm(flat, weight)
        y = torch.ops.pe_fast_cpp.bias_gelu_forward(z, bias)
        ctx.save_for_backward(flat, weight, bias, z)
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], weight.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        flat, weight, bias, z = ctx.saved_tensors
        dz, dbias = torch.ops.pe_fast_cpp.bias_gelu_backward(z, bias, _rows(dy))
        dx = torch.bmm(dz, weight.transpose(1, 2)).view(ctx.x_shape) if ctx.needs_input_grad[0] else None
        dweight = torch.bmm(flat.transpose(1, 2), dz) if ctx.needs_input_grad[1] else None
        return dx, dweight, dbias


def autocasting(device: torch.device) -> bool:
    """Whether torch.autocast casts ops on this device now (then mixed dtypes are its to reconcile)."""
    return device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type)


def check_tensors(*, one_dtype: bool = False, **tensors):
    """Each a floating tensor with a model axis of at least one model, all on the first one's device and, with
    one_dtype (what a batched matmul needs; sums promote), outside autocast (which casts them) in its dtype; or a
    TypeError / ValueError naming the odd one."""
    first_name, first = None, None
    for name, tensor in tensors.items():
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got "
                            f"{tensor.dtype if isinstance(tensor, Tensor) else type(tensor).__name__}")
        if tensor.dim() < 2 or 0 in (tensor.shape[0], tensor.shape[-1]):
            raise ValueError(f"{name} must be [M, ..., width] with M and width at least 1, got {list(tensor.shape)}")
        if first is None:
            first_name, first = name, tensor
        elif tensor.device != first.device:
            raise ValueError(f"{name} is on {tensor.device} but {first_name} on {first.device}: give one device")
        elif one_dtype and tensor.dtype != first.dtype and not autocasting(first.device):
            raise TypeError(f"{name} is {tensor.dtype} but {first_name} is {first.dtype}: give one dtype")


# A layer norm's eps in float32: below its smallest normal number it rounds (to 0 below its subnormals: a constant
# row's 0/0), above its largest it is inf (every output β)
EPS_RANGE = (float(torch.finfo(torch.float32).tiny), float(torch.finfo(torch.float32).max))


def check_eps(eps) -> float:
    """A layer norm's eps, a positive number float32 holds as a normal number (NaN or below 0 gave NaN outputs), as
    a float; or ValueError."""
    low, high = EPS_RANGE
    if not (isinstance(eps, numbers.Real) and not isinstance(eps, bool) and low <= eps <= high):
        raise ValueError(f"eps must be a positive finite number from {low:.3g} to {high:.3g} (float32's normal "
                         f"numbers), got {eps!r}")
    return float(eps)


def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """GELU(x @ weight + bias) of a pack: x [M, ..., in], weight [M, in, out], bias [M, out]; exact GELU."""
    check_tensors(x=x, weight=weight, bias=bias, one_dtype=True)
    M, width = x.shape[0], x.shape[-1]
    if weight.dim() != 3 or tuple(weight.shape[:2]) != (M, width):
        raise ValueError(f"weight must be [M, in, out] = [{M}, {width}, out] for x {list(x.shape)}, got "
                         f"{list(weight.shape)}")
    if tuple(bias.shape) != (M, weight.shape[2]):
        raise ValueError(f"bias must be [M, out] = [{M}, {weight.shape[2]}], got {list(bias.shape)}")
    if fusable(x, weight, bias):
        return _LinearGelu.apply(x, weight, bias)
    flat = x.reshape(x.shape[0], -1, x.shape[-1])
    return F.gelu(torch.baddbmm(bias[:, None], flat, weight).reshape(*x.shape[:-1], weight.shape[-1]))


class _ResidualLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, add, weight, beta, eps):
        a_rows, b_rows, weight, beta = _rows(a), _rows(b), weight.contiguous(), beta.contiguous()
        add = None if add is None else add.contiguous()
        y, mean, rstd = torch.ops.pe_fast_cpp.residual_layer_norm_forward(a_rows, b_rows, add, weight, beta, eps)
        ctx.save_for_backward(a_rows, b_rows, add, weight, mean, rstd)
        ctx.shape = a.shape
        return y.view(a.shape)

    @staticmethod
    def backward(ctx, dy):
        a, b, add, weight, mean, rstd = ctx.saved_tensors
        dx, dweight, dbeta = torch.ops.pe_fast_cpp.residual_layer_norm_backward(a, b, add, weight, mean, rstd,
                                                                               _rows(dy))
        dadd = None
        if add is not None and ctx.needs_input_grad[2]:
            M, T, D = add.shape
            dadd = dx.view(M, -1, T, D).sum(1)
        dx = dx.view(ctx.shape)
        return dx, dx, dadd, dweight, dbeta, None


def residual_layer_norm(a: Tensor, b: Tensor, weight: Tensor, beta: Tensor, add: Tensor | None = None,
                        eps: float = 1e-5) -> Tensor:
    """LayerNorm(a + b + add)·weight + beta of a pack, over the last dim: a, b [M, ..., D]; weight, beta [M, D];
    add [M, T, D] (a per-token addend, the same for every sequence of T tokens: a PE, plus a bias folded in),
    [M, 1, D] (the same for every token) or None."""
    check_tensors(a=a, b=b, weight=weight, beta=beta, **({} if add is None else {"add": add}))
    eps = check_eps(eps)
    if b.shape != a.shape:
        raise ValueError(f"b must have a's shape {list(a.shape)}, got {list(b.shape)}")
    M, T, D = a.shape[0], a.shape[-2], a.shape[-1]
    for name, tensor in (("weight", weight), ("beta", beta)):
        if tuple(tensor.shape) != (M, D):
            raise ValueError(f"{name} must be [M, D] = [{M}, {D}], got {list(tensor.shape)}")
    if add is not None and tuple(add.shape) not in ((M, T, D), (M, 1, D)):
        raise ValueError(f"add must be [M, T, D] or [M, 1, D] for a [M, ..., T, D], got {list(add.shape)} for "
                         f"{list(a.shape)}")
    if fusable(a, b, weight, beta, add) and a.shape == b.shape:
        return _ResidualLayerNorm.apply(a, b, add, weight, beta, eps)
    x = a + b
    if add is not None:
        x = (x.reshape(M, -1, add.shape[1], D) + add[:, None]).reshape(a.shape)
    y = F.layer_norm(x, x.shape[-1:], eps=eps)
    extra = (1,) * (x.dim() - 2)
    return torch.addcmul(beta.view(M, *extra, D), y, weight.view(M, *extra, D))
