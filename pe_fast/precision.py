"""The arithmetic a training run uses: fp32, tf32 or bf16, the one place that knows what each means.

* fp32: float32 everywhere (matmuls and the fused op's dots in full float32).
* tf32: float32 tensors, torch's matmuls on TF32 tensor cores (CUDA only). The fused op's Triton kernels keep
  IEEE float32 dots: their TF32 path (PE_FAST_TF32=1) adds only 4 % to the compiled LST sweep step (4,396 against
  4,211 model-steps/s on an H200, bench/results/h200-20261127-tf32-science), not worth a second rounding.
* bf16: autocast to bfloat16 for matmuls and the fused op (which takes bf16 directly); weights, gradients,
  optimizer state, layer norms, the loss and the attention statistics stay float32, and so does the PE's share of
  q, k, v (pe @ W + b) until it is added to x @ W (pe_fast.ops.projection says why).
"""
from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "tf32", "bf16")


def default(device: torch.device) -> str:
    """What a run uses when --precision is not given: fp32, the reference, on every device. On an H200 (compiled)
    bf16 trains the paper's LST step 3.4× and tf32 2.0× faster, but in the science checks (docs/reproduction.md,
    "Precision") bf16 generalised worse at σ = 2.0 in two of three runs, and tf32's σ = 2.0 training fit fell
    1.9 points short of fp32's (the issue's test allows 1)."""
    return "fp32"


def problem(precision: str, device: torch.device) -> str | None:
    """Why this precision cannot run on this device, or None."""
    if precision not in PRECISIONS:
        return f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}"
    if precision == "tf32" and device.type != "cuda":
        return "tf32 is a CUDA tensor-core mode; on the CPU use fp32 (or bf16)"
    return None


def apply(precision: str) -> None:
    """Process-wide switch: whether torch's float32 matmuls may use TF32."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast(precision: str, device: torch.device):
    """The context a forward pass and its loss run in."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
