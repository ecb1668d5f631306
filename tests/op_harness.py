"""Inputs and a forward + backward run of pe_attention, shared by the backend tests (test_*_attention.py)."""
import math

import torch

from pe_fast.ops import pe_attention


def make_inputs(M, B, N, D, K, *, with_pe=True, with_bias=True, logit_scale=1.0, device="cpu", seed=0):
    """float64 inputs and an upstream gradient; probes are 0/1 patterns. logit_scale > 1 gives peaked rows."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    inputs = dict(x=r(M, B, N, D), pe=r(M, N, D) if with_pe else None,
                  w=r(M, D, 3 * D) * logit_scale / math.sqrt(D), b=r(M, 3 * D) if with_bias else None,
                  probes=(torch.rand(K, N, N, generator=g, dtype=torch.float64) > 0.5).double() if K else None,
                  grad=r(M, B, N, D))
    return {k: None if v is None else v.to(device) for k, v in inputs.items()}


def run(inputs, heads, dtype, backend, rope=None, autocast=None):
    """out, stats and the gradients of x, pe, w_qkv, b_qkv through the op's autograd; with `autocast` (a dtype)
    the op runs under torch.autocast, its leaves in `dtype`."""
    # detach + copy: every call gets fresh leaves, whatever dtype and however often `inputs` is reused
    leaves = {k: inputs[k].detach().to(dtype, copy=True).requires_grad_() for k in ("x", "pe", "w", "b")
              if inputs[k] is not None}
    probes = None if inputs["probes"] is None else inputs["probes"].to(dtype)
    with torch.autocast(inputs["x"].device.type, dtype=autocast, enabled=autocast is not None):
        out, stats = pe_attention(leaves["x"], leaves.get("pe"), leaves["w"], leaves.get("b"), heads, probes,
                                  rope=rope, backend=backend)
    out.backward(inputs["grad"].to(dtype))
    return {"out": out.detach(), "stats": stats, **{"d" + k: t.grad for k, t in leaves.items()}}
