"""The empirical neural tangent kernel (eNTK) of every model of a pack, on a fixed probe set (issue 52).

Θ = J Jᵀ, where J holds the gradients of the model's outputs on the probe items with respect to its parameters
(Jacot et al. 2018). A model that trains lazily keeps its initial kernel; a rich one moves it (Fort et al., NeurIPS
2020, "Deep learning versus kernel learning"). An item's outputs (the fMRI task: 100 tokens × the window) are
reduced to OUTPUTS_PER_ITEM fixed random projections, so Θ is [P·O, P·O] per model. Two kernels: over all
parameters, and over the learned PE alone (Θ_all = Θ_PE + Θ_rest). Per evaluation:

* ntk_distance / ntk_pe_distance: 1 − ⟨Θ₀, Θₜ⟩ / (‖Θ₀‖ ‖Θₜ‖) from the step-0 kernel (0: the kernel did not move);
* ntk_velocity / ntk_pe_velocity: the same distance between this evaluation's kernel and the previous one's, per
  1,000 steps between them;
* ntk_alignment / ntk_pe_alignment: the kernel–target alignment yᵀΘy / (‖Θ‖ ‖y‖²) (Cristianini et al. 2002),
  y the projected target direction: minus the task loss's gradient at a zero output, which is the masked target
  values for a squared error and the class-centred one-hot targets for cross-entropy.

The gradients come from one forward per probe item and one backward per projection: every model's parameters have
the model axis first, so the gradient of the outputs summed over the pack's models is each model's own gradient
in its slice. Cost per evaluation: P forwards and P·O backwards of a batch of one item; memory: P·O gradients of
the pack's parameters.
"""
from __future__ import annotations

import torch
from torch import Tensor

from pe_fast import columns as names
from pe_fast.seeds import NTK_PROJECTION_SEED

OUTPUTS_PER_ITEM = 4  # random projections of an item's outputs: rows of the kernel per item
VELOCITY_STEPS = 1000  # the velocity's unit: distance per this many steps


def output_projection(output_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The fixed random projection of an item's flattened outputs, [OUTPUTS_PER_ITEM, output_size]: the same in
    every run (NTK_PROJECTION_SEED), unit variance per projected value."""
    generator = torch.Generator().manual_seed(NTK_PROJECTION_SEED)
    projection = torch.randn(OUTPUTS_PER_ITEM, output_size, generator=generator, dtype=torch.float64)
    return (projection / output_size ** 0.5).to(device=device, dtype=dtype)


def pe_parameters(model) -> list[Tensor]:
    """The learned PE's tables (empty for a PE without parameters)."""
    if model.config.pe != "learned":
        return []
    return list(model.absolute.parameters())


def jacobians(model, tokens: Tensor, probes: Tensor | None, projection: Tensor) -> tuple[Tensor, Tensor]:
    """Each model's Jacobian of its projected outputs on the items tokens [P, N, token_dim], split into the PE's
    columns and the other parameters' columns: ([M, P·O, n_PE], [M, P·O, n_rest]); rows item-major."""
    M = model.num_models
    pe_ids = {id(p) for p in pe_parameters(model)}
    params = [p for p in model.parameters() if p.requires_grad]
    pe_rows, rest_rows = [], []
    was_training = model.training
    model.eval()
    try:
        for item in tokens:
            outputs, _ = model(item[None, None].expand(M, 1, *item.shape), probes)
            projected = outputs.reshape(M, -1) @ projection.T  # [M, O]
            for o in range(projection.shape[0]):
                grads = torch.autograd.grad(projected[:, o].sum(), params, retain_graph=o < projection.shape[0] - 1,
                                            materialize_grads=True)
                flat = [(id(p) in pe_ids, g.reshape(M, -1)) for p, g in zip(params, grads, strict=True)]
                pe_rows.append(torch.cat([g for is_pe, g in flat if is_pe] or [outputs.new_zeros(M, 0)], 1))
                rest_rows.append(torch.cat([g for is_pe, g in flat if not is_pe], 1))
    finally:
        model.train(was_training)
    return torch.stack(pe_rows, 1).detach(), torch.stack(rest_rows, 1).detach()


def tangent_kernels(model, tokens: Tensor, probes: Tensor | None, projection: Tensor) -> dict[str, Tensor]:
    """{"all": Θ over all parameters, "pe": Θ over the learned PE}, each [M, P·O, P·O] (float64)."""
    pe_jacobian, rest_jacobian = jacobians(model, tokens, probes, projection)
    pe_kernel = (pe_jacobian @ pe_jacobian.transpose(1, 2)).double()
    return {"all": pe_kernel + (rest_jacobian @ rest_jacobian.transpose(1, 2)).double(), "pe": pe_kernel}


def kernel_distance(a: Tensor, b: Tensor) -> Tensor:
    """1 − ⟨a, b⟩_F / (‖a‖_F ‖b‖_F) per model of kernels [M, R, R]: 0 for kernels equal up to scale."""
    inner = (a * b).sum((1, 2))
    # clamped: rounding takes equal kernels a few ulps below 0
    return (1 - inner / (torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b))).clamp_min(0)


def target_alignment(kernel: Tensor, target: Tensor) -> Tensor:
    """yᵀΘy / (‖Θ‖_F ‖y‖²) per model of kernels [M, R, R] and targets [M, R]."""
    quadratic = torch.einsum("mr,mrs,ms->m", target, kernel, target)
    return quadratic / (torch.linalg.matrix_norm(kernel) * (target ** 2).sum(1))


def target_direction(task, outputs_shape: tuple[int, ...], targets, dtype: torch.dtype, device: torch.device
                     ) -> Tensor:
    """Minus the gradient of the task's loss at a zero output, [M, P, *out]: where the outputs should go."""
    zero = torch.zeros(outputs_shape, dtype=dtype, device=device, requires_grad=True)
    (gradient,) = torch.autograd.grad(task.loss(zero, targets).sum(), zero)
    return -gradient


class TangentKernelProbe:
    """A pack's eNTK on `tokens` [P, N, token_dim] (the same items for every model) and `targets` (the task's
    targets of those items, as its loss takes them), at step 0 and at each evaluation. Build it on the freshly
    initialised pack: the step-0 kernel follows from the seeds, so a resumed pack rebuilds it; the previous
    evaluation's kernels travel in the checkpoint (state_dict), for the velocity."""

    def __init__(self, model, task, tokens: Tensor, targets, probes: Tensor | None):
        self.tokens, self.probes = tokens, probes
        M = model.num_models
        with torch.no_grad():
            out_shape = model(tokens[:1].expand(M, *tokens[:1].shape), probes)[0].shape[1:]
        output_size = out_shape[1:].numel()
        self.projection = output_projection(output_size, tokens.dtype, tokens.device)
        direction = target_direction(task, (M, len(tokens), *out_shape[1:]), targets, tokens.dtype, tokens.device)
        self.target = (direction.reshape(M, len(tokens), output_size) @ self.projection.T).reshape(M, -1).double()
        self.has_pe = bool(pe_parameters(model))
        self.initial = tangent_kernels(model, tokens, probes, self.projection)
        self.previous: dict | None = None  # {"step": int, "kernels": {...}} of the last evaluation

    def state_dict(self) -> dict:
        return {"previous": self.previous}

    def load_state_dict(self, state: dict):
        self.previous = state["previous"]

    def measure(self, model, step: int) -> list[dict[str, float]]:
        """One row of metrics per model."""
        now = tangent_kernels(model, self.tokens, self.probes, self.projection)
        moved = {}
        for kind, (distance, velocity, alignment) in {
                "all": (names.NTK_DISTANCE, names.NTK_VELOCITY, names.NTK_ALIGNMENT),
                "pe": (names.NTK_PE_DISTANCE, names.NTK_PE_VELOCITY, names.NTK_PE_ALIGNMENT)}.items():
            if kind == "pe" and not self.has_pe:
                continue
            moved[distance] = kernel_distance(self.initial[kind], now[kind])
            moved[alignment] = target_alignment(now[kind], self.target)
            if self.previous is not None and step > self.previous["step"]:
                between = kernel_distance(self.previous["kernels"][kind].to(now[kind]), now[kind])
                moved[velocity] = between * VELOCITY_STEPS / (step - self.previous["step"])
            else:
                moved[velocity] = torch.full_like(moved[distance], float("nan"))
        self.previous = {"step": step, "kernels": {kind: kernel.cpu() for kind, kernel in now.items()}}
        return [{name: float(values[m]) for name, values in moved.items()} for m in range(model.num_models)]
