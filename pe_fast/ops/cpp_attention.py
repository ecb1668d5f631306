"""The "cpp" backend of `pe_attention`: C++ kernels (kernels/pe_attention.h, glue in csrc/) for CPU tensors.

The QKV projection and its backward stay batched torch GEMMs (MKL), split as x @ w and a per-model addend
pe @ w + b that the kernels add as they load q, k, v (`projection.py`: no pass over the activations for
x + pe or the bias). Between them, two ops of the compiled extension pe_fast._C,
torch.ops.pe_fast_cpp.attention_forward / attention_backward, run every (model, batch, head) problem on
torch's intra-op threads: online softmax over key tiles with the statistics in the same pass, and a
flash-attention backward that recomputes P from the saved log-sum-exp. The N×N map is never stored.
They are ops (with fake-tensor rules below, and a vmap rule for the backward) so that autograd tracing
(opcheck, torch.compile) sees an op and a batched backward (autograd.grad(is_grads_batched=True)) works.
float32 and float64; RoPE turns q and k with torch around the kernels; a relative-position bias and other
dtypes run the reference instead (one logged warning per reason).

The extension is built by `pip install` (setup.py). When it is missing, the "cpp" backend is not registered: CPU
tensors run on the reference, with one logged warning at the first call that would have used the kernels.
"""
from __future__ import annotations

import torch

from pe_fast.ops import extension, projection, reference
from pe_fast.ops.backends import Backend, register_backend, register_unavailable
from pe_fast.ops.transforms import fold_into_model_axis

DTYPES = (torch.float32, torch.float64)


def _reference_reason(x, num_heads, bias) -> str | None:
    if bias is not None:
        return "relative-position bias"
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype} (the C++ kernels take float32 and float64)"
    return None


def forward(x, pe, w_qkv, b_qkv, num_heads, probes=None, rope_cos=None, rope_sin=None, bias=None):
    xw, addend = projection.split_projection(x, pe, w_qkv, b_qkv)
    qkv, addend = projection.kernel_operands(xw, addend, True, num_heads, rope_cos, rope_sin)
    out, stats, lse = torch.ops.pe_fast_cpp.attention_forward(qkv, addend, num_heads, probes)
    return out, stats, xw, lse  # xw is what the backward needs (with the addend, recomputed: it is small)


def backward(grad_out, x, pe, w_qkv, b_qkv, qkv, lse, num_heads, rope_cos=None, rope_sin=None, bias=None, *,
             out):
    """`reference.backward`; `out` is the kernel backends' shared interface (these kernels sum Δ from P and dP); qkv
    is the forward's xw."""
    return (*projection.backward_around(torch.ops.pe_fast_cpp.attention_backward, True, grad_out, x, pe, w_qkv,
                                        b_qkv, qkv, lse, out, num_heads, rope_cos, rope_sin), None)


if extension.MODULE is None:
    remedy = ("unset PE_FAST_KERNELS, or name a build of bench/cpu/isa.sh" if extension.REQUESTED else
              "reinstall with a C++ compiler present: pip install torch==2.13.0 \"setuptools>=70.1\" ninja && "
              "pip install --no-build-isolation -e .")
    # said where a CPU call would have run them (not at import: a sweep refusing a bad $PE_FAST_KERNELS says it once)
    register_unavailable("cpp", ("cpu",), f"pe_fast's C++ CPU kernels are not built ({extension.ERROR}), so "
                                          f"pe_attention runs the slower PyTorch reference on CPU. For the fast path, "
                                          f"{remedy}")
else:
    @torch.library.register_fake("pe_fast_cpp::attention_forward")
    def _(qkv, addend, num_heads, probes):
        M, B, N, D3 = qkv.shape
        num_stats = len(reference.STAT_NAMES) + (0 if probes is None else probes.shape[0])
        return (qkv.new_empty(M, B, N, D3 // 3), qkv.new_empty(M, num_heads, num_stats, dtype=torch.float32),
                qkv.new_empty(M, B, num_heads, N))

    @torch.library.register_fake("pe_fast_cpp::attention_backward")
    def _(qkv, addend, grad_out, out, lse, num_heads):
        return torch.empty_like(qkv)

    @torch.library.register_vmap("pe_fast_cpp::attention_backward")
    def _(info, in_dims, qkv, addend, grad_out, out, lse, num_heads):
        # every tensor argument leads with the model axis: vmapped dims fold into it (a batched backward)
        return fold_into_model_axis(info, in_dims, (qkv, addend, grad_out, out, lse, num_heads), (0, 1, 2, 3, 4),
                                    torch.ops.pe_fast_cpp.attention_backward)

    register_backend("cpp", Backend(forward, backward, ("cpu",), _reference_reason))
