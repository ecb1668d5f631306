"""`pe_attention`: PE addition + multi-head attention + attention-map statistics, for a pack of M models.

One `torch.library` custom op (schema, fake tensor, autograd, vmap) whose body dispatches to a backend
(pe_fast.ops.backends); plain eager calls run the same functions without the op's dispatch layers
(`_EagerPEAttention`). The op's arguments are `OpInputs`, defined once here.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from typing import NamedTuple

import torch
from torch import Tensor

from pe_fast.available_memory import available_bytes
from pe_fast.ops import reference
from pe_fast.ops.backends import BACKENDS, UNAVAILABLE, implementation, resolve_backend
from pe_fast.ops.transforms import concrete, fold_into_model_axis, is_traced, known_values


class OpInputs(NamedTuple):
    """The op's arguments, in its schema's order."""
    x: Tensor                 # [M,B,N,D]
    pe: Tensor | None         # [M,N,D]
    w_qkv: Tensor             # [M,D,3D]
    b_qkv: Tensor | None      # [M,3D]
    num_heads: int
    probes: Tensor | None     # [K,N,N], shared by the models
    rope_cos: Tensor | None   # [N,dh/2], shared
    rope_sin: Tensor | None
    bias: Tensor | None       # [M,H,N,N]
    backend: str              # resolved before the call


PER_MODEL = tuple(OpInputs._fields.index(f) for f in ("x", "pe", "w_qkv", "b_qkv", "bias"))  # lead with M


@torch.library.custom_op("pe_fast::pe_attention", mutates_args=())
def _pe_attention(
    x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None, num_heads: int,
    probes: Tensor | None, rope_cos: Tensor | None, rope_sin: Tensor | None, bias: Tensor | None,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _forward(*OpInputs(x, pe, w_qkv, b_qkv, num_heads, probes, rope_cos, rope_sin, bias, backend))


def autocast_on(device: torch.device) -> bool:
    # torch.is_autocast_enabled raises for device types without autocast, such as meta (shape inference)
    return device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type)


def autocast_dtype(x: Tensor) -> torch.dtype | None:
    """The dtype autocast computes x in, or None: autocast off, or x in float64, which autocast leaves alone (a
    matmul of float64 tensors stays float64 under it)."""
    if autocast_on(x.device) and x.dtype != torch.float64:
        return torch.get_autocast_dtype(x.device.type)
    return None


def own_dtypes(device: torch.device):
    """The op's body, forward and backward, computes in its inputs' own dtypes (mixed under autocast: x in bf16,
    the PE's path in float32, projection.py), so autocast, where it is on, is switched off around it."""
    if autocast_on(device):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


# The reference materialises every attention map: an allocation beyond the memory free fails in torch's allocator
# with a RuntimeError of its own (or, with swap, pages for minutes first)
REFERENCE_MAPS = 3  # the logits, probabilities and their logarithms, [M,B,H,N,N] each


def check_reference_fits(i: OpInputs) -> None:
    """ValueError naming x where the reference's attention maps would not fit in the memory free now (CPU)."""
    M, B, N, _ = i.x.shape
    needed = REFERENCE_MAPS * M * B * i.num_heads * N * N * reference.accumulation_dtype(i.x).itemsize
    if i.x.device.type == "cpu" and needed > (free := available_bytes()):
        raise ValueError(f"x [M,B,N,D] {list(i.x.shape)}: the reference's attention maps of {N:,} tokens need about "
                         f"{needed / 2**30:,.0f} GiB, more than the memory free now ({free / 2**30:,.0f} GiB); "
                         f"pass fewer items (B) at a time")


def _forward(*args):
    # every backend returns out, stats and what its backward needs: a projection [M,B,N,3D] (the reference's
    # qkv; the kernels' x @ w) and the log-sum-exp of every row
    i = OpInputs(*args)
    chosen = implementation(i.backend, i.x, i.num_heads, i.bias)
    if chosen is BACKENDS["reference"]:
        check_reference_fits(i)
    with own_dtypes(i.x.device):
        outputs = chosen.forward(*i[:-1])
    return tuple(t.contiguous() for t in outputs)


@_pe_attention.register_fake
def _(*args):
    i = OpInputs(*args)
    M, B, N, D = i.x.shape
    num_stats = len(reference.STAT_NAMES) + (0 if i.probes is None else i.probes.shape[0])
    return (i.x.new_empty(M, B, N, D), i.x.new_empty(M, i.num_heads, num_stats, dtype=torch.float32),
            i.x.new_empty(M, B, N, 3 * D),
            i.x.new_empty(M, B, i.num_heads, N, dtype=reference.accumulation_dtype(i.x)))


def _setup_context(ctx, inputs, output):
    i = OpInputs(*inputs)
    out, stats, qkv, lse = output
    ctx.mark_non_differentiable(stats, qkv, lse)
    # Their gradients stay None: materialised, they would be zero tensors the size of qkv, filled every step.
    ctx.set_materialize_grads(False)
    ctx.num_heads, ctx.backend = i.num_heads, i.backend
    ctx.save_for_backward(i.x, i.pe, i.w_qkv, i.b_qkv, qkv, lse, i.rope_cos, i.rope_sin, i.bias, out)


def _backward(ctx, grad_out, _grad_stats, _grad_qkv, _grad_lse):
    no_gradients = OpInputs(*(None,) * len(OpInputs._fields))
    if grad_out is None:  # out did not reach the loss
        return tuple(no_gradients)
    x, pe, w_qkv, b_qkv, qkv, lse, rope_cos, rope_sin, bias, out = ctx.saved_tensors
    if differentiated_again(grad_out, x, pe, w_qkv, b_qkv, bias):
        return _differentiable_backward(grad_out, x, pe, w_qkv, b_qkv, ctx.num_heads, rope_cos, rope_sin, bias)
    with own_dtypes(x.device):  # a backward run inside an autocast region
        dx, dpe, dw, db, dbias = implementation(ctx.backend, x, ctx.num_heads, bias).backward(
            grad_out, x, pe, w_qkv, b_qkv, qkv, lse, ctx.num_heads, rope_cos, rope_sin, bias, out=out)
    return tuple(no_gradients._replace(x=dx, pe=dpe, w_qkv=dw, b_qkv=db, bias=dbias))


# torch.func's transforms that differentiate
DIFFERENTIATING = ("Grad", "Jvp")


def differentiated_again(grad_out: Tensor, *inputs) -> bool:
    """Whether the gradient this backward computes is itself differentiated (a gradient penalty, a Hessian, grad of
    grad): autograd's create_graph=True with an input requiring grad; inside torch.func's transforms (which run
    every backward with a graph), grad_out or an input tracked by a differentiating transform still on the stack
    other than the one running this backward (grad's own level is the current one; vjp's has left the stack)."""
    functorch = torch._C._functorch
    if not torch._C._are_functorch_transforms_active():
        return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in inputs)
    live = {i.level() for i in functorch.get_interpreter_stack() or [] if i.key().name in DIFFERENTIATING}
    live.discard(functorch.maybe_current_level())
    for tensor in (grad_out, *inputs):
        while isinstance(tensor, Tensor) and (functorch.is_gradtrackingtensor(tensor)
                                              or functorch.is_batchedtensor(tensor)):
            if functorch.is_gradtrackingtensor(tensor) and functorch.maybe_get_level(tensor) in live:
                return True
            tensor = functorch.get_unwrapped(tensor)
    return False


def _differentiable_backward(grad_out, x, pe, w_qkv, b_qkv, num_heads, rope_cos, rope_sin, bias):
    """The gradients as the reference's autograd computes them, themselves differentiable: the fused backends'
    backward kernels are not, and their gradient would be taken as a constant. Only where differentiated_again;
    training's backward runs the backend's kernels. Inside torch.func's transforms through torch.func.vjp (they
    refuse torch.autograd.grad), for every input given."""
    wanted = OpInputs(x, pe, w_qkv, b_qkv, None, None, None, None, bias, None)

    def forward(*tensors):
        given = iter(tensors)
        inputs = OpInputs(*(next(given) if isinstance(t, Tensor) else t for t in wanted))
        with own_dtypes(x.device):
            return reference.forward(inputs.x, inputs.pe, inputs.w_qkv, inputs.b_qkv, num_heads, None, rope_cos,
                                     rope_sin, inputs.bias)[0]

    if torch._C._are_functorch_transforms_active():
        given = [t for t in wanted if isinstance(t, Tensor)]
        grads = iter(torch.func.vjp(forward, *given)[1](grad_out))
        return tuple(next(grads) if isinstance(t, Tensor) else None for t in wanted)
    differentiable = [t for t in wanted if isinstance(t, Tensor) and t.requires_grad]
    out = forward(*(t for t in wanted if isinstance(t, Tensor)))
    grads = iter(torch.autograd.grad(out, differentiable, grad_out, create_graph=True, allow_unused=True))
    return tuple(next(grads) if isinstance(t, Tensor) and t.requires_grad else None for t in wanted)


_pe_attention.register_autograd(_backward, setup_context=_setup_context)


class _EagerPEAttention(torch.autograd.Function):
    """The custom op's forward and autograd, called without the op: in plain eager mode the custom-op
    dispatcher's Python layers cost more host time than the kernels themselves at small shapes (the H100
    profile at N = 16 was host-bound; bench/results/h100-20261126/profile_n16.log). Same functions, same
    numbers. It is also the path of torch.func's transforms (grad, vmap, jacrev), which a custom op's autograd
    does not support; whatever traces the call (torch.compile, fake tensors, modes) goes through the op."""

    @staticmethod
    def forward(*inputs):
        return _forward(*inputs)

    setup_context = staticmethod(_setup_context)
    backward = staticmethod(_backward)

    @staticmethod
    def vmap(info, in_dims, *args):
        return fold_into_model_axis(info, in_dims, args, PER_MODEL, _EagerPEAttention.apply)


@_pe_attention.register_vmap
def _(info, in_dims, *args):
    return fold_into_model_axis(info, in_dims, args, PER_MODEL, _pe_attention)


# Every backend computes in these (a kernel that lacks one hands it to the reference); integer or complex
# tensors would fail deep inside a matmul, or be truncated to the weights' dtype without a word.
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# The largest |probe|: a statistic's sum over B·N rows of p·probe stays within float32 up to 3·10⁸ rows.
PROBE_LIMIT = 1e30
ROPE_SLACK = 1e-3  # a rope table's values are cos and sin: ±1, with room for a half-precision table's rounding
ROTATION_SLACK = 1e-2  # cos² + sin² of the same angle: 1, with room for a bf16 table's rounding (2⁻⁸ a value)
# (x's dtype, w_qkv's) where they differ: autocast's mix, x @ W in 16 bits and the PE's path in float32
# (projection.py). Any other pair would round one side to the other's precision without a word.
MIXED_PRECISION = ((torch.bfloat16, torch.float32), (torch.float16, torch.float32))


def check_backend_name(backend) -> None:
    """A backend argument: None or a backend's name (whether it runs on the tensors' device is known at the call);
    a TypeError / ValueError naming it otherwise."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {backend!r} ({type(backend).__name__})")
    if backend is not None and not backend.strip():  # not None: the default would run without a word
        raise ValueError(f"backend={backend!r} names no backend; give None (the fastest here) or one of "
                         f"{', '.join(BACKENDS)}")
    if backend is not None and backend not in BACKENDS and backend not in UNAVAILABLE:
        raise ValueError(f"unknown pe_attention backend {backend!r}; available: {', '.join(BACKENDS)}")


def check_inputs(x, pe, w_qkv, b_qkv, num_heads, probes, rope, bias, backend=None) -> None:
    """Every argument checked once, before any backend runs, so that all backends reject the same calls with one
    error naming the argument (TypeError: not a tensor, not an int, a dtype that is not floating or does not go
    with x's; ValueError: a value, shape, device or backend name), instead of failing deep inside a kernel or
    returning garbage."""
    check_backend_name(backend)
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, torch.SymInt)):
        raise TypeError(f"num_heads must be an int, got {num_heads!r} ({type(num_heads).__name__})")
    if num_heads < 1:
        raise ValueError(f"num_heads={num_heads} must be at least 1")
    if rope is not None and (not isinstance(rope, (tuple, list)) or len(rope) != 2):
        raise TypeError(f"rope must be a (cos, sin) pair of tensors, got {type(rope).__name__}")
    cos, sin = rope if rope is not None else (None, None)
    tensors = {"x": x, "pe": pe, "w_qkv": w_qkv, "b_qkv": b_qkv, "probes": probes, "rope[0]": cos, "rope[1]": sin,
               "bias": bias}
    for name, tensor in tensors.items():
        if tensor is None and name not in ("x", "w_qkv", *(("rope[0]", "rope[1]") if rope is not None else ())):
            continue  # the optional ones: with rope given, both its tables are needed
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        # the backends index dense memory: a sparse or nested tensor failed deep inside, naming nothing
        if tensor.is_nested or tensor.layout != torch.strided:
            layout = "nested" if tensor.is_nested else str(tensor.layout)
            raise TypeError(f"{name} must be a dense tensor (torch.strided), got a {layout} one: call .to_dense()")
        # probes may come in any real dtype (bool and uint8 masks are the cheap ones to read)
        if name == "probes" and (tensor.is_complex()
                                 or tensor.is_floating_point() and tensor.dtype not in FLOAT_DTYPES):
            raise TypeError(f"probes must be bool, integer or one of {', '.join(map(str, FLOAT_DTYPES))}, got "
                            f"{tensor.dtype}")  # complex, or float8, which few of torch's ops take
        if name != "probes" and tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a floating tensor ({', '.join(map(str, FLOAT_DTYPES))}), "
                            f"got {tensor.dtype}")
        # a meta tensor among real ones (or a second device) would make a kernel read memory that is not there
        if tensor.device != x.device:
            raise ValueError(f"{name} is on {tensor.device} but x is on {x.device}: every tensor argument must be "
                             f"on x's device")
    check_dtypes(x, pe, w_qkv, b_qkv, rope, bias)
    if x.dim() != 4:
        raise ValueError(f"x must be [M,B,N,D], got shape {tuple(x.shape)}")
    M, _, N, D = x.shape
    for dim, size in zip("MBND", x.shape):
        if size == 0:  # the reference would divide by zero, a kernel would average nothing
            raise ValueError(f"x [M,B,N,D] has an empty dimension {dim}=0, got shape {tuple(x.shape)}")
    if D % num_heads:
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
        # fixed tables (RotaryPE's buffers): the backends turn q and k by them and return no gradient for them
        if torch.is_grad_enabled() and any(t.requires_grad for t in rope):
            raise ValueError("rope: its (cos, sin) tables take no gradient here; pass them detached (.detach())")
    if probes is not None and torch.is_grad_enabled() and probes.requires_grad:  # as rope's: no gradient returned
        raise ValueError("probes: the statistics take no gradient here; pass them detached (.detach())")
    # a mask of -inf: its rows' entropy is NaN (0·log 0), a row all -inf a NaN output. Checked where the bias is
    # a caller's mask, not where it takes a gradient (a relative PE's, which would pay a pass and a GPU sync per
    # call); under no_grad none is taken, so a parameter passed as the bias is checked there too
    takes_gradient = bias is not None and bias.requires_grad and torch.is_grad_enabled()
    if not torch.compiler.is_compiling():  # fake tensors there, without values (and dynamo cannot trace the switch)
        with concrete():  # values wherever the call has them: under vmap, a mode or a subclass too
            _check_values(x, None if takes_gradient else bias, probes, rope)


def _check_values(x, bias, probes, rope) -> None:
    if bias is not None and (bias := known_values(bias)) is not None and bias.numel():
        largest = float(bias.abs().amax())
        if not math.isfinite(largest):
            raise ValueError("bias holds NaN or ±inf: give finite values (for a mask, a large negative number such "
                             "as -1e4, whose softmax weight is 0 in float32)")
        cast = autocast_dtype(x) if isinstance(x, Tensor) else None  # the bias is cast with x: fp16's ±65,504
        if cast is not None and largest > torch.finfo(cast).max:
            raise ValueError(f"bias holds {largest:.3g}, beyond {cast}'s range, to which autocast casts it (an inf "
                             f"there: NaN outputs); give a mask of -1e4 or less in magnitude")
    # fixed tables: a NaN in one made every output (RoPE) or a statistic (probes) NaN without a word; a probe near
    # float's largest value made the statistics' sums over rows inf (one backend) or not (another)
    tables = {"probes": probes, **{f"rope[{i}]": t for i, t in enumerate(rope or ())}}
    tables = {name: known_values(t) if t is not None and t.is_floating_point() else None
              for name, t in tables.items()}
    for name, table in tables.items():
        if table is None or table.numel() == 0:
            continue
        largest = float(table.abs().amax())
        if not math.isfinite(largest):
            raise ValueError(f"{name} holds NaN or ±inf: give finite values")
        if name == "probes" and largest > PROBE_LIMIT:
            raise ValueError(f"probes hold {largest:.3g}, beyond ±{PROBE_LIMIT:.0e}: the statistics sum p·probe over "
                             f"rows in float32; give probes as weights (0/1 masks or similar)")
        if name != "probes" and largest > 1 + ROPE_SLACK:  # 1e30 in a table: q·k beyond float32, NaN outputs
            raise ValueError(f"{name} holds {largest:.3g}: the tables are cosines and sines, within ±1")
    # zeros (or any pair off the unit circle) passed the range check and scaled q and k: zeros made every row's
    # attention uniform without a word
    cos, sin = tables.get("rope[0]"), tables.get("rope[1]")
    if cos is not None and sin is not None and cos.numel() and sin.numel():
        try:  # under vmap one table may carry a batch dimension the other lacks: paired by broadcasting
            cos, sin = torch.broadcast_tensors(cos, sin)
        except RuntimeError:  # two vmaps of other sizes: no pairing to check
            return
        squares = cos.double() ** 2 + sin.double() ** 2
        off = (squares - 1).abs()
        if float(off.amax()) > ROTATION_SLACK:
            at = tuple(int(i) for i in torch.unravel_index(off.argmax(), off.shape))
            raise ValueError(f"rope: cos² + sin² is {float(squares[at]):.3g} at {list(at)}, not 1: the tables are the "
                             f"cosines and sines of the same angles")


def check_dtypes(x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None, rope,
                 bias: Tensor | None) -> None:
    """Every floating argument's dtype against the one it must share, by one rule and one message; nothing is cast
    to fit, which would round one side to the other's precision without a word (or fail inside a matmul). x and
    w_qkv: one dtype, or MIXED_PRECISION's pair. pe, b_qkv and the rope tables: w_qkv's (a model's parameters and
    buffers; the PE's path computes in w_qkv's dtype, projection.py), which is x's but in autocast's mix. bias: x's.
    x as the op will compute it: under autocast in autocast's dtype, and the bias is not checked there
    (pe_attention casts both to it). probes keep their own dtype (check_inputs)."""
    low = autocast_dtype(x)
    computed = low or x.dtype
    cos, sin = rope if rope is not None else (None, None)
    given = {"x": x, "w_qkv": w_qkv, "pe": pe, "b_qkv": b_qkv, "rope[0]": cos, "rope[1]": sin,
             "bias": None if low else bias}
    mix = tuple(w for a, w in MIXED_PRECISION if a == computed)
    # argument: (the one it must match, the dtypes it may have, why)
    rules = {"w_qkv": ("x", (computed, *mix), "x's dtype, or float32 with x in 16 bits: autocast's mix"),
             **{name: ("w_qkv", (w_qkv.dtype,), "the weights' dtype")
                for name in ("pe", "b_qkv", "rope[0]", "rope[1]")},
             "bias": ("x", (x.dtype,), "x's dtype")}
    for name, (other, allowed, why) in rules.items():
        tensor = given[name]
        if tensor is not None and tensor.dtype not in allowed:
            under = f" ({low} under autocast)" if other == "x" and low else ""
            raise TypeError(f"{name} is {tensor.dtype} but {other} is {given[other].dtype}{under}: give {name} "
                            f"{' or '.join(map(str, allowed))} ({why}); pe_attention casts no argument to fit")


def pe_attention(x: Tensor, pe: Tensor | None, w_qkv: Tensor, b_qkv: Tensor | None, num_heads: int,
                 probes: Tensor | None = None, *, rope: tuple[Tensor, Tensor] | None = None,
                 bias: Tensor | None = None, backend: str | None = None) -> tuple[Tensor, Tensor]:
    """Attention of a pack of M models, with the PE added to x before the QKV projection.

    Returns out [M,B,N,D] (the heads' softmax(QKᵀ/√dh + bias)·V, concatenated, before any output projection)
    and stats [M,H,3+K] (no gradient): the mean over batch and query rows of the row entropy, the row's
    largest probability, Σ_j p_ij², and Σ_j p_ij·probes[k,i,j] for each probe k.
    Optional: rope = (cos, sin) tables [N, dh/2] rotating q and k; bias [M,H,N,N] added to the logits.
    Under torch.autocast, x and the bias are cast to the autocast dtype (float64 stays, as autocast leaves it), and
    so is x @ w_qkv; the PE's part, pe @ w_qkv + b_qkv, stays in w_qkv's dtype until it is added
    (pe_fast.ops.projection says why).
    A bad argument raises TypeError or ValueError naming it before any backend runs (`check_inputs`); no
    argument is cast to fit another's dtype (`check_dtypes`: pe, b_qkv and rope in w_qkv's, bias in x's).
    """
    if isinstance(num_heads, numbers.Integral) and not isinstance(num_heads, (bool, int)):
        num_heads = int(num_heads)  # numpy's integers: the schema takes a Python int
    check_inputs(x, pe, w_qkv, b_qkv, num_heads, probes, rope, bias, backend)
    if (low := autocast_dtype(x)) is not None:
        # Like a matmul under autocast: the op runs in the autocast dtype (the kernels take bf16 directly);
        # the statistics stay float32 and the gradients flow back to each input's own dtype.
        x, bias = (None if t is None else t.to(low) for t in (x, bias))
    cos, sin = rope if rope is not None else (None, None)
    inputs = OpInputs(x, pe, w_qkv, b_qkv, num_heads, probes, cos, sin, bias, resolve_backend(backend, x.device))
    traced = is_traced(*(t for t in inputs if isinstance(t, Tensor)), torch_func_too=False)
    op = _pe_attention if traced else _EagerPEAttention.apply
    out, stats, _, _ = op(*inputs)
    return out, stats
