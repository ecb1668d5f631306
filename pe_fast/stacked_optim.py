"""One optimizer for a pack of M stacked models, with its own learning rate, weight decay and momentum per model.

Every parameter of a pack carries the model axis first ([M, ...]), and Adam, AdamW and SGD are elementwise, so one
update of the stacked tensors is M independent updates once each model's numbers are broadcast along that axis
([M] -> [M, 1, ..., 1]). StackedOptimizer does this and follows torch.optim.Adam, AdamW and SGD (dampening 0, no
Nesterov) model by model: the same formulas, in the same order, with the same bias corrections.

The schedule. Each model's base rate lives in param_groups[i]["model_lr"]; param_groups[i]["lr"] holds the
schedule's factor, 1.0 at construction. Model m's rate at a step is model_lr[m] × group["lr"], so
LambdaLR(optimizer, f), which sets group["lr"] = initial_lr × f(step) = f(step), scales every model's own base
rate. current_lrs() gives the rates themselves.

Leaving models out. step(live=mask) updates only the models the mask marks (fp16's loss scaling skips the step of a
model whose gradients overflowed: precision.LossScaler); the others keep their parameters, moments and Adam step
count, whatever their gradients hold. The mask stays on the device (no host sync), so it enters as per-model
factors: zero rate and decay, moment factors of 1, and from that first masked step on each model keeps its own
bias-correction powers β₁ᵗ, β₂ᵗ (products of β, rounded alike at every position of a pack, where torch's pow on a
vector is not). Without a mask the step is torch's, bit for bit as before, for float32 and float64 parameters; in
bf16 or fp16 the per-model rate and decay factors are rounded to the parameters' dtype, where torch keeps its
Python-float scalars in float32 (pe_fast trains float32 parameters, autocast or not).

Speed. An Adam step is nine torch._foreach_* calls over all of a group's tensors, where torch's fused Adam makes one
pass: on the CPU about 3× the fused step's time, under 1 % of a training step of the fMRI pack
(bench/training/bench_stacked_optimizer.py). On CUDA the calls whose operand is a per-model vector take foreach's
per-tensor path (a kernel per tensor), the others one kernel per chunk of tensors.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

STATES = {"adamw": 2, "adam": 2, "sgd": 1}  # the optimizer kinds and the state tensors each keeps per parameter
KINDS = tuple(STATES)
PER_MODEL = ("model_lr", "model_weight_decay", "model_momentum")

PerModel = float | Sequence[float] | Tensor


def per_model_values(name: str, value: PerModel, num_models: int) -> list[float]:
    """One float per model, checked; a single number stands for every model."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().tolist()
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.dtype.kind in "fiu" else list(value)  # text or bools: refused below
    not_numbers = (bool, np.bool_, str, bytes)  # float("111") and float(True) would take them as numbers
    # a dict gave its keys, a set its items in no order
    if isinstance(value, not_numbers) or not isinstance(value, (numbers.Real, Sequence)) or (not isinstance(
            value, numbers.Real) and any(
            isinstance(v, not_numbers) for v in (value if isinstance(value, Sequence) else ()))):
        raise TypeError(f"{name} takes one number, or one number per model; got {value!r:.60}")
    if isinstance(value, numbers.Real):
        values = [float(value)] * num_models
    else:
        try:
            values = [float(v) for v in value]
        except (TypeError, ValueError):
            raise ValueError(f"{name} takes one number, or one number per model; got {value!r}") from None
    if len(values) != num_models:
        raise ValueError(f"{name} has {len(values)} values for a pack of {num_models} models: give one per model "
                         f"(the length of the parameters' leading model axis), or one number for all")
    for m, v in enumerate(values):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number ≥ 0; model {m} has {v}")
    return values


def along_model_axis(vector: Tensor, tensors: list[Tensor]) -> list[Tensor]:
    """vector [M] viewed as [M, 1, ..., 1] for each of `tensors`, to broadcast along its model axis; a matrix
    [len(tensors), M] gives each tensor its own row."""
    if vector.dim() == 2:
        return [row.view(-1, *(1,) * (t.dim() - 1)) for row, t in zip(vector, tensors, strict=True)]
    views = {dim: vector.view(-1, *(1,) * (dim - 1)) for dim in {t.dim() for t in tensors}}
    return [views[t.dim()] for t in tensors]


MOMENTS = ("exp_avg", "exp_avg_sq", "momentum_buffer")  # the optimizers' running moments, each of its weight's shape
# each kind's keys of a parameter's state: Adam's step count until a model skips a step, then each model's powers
ADAM_STATE = {"step", "beta_powers", "exp_avg", "exp_avg_sq"}
STATE_KEYS = {"adam": ADAM_STATE, "adamw": ADAM_STATE, "sgd": {"momentum_buffer"}}


def moments_problem(entry: dict, weight: Tensor | None) -> str | None:
    """What in one parameter's saved moments (torch's optimizers' or StackedOptimizer's) no training leaves, or
    None: a second moment below 0 (no gradient's square), a moment not finite where its weight is (a gradient that
    is not finite leaves its weight not finite in the same step)."""
    if isinstance(squares := entry.get("exp_avg_sq"), Tensor) and bool((squares < 0).any()):
        return "exp_avg_sq below 0: no gradient's square"
    for key in MOMENTS:
        moment = entry.get(key)
        if isinstance(weight, Tensor) and isinstance(moment, Tensor) and moment.shape == weight.shape and bool(
                (~moment.isfinite() & weight.isfinite()).any()):
            return f"{key} not finite where its weight is: no training leaves that"
    return None


def stacked_state_problem(entry, param: Tensor, kind: str) -> str | None:
    """What in one parameter's saved StackedOptimizer state this optimizer cannot step from, or None: its kind's
    keys only, moments of the parameter's shape (moments_problem), a whole step count ≥ 0 or each model's powers
    of the betas in [0, 1]."""
    if not isinstance(entry, dict):
        return f"a state of type {type(entry).__name__}"
    if unknown := sorted(set(map(str, entry)) - STATE_KEYS[kind]):
        return f"keys {unknown[:3]} no {kind} state holds"
    for key in MOMENTS:
        if key in entry and not (isinstance(entry[key], Tensor) and entry[key].is_floating_point()
                                 and entry[key].shape == param.shape):
            return f"{key} that is not a floating tensor of its parameter's shape {list(param.shape)}"
    if kind != "sgd" and not {"exp_avg", "exp_avg_sq"} <= set(entry):
        return "no exp_avg and exp_avg_sq"
    step = entry.get("step", 0)
    if not (isinstance(step, numbers.Integral) and not isinstance(step, bool) and step >= 0):
        return f"step {step!r:.20}, not a count"
    powers = entry.get("beta_powers")
    if powers is not None and not (isinstance(powers, Tensor) and powers.shape == (2, len(param))
                                   and bool(((powers >= 0) & (powers <= 1)).all())):
        return "beta_powers that are not two powers of the betas in [0, 1] per model"
    return moments_problem(entry, param)


def check_betas_and_eps(betas, eps) -> None:
    """Adam's betas, two numbers in [0, 1), and its eps, a finite number ≥ 0; or a TypeError / ValueError."""
    if not isinstance(betas, Sequence) or not all(isinstance(beta, numbers.Real)
                                                  and not isinstance(beta, (bool, np.bool_)) for beta in betas):
        raise TypeError(f"betas must be two numbers, got {betas!r:.60}")
    if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
        raise ValueError(f"betas must be two numbers in [0, 1); got {betas}")
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    if not 0.0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite number ≥ 0; got {eps}")


def check_group_numbers(group: dict, kind: str, num_models: int) -> None:
    """A parameter group's numbers, however they came (the constructor, add_param_group, a state dict loaded):
    M values of each per-model number, momentum SGD's and below 1, betas and eps; each replaced by its checked
    list. A TypeError / ValueError naming the number otherwise."""
    for name in PER_MODEL:
        group[name] = per_model_values(name.removeprefix("model_"), group[name], num_models)
    if kind != "sgd" and any(group["model_momentum"]):
        raise ValueError(f"momentum is SGD's; {kind} takes its momentum from betas[0]")
    if any(v >= 1 for v in group["model_momentum"]):
        raise ValueError(f"momentum must be below 1; got {group['model_momentum']}")
    check_betas_and_eps(group["betas"], group["eps"])
    check_schedule_factor(group.get("lr", 1.0))


def check_schedule_factor(factor) -> None:
    """A group's lr, the schedule's factor on every model's rate (a scheduler sets it each step: a LambdaLR may
    return NaN or -1), a finite number ≥ 0; or ValueError."""
    if not (isinstance(factor, numbers.Real) and not isinstance(factor, bool) and 0 <= factor < math.inf):
        raise ValueError(f"lr (the schedule's factor on every model's rate) must be a finite number ≥ 0; got "
                         f"{factor!r:.40}")


class StackedOptimizer(torch.optim.Optimizer):
    """Adam, AdamW or SGD over stacked parameters [M, ...], with lr, weight_decay and momentum per model.

    lr, weight_decay, momentum: one number for every model, or one per model (a sequence or a 1-D tensor of
    length M). AdamW decays decoupled (p ← p·(1 − lr_m·wd_m)), Adam and SGD add wd_m·p to the gradient. momentum
    is SGD's (buf ← μ_m·buf + g; the first step buf = g); Adam's is betas[0].
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], kind: str, lr: PerModel,
                 weight_decay: PerModel = 0.0, momentum: PerModel = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if kind not in KINDS:
            raise ValueError(f"unknown optimizer kind {kind!r}; choose from {', '.join(KINDS)}")
        if isinstance(betas, (np.ndarray, Tensor)):
            betas = tuple(betas.tolist())
        self.kind = kind
        # The device copies of the per-model values, made once: {(name, values, device): float64 [M]}
        self._on_device: dict[tuple, Tensor] = {}
        defaults = dict(lr=1.0, model_lr=lr, model_weight_decay=weight_decay, model_momentum=momentum,
                        betas=tuple(betas), eps=eps, kind=kind)
        super().__init__(params, defaults)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._on_device = {}

    def add_param_group(self, param_group: dict) -> None:
        """Checks the group before adding it: every parameter [M, ...] with one M, and M values of each number."""
        params = param_group["params"]
        params = param_group["params"] = [params] if isinstance(params, Tensor) else list(params)
        leading = {p.shape[0] if p.dim() else "none (0-d)" for p in params}
        if len(leading) > 1 or not all(isinstance(size, int) for size in leading):
            raise ValueError(f"every parameter needs the model axis first, [M, ...], with the same M; got leading "
                             f"sizes {sorted(leading, key=str)}")
        if (odd := next((p for p in params if not p.is_floating_point()), None)) is not None:  # never moved
            raise TypeError(f"every parameter must be a floating tensor; got one of {odd.dtype}")
        num_models = leading.pop() if leading else 0
        if self.param_groups and num_models != len(self.param_groups[0]["model_lr"]):  # step(live=) mixed them
            raise ValueError(f"every parameter group needs the first one's model count "
                             f"{len(self.param_groups[0]['model_lr'])}, got leading size {num_models}")
        for name in (*PER_MODEL, "betas", "eps"):
            param_group.setdefault(name, self.defaults[name])
        check_group_numbers(param_group, self.kind, num_models)
        super().add_param_group(param_group)

    def current_lrs(self) -> list[float]:
        """Each model's learning rate at the next step (of the first group): its base rate × the schedule's
        factor."""
        group = self.param_groups[0]
        return [lr * group["lr"] for lr in group["model_lr"]]

    def load_state_dict(self, state_dict: dict) -> None:
        """Refuses, before changing anything, a state of another kind or of a pack of another size, or one this
        optimizer could not step from (stacked_state_problem)."""
        saved_groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if not isinstance(saved_groups, list) or len(saved_groups) != len(self.param_groups) or not all(
                isinstance(saved, dict) for saved in saved_groups):
            raise ValueError(f"this optimizer state has no list of {len(self.param_groups)} parameter groups")
        for group, saved in zip(self.param_groups, saved_groups):
            if saved.get("kind") != self.kind or not all(name in saved for name in PER_MODEL):
                raise ValueError(f"this optimizer state is not a {self.kind} StackedOptimizer's (kind "
                                 f"{saved.get('kind')!r}); build the optimizer that wrote it")
            if not isinstance(saved["model_lr"], Sequence) or len(saved["model_lr"]) != len(group["model_lr"]):
                raise ValueError(f"this optimizer state is for {len(saved['model_lr'])!r:.20} models; this pack has "
                                 f"{len(group['model_lr'])}")
            try:  # the constructor's rules, on a copy: nothing changes before every group passes
                check_group_numbers({**saved}, self.kind, len(group["model_lr"]))
            except (TypeError, ValueError, KeyError) as error:
                raise ValueError(f"this optimizer state holds numbers no StackedOptimizer takes: {error}") from None
            saved_params = saved.get("params")
            if not isinstance(saved_params, list) or len(saved_params) != len(group["params"]):
                raise ValueError("this optimizer state lists another number of parameters than this optimizer")
            states = state_dict.get("state")
            for index, param in zip(saved_params, group["params"]):
                entry = states.get(index) if isinstance(states, dict) else None
                if entry is not None and (problem := stacked_state_problem(entry, param, self.kind)) is not None:
                    raise ValueError(f"this optimizer state's parameter {index!r:.20} holds {problem}")
        super().load_state_dict(state_dict)
        # torch casts a parameter's state to the parameter's dtype: the powers go back to float64, as saved
        params = [p for group in self.param_groups for p in group["params"]]
        saved_ids = [i for group in saved_groups for i in group["params"]]
        for p, i in zip(params, saved_ids):
            if "beta_powers" in state_dict["state"].get(i, {}):
                self.state[p]["beta_powers"] = state_dict["state"][i]["beta_powers"].to(p.device, torch.float64)

    @torch.no_grad()
    def step(self, closure=None, live: Tensor | None = None):
        """One update of every model, or with `live` (bool [M], on the parameters' device) of the models it marks:
        a model left out keeps its parameters and optimizer state, whatever its gradients hold."""
        if live is not None:
            self._check_live(live)
        for group in self.param_groups:  # set since the constructor: a scheduler sets the factor each step
            check_schedule_factor(group["lr"])
            check_betas_and_eps(group["betas"], group["eps"])
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for (phase, _, _), params in self._batches(group, per_model=live is not None).items():
                grads = [p.grad for p in params]
                if live is not None:  # a left-out model's inf or NaN must reach nothing (0·inf is NaN)
                    grads = [g.where(keep, 0) for g, keep in zip(grads, along_model_axis(live, grads))]
                states = [self.state[p] for p in params]
                if self.kind == "sgd":
                    self._sgd_update(group, params, grads, states, first=not phase, live=live)
                else:
                    self._adam_update(group, params, grads, states, step=phase, live=live)
        return loss

    def _batches(self, group: dict, per_model: bool) -> dict[tuple, list[Tensor]]:
        """The group's parameters with a gradient, in batches that one foreach call can take: one device, one
        dtype, and one phase: Adam's step count (bias corrections; None once each model counts its own), or
        whether SGD's momentum buffer exists."""
        batches: dict[tuple, list[Tensor]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError("StackedOptimizer does not take sparse gradients")
            state = self.state[p]
            if self.kind == "sgd":
                phase = "momentum_buffer" in state
            else:
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if "step" in state and per_model:  # the shared count so far becomes each model's powers
                    step, (beta1, beta2) = state.pop("step"), group["betas"]
                    state["beta_powers"] = torch.tensor([[beta1 ** step], [beta2 ** step]], dtype=torch.float64,
                                                        device=p.device).expand(2, len(p)).clone()
                if "step" in state:
                    state["step"] += 1
                phase = state.get("step")
            batches.setdefault((phase, p.device, p.dtype), []).append(p)
        return batches

    def _vector(self, group: dict, name: str, device: torch.device) -> Tensor:
        """group[name] as a float64 tensor on `device`. float64 and on the device: the per-step arithmetic on
        it rounds like torch's on Python floats, and needs no copy from the host per step."""
        key = (name, tuple(group[name]), device)
        if key not in self._on_device:  # new values: set in the group since, held to the constructor's rules
            per_model_values(name.removeprefix("model_"), group[name], len(group[name]))
            self._on_device[key] = torch.tensor(group[name], dtype=torch.float64, device=device)
        return self._on_device[key]

    def _check_live(self, live):
        """live: a bool tensor [M] on the parameters' device (every step with a mask: the first parameter's)."""
        if not isinstance(live, Tensor) or live.dtype != torch.bool:
            raise TypeError(f"live must be a bool tensor [M], got "
                            f"{live.dtype if isinstance(live, Tensor) else type(live).__name__}")
        first = next((group["params"][0] for group in self.param_groups if group["params"]), None)
        models = len(self.param_groups[0]["model_lr"]) if self.param_groups else 0
        if tuple(live.shape) != (models,) or (first is not None and live.device != first.device):
            raise ValueError(f"live must be [M] = [{models}] on {first.device if first is not None else 'any device'}"
                             f", got {list(live.shape)} on {live.device}")

    def _rates(self, group: dict, device: torch.device, live: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Each model's learning rate at this step and its weight decay (None where no model has any), both 0
        for a model left out."""
        lr = self._vector(group, "model_lr", device) * group["lr"]
        decay = self._vector(group, "model_weight_decay", device) if any(group["model_weight_decay"]) else None
        if live is not None:
            lr, decay = lr * live, None if decay is None else decay * live
        return lr, decay

    def _adam_update(self, group: dict, params: list[Tensor], grads: list[Tensor], states: list[dict],
                     step: int | None, live: Tensor | None):
        beta1, beta2 = group["betas"]
        device, dtype = params[0].device, params[0].dtype
        if step is None and live is None:  # each model counts its own steps (an earlier step left some out)
            live = torch.ones(len(group["model_lr"]), dtype=torch.bool, device=device)
        lr, decay = self._rates(group, device, live)
        if decay is not None:
            if self.kind == "adamw":
                torch._foreach_mul_(params, along_model_axis((1 - lr * decay).to(dtype), params))
            else:
                # L2 decay joins the gradient in a new tensor: p.grad stays the loss's gradient, as in torch
                grads = torch._foreach_addcmul(grads, params, along_model_axis(decay.to(dtype), params))
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        if live is None:
            weight1, factor2 = 1 - beta1, beta2
            bias_correction1 = 1 - beta1 ** step
            bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        else:  # a left-out model: lerp weight 0 and factor 1 keep its moments, factors 1 its powers
            factors = torch.where(live, self._vector(group, "betas", device)[:, None], 1.0)  # [2, M]: β or 1
            weight1 = along_model_axis((1 - factors[0]).to(dtype), params)
            factor2 = along_model_axis(factors[1].to(dtype), params)
            powers = [s["beta_powers"] for s in states]
            torch._foreach_mul_(powers, [factors] * len(powers))
            # [len(params), 2, M]; a model that has never stepped has no correction yet (its rate is 0 anyway)
            corrections = (1 - torch.stack(powers)).masked_fill_(~live, 1.0)
            bias_correction1 = corrections[:, 0]
            bias_correction2_sqrt = along_model_axis(corrections[:, 1].sqrt().to(dtype), params)
        torch._foreach_lerp_(exp_avgs, grads, weight1)
        torch._foreach_mul_(exp_avg_sqs, factor2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denoms, bias_correction2_sqrt)
        torch._foreach_add_(denoms, group["eps"])
        # p += (−step size · m) / denom: torch's addcdiv(m, denom, value=−step size) rounds in the same order
        steps = torch._foreach_mul(exp_avgs, along_model_axis((-(lr / bias_correction1)).to(dtype), params))
        torch._foreach_addcdiv_(params, steps, denoms)

    def _sgd_update(self, group: dict, params: list[Tensor], grads: list[Tensor], states: list[dict], first: bool,
                    live: Tensor | None):
        device, dtype = params[0].device, params[0].dtype
        lr, decay = self._rates(group, device, live)
        if decay is not None:
            grads = torch._foreach_addcmul(grads, params, along_model_axis(decay.to(dtype), params))
        if any(group["model_momentum"]):
            # A model with momentum 0 gets buf = 0·buf + g = g: plain SGD, as torch's without a buffer
            if first:
                buffers = [g.detach().clone() for g in grads]
                for state, buffer in zip(states, buffers):
                    state["momentum_buffer"] = buffer
            else:
                buffers = [s["momentum_buffer"] for s in states]
                momentum = self._vector(group, "model_momentum", device)
                if live is not None:  # a left-out model's buffer: 1·buf + 0
                    momentum = momentum.masked_fill(~live, 1.0)
                torch._foreach_mul_(buffers, along_model_axis(momentum.to(dtype), buffers))
                torch._foreach_add_(buffers, grads)
            grads = buffers
        torch._foreach_addcmul_(params, grads, along_model_axis((-lr).to(dtype), params))
