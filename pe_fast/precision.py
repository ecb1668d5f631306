"""The arithmetic a training run uses: fp32, tf32 or bf16, the one place that knows what each means.

* fp32: float32 everywhere (matmuls and the fused op's dots in full float32).
* tf32: float32 tensors, matmuls and the fused op's dots on TF32 tensor cores (CUDA only).
* bf16: autocast to bfloat16 for matmuls and the fused op (which takes bf16 directly); weights, gradients,
  optimizer state, layer norms, the loss and the attention statistics stay float32.
"""
from __future__ import annotations

import contextlib
import os

import torch

PRECISIONS = ("fp32", "tf32", "bf16")


def default(device: torch.device) -> str:
    """What a run uses when --precision is not given. The CPU stays float32; on CUDA, bf16 (evidence:
    docs/reproduction.md, bench/results/)."""
    return "bf16" if device.type == "cuda" else "fp32"


def problem(precision: str, device: torch.device) -> str | None:
    """Why this precision cannot run on this device, or None."""
    if precision not in PRECISIONS:
        return f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}"
    if precision == "tf32" and device.type != "cuda":
        return "tf32 is a CUDA tensor-core mode; on the CPU use fp32 (or bf16)"
    return None


def apply(precision: str) -> None:
    """Process-wide switches: whether float32 matmuls (torch's and the Triton kernels') may use TF32."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if tf32:
        os.environ["PE_FAST_TF32"] = "1"
    else:
        os.environ.pop("PE_FAST_TF32", None)


def autocast(precision: str, device: torch.device):
    """The context a forward pass and its loss run in."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
