"""The arithmetic a training run uses: fp32, tf32, bf16 or fp16, the one place that knows what each means.

* fp32: float32 everywhere (matmuls and the fused op's dots in full float32).
* tf32: float32 tensors, torch's matmuls on TF32 tensor cores (CUDA only). The fused op's Triton kernels keep
  IEEE float32 dots: their TF32 path (PE_FAST_TF32=1) adds only 4 % to the compiled LST sweep step (4,396 against
  4,211 model-steps/s on an H200, bench/results/h200-20261127-tf32-science), not worth a second rounding.
* bf16: autocast to bfloat16 for matmuls and the fused op (which takes bf16 directly); weights, gradients,
  optimizer state, layer norms, the loss and the attention statistics stay float32, and so does the PE's share of
  q, k, v (pe @ W + b) until it is added to x @ W (pe_fast.ops.projection says why).
* fp16: the same with float16, whose 10 mantissa bits (bf16: 7) resolve small PE changes better but whose 5
  exponent bits let small gradients underflow: the loss is scaled, one dynamic scale per model (LossScaler). On CUDA
  the fused op's Triton kernels take float32 and bf16 only: fp16 runs its reference (a logged warning).
"""
from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from pe_fast.stacked_optim import along_model_axis

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the autocast dtypes
SCALED = ("fp16",)  # the precisions whose loss is scaled (LossScaler)
# torch.amp.GradScaler's: the first scale, and how many clean steps in a row double it
INITIAL_SCALE, GROWTH_INTERVAL = 2.0 ** 16, 2000


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
        return "tf32 is a CUDA tensor-core mode; on the CPU use fp32 (or bf16, fp16)"
    return None


def apply(precision: str) -> None:
    """Process-wide switch: whether torch's float32 matmuls may use TF32."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast(precision: str, device: torch.device):
    """The context a forward pass and its loss run in."""
    if precision in LOW:
        return torch.autocast(device.type, dtype=LOW[precision])
    return contextlib.nullcontext()


class LossScaler:
    """fp16's dynamic loss scaling, one scale per model of a pack, each as torch.amp.GradScaler's for one model.

    The backward runs on Σ_m s_m·L_m, so model m's gradients come out multiplied by s_m, which lifts them above
    float16's underflow; they are divided by s_m before the step. A model whose gradients hold an inf or NaN (its
    scale overflowed float16) skips that step: its parameters, moments and step count stay (StackedOptimizer's
    live mask), its scale halves; the other models step. After `growth_interval` clean steps in a row the scale
    doubles. Scales are powers of 2, so scaling and unscaling are exact, and everything stays on the device: no
    host sync per step. Disabled (every other precision) it is the plain sum and step, as before."""

    def __init__(self, num_models: int, device: torch.device, enabled: bool, growth_interval: int = GROWTH_INTERVAL):
        self.enabled, self.growth_interval = enabled, growth_interval
        self.scale = torch.full((num_models,), INITIAL_SCALE, device=device)
        self.clean = torch.zeros(num_models, dtype=torch.int32, device=device)  # clean steps in a row

    def scaled_loss(self, losses: Tensor) -> Tensor:
        """What the backward runs on, from each model's loss [M]."""
        return (losses * self.scale).sum() if self.enabled else losses.sum()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's step on the unscaled gradients of the models whose gradients are finite; then each
        model's scale follows."""
        if not self.enabled:
            optimizer.step()
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch._foreach_mul_(grads, along_model_axis(self.scale.reciprocal(), grads))
        live = torch.stack([g.reshape(len(g), -1).isfinite().all(1) for g in grads]).all(0)
        optimizer.step(live=live)
        self.clean = torch.where(live, self.clean + 1, 0)
        grow = self.clean == self.growth_interval
        doubled = self.scale * 2
        self.scale = torch.where(live, torch.where(grow & doubled.isfinite(), doubled, self.scale), self.scale / 2)
        self.clean.masked_fill_(grow, 0)

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean": self.clean} if self.enabled else {}

    def load_state_dict(self, state: dict) -> None:
        if self.enabled:
            self.scale, self.clean = (state[key].to(self.scale.device) for key in ("scale", "clean"))
