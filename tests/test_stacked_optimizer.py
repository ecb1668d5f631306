"""StackedOptimizer: a pack with per-model lr, weight decay and momentum trains each model exactly as torch.optim
trains that model alone."""
import io

import numpy as np
import pytest
import torch

from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.stacked_optim import StackedOptimizer
from pe_fast.train import TrainConfig, lr_factor

M = 6
# The ranks of a pack's weights, biases and PE tables; rows of 40 take the CPU kernels' vectorised loops, of 7
# and 1 their scalar tails.
SHAPES = [(M, 16, 40), (M, 7), (M, 3, 4, 2), (M, 1)]
LEARNING_RATES = {"adamw": (1e-3, 3e-3, 1e-2), "adam": (1e-3, 3e-3, 1e-2), "sgd": (1e-2, 3e-2, 1e-1)}
WEIGHT_DECAYS = (0.0, 0.1)
SGD_MOMENTUM = 0.9
SCHEDULE = TrainConfig(steps=50, warmup=10, schedule="cosine")  # linear warm-up, then cosine decay
TORCH_OPTIMIZERS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
# After 50 steps a model's weights in the pack and alone agree to float32 rounding. Both sides apply the same
# formulas to the same float32 numbers in the same order (the per-model factors are computed in float64 and rounded
# once, as torch rounds its Python-float scalars), and measured on the CPU (torch 2.13) they are bit-identical
# for all three kinds, as they are with torch's fused Adam/AdamW. The tolerance leaves room for what may differ
# elsewhere: a kernel that fuses a multiply-add (torch's add(alpha=) against our multiply, then add) or a GPU's
# reassociation, a few float32 ulps per step, accumulating over 50 steps on weights of order 1.
RTOL, ATOL = 1e-5, 1e-6


def grid_values(kind: str) -> tuple[list[float], list[float]]:
    """Model m's lr and weight decay: three rates × two decays over the six models."""
    return ([LEARNING_RATES[kind][m % 3] for m in range(M)], [WEIGHT_DECAYS[m // 3] for m in range(M)])


def initial_weights() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g) for shape in SHAPES]


def gradient_noise(steps: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [[torch.randn(shape, generator=g) for shape in SHAPES] for _ in range(steps)]


def set_gradients(params, noise, model: slice | int = slice(None)):
    """The gradient of 0.25·‖p‖² plus noise: it depends on the weights, so the trajectories feed back, and it is
    elementwise, so a model's gradient is bit for bit the same in the pack and alone."""
    for p, n in zip(params, noise):
        p.grad = 0.5 * p.detach() + n[model]


def train(optimizer, params, noise, steps: range, model=slice(None), scheduler=None):
    scheduler = scheduler or torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, SCHEDULE))
    for step in steps:
        set_gradients(params, noise[step], model)
        optimizer.step()
        scheduler.step()
    return scheduler


def stacked_optimizer(kind, params, lrs, decays):
    return StackedOptimizer(params, kind, lr=lrs, weight_decay=decays,
                            momentum=SGD_MOMENTUM if kind == "sgd" else 0.0)


def pack_and_models_alone(kind: str, steps: int = 50):
    """The mixed pack's weights after `steps` steps, and each model's trained alone with torch.optim (one tensor
    at a time: foreach=False) on the same gradients and schedule."""
    lrs, decays = grid_values(kind)
    noise = gradient_noise(steps)
    pack = [w.requires_grad_() for w in initial_weights()]
    train(stacked_optimizer(kind, pack, lrs, decays), pack, noise, range(steps))
    models_alone = []
    for m in range(M):
        alone = [w[m].clone().requires_grad_() for w in initial_weights()]
        extra = dict(momentum=SGD_MOMENTUM) if kind == "sgd" else {}
        reference = TORCH_OPTIMIZERS[kind](alone, lr=lrs[m], weight_decay=decays[m], foreach=False, **extra)
        train(reference, alone, noise, range(steps), model=m)
        models_alone.append(alone)
    return pack, models_alone


@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd"])
def test_each_model_of_a_mixed_pack_trains_as_alone_with_torch(kind):
    pack, models_alone = pack_and_models_alone(kind)
    for m, alone in enumerate(models_alone):
        for p_pack, p_alone in zip(pack, alone):
            torch.testing.assert_close(p_pack[m], p_alone, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd"])
def test_every_model_moves_by_its_own_rate(kind):
    lrs, decays = grid_values(kind)
    noise = gradient_noise(5)
    pack = [w.requires_grad_() for w in initial_weights()]
    train(stacked_optimizer(kind, pack, lrs, decays), pack, noise, range(5))
    moved = [sum((p[m] - w[m]).abs().sum().item() for p, w in zip(pack, initial_weights())) for m in range(M)]
    assert moved[0] < moved[1] < moved[2] and moved[3] < moved[4] < moved[5]


@pytest.mark.parametrize("kind", ["adamw", "adam"])
def test_one_value_for_all_models_matches_torch_fused_on_the_stacked_tensors(kind):
    noise = gradient_noise(50)
    ours = [w.requires_grad_() for w in initial_weights()]
    fused = [w.requires_grad_() for w in initial_weights()]
    train(StackedOptimizer(ours, kind, lr=3e-3, weight_decay=0.1), ours, noise, range(50))
    train(TORCH_OPTIMIZERS[kind](fused, lr=3e-3, weight_decay=0.1, fused=True), fused, noise, range(50))
    for p_ours, p_fused in zip(ours, fused):
        torch.testing.assert_close(p_ours, p_fused, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd"])
def test_state_dict_roundtrip_continues_bit_for_bit(kind):
    lrs, decays = grid_values(kind)
    noise = gradient_noise(40)
    uninterrupted = [w.requires_grad_() for w in initial_weights()]
    train(stacked_optimizer(kind, uninterrupted, lrs, decays), uninterrupted, noise, range(40))

    first = [w.requires_grad_() for w in initial_weights()]
    optimizer = stacked_optimizer(kind, first, lrs, decays)
    scheduler = train(optimizer, first, noise, range(20))
    file = io.BytesIO()
    torch.save({"weights": [p.detach() for p in first], "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}, file)
    file.seek(0)
    saved = torch.load(file)

    resumed = [w.clone().requires_grad_() for w in saved["weights"]]
    # Built with other numbers on purpose: the checkpoint's per-model values and schedule must win.
    optimizer = StackedOptimizer(resumed, kind, lr=1.0, momentum=0.5 if kind == "sgd" else 0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, SCHEDULE))
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    train(optimizer, resumed, noise, range(20, 40), scheduler=scheduler)
    for p_resumed, p_uninterrupted in zip(resumed, uninterrupted):
        assert torch.equal(p_resumed, p_uninterrupted)


def test_group_lr_holds_the_schedule_factor_and_current_lrs_the_rates():
    params = [w.requires_grad_() for w in initial_weights()]
    lrs, _ = grid_values("adam")
    optimizer = StackedOptimizer(params, "adam", lr=lrs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, SCHEDULE))
    train(optimizer, params, gradient_noise(15), range(15), scheduler=scheduler)
    factor = lr_factor(15, SCHEDULE)
    assert optimizer.param_groups[0]["lr"] == factor
    assert optimizer.current_lrs() == [lr * factor for lr in lrs]


@pytest.mark.parametrize("pe, dtype", [("learned", torch.float32), ("relative", torch.float32),
                                       ("learned", torch.float64)])  # float64: a device move, as pe_fast tests one
def test_takes_every_parameter_of_a_stacked_transformer(pe, dtype):
    config = ModelConfig(num_tokens=10, token_dim=2, out_dim=1, width=8, depth=2, heads=2, mlp_width=16, pe=pe)
    model = StackedTransformer(config, seeds=[1, 2, 3], sigmas=[0.1, 0.5, 1.0],
                               coordinates=np.random.rand(10, 3)).to(dtype)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = StackedOptimizer(model.parameters(), "adamw", lr=[1e-3, 1e-2, 1e-1], weight_decay=[0, 0.01, 0.1])
    outputs, _ = model(torch.randn(3, 4, 10, 2, dtype=dtype))
    outputs.square().mean().backward()
    optimizer.step()
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before) if p.grad is not None)


@pytest.mark.parametrize("arguments, message", [
    (dict(lr=[1e-3] * (M - 1)), "lr has 5 values for a pack of 6 models"),
    (dict(lr=torch.full((M + 1,), 1e-3)), "lr has 7 values for a pack of 6 models"),
    (dict(lr=[1e-3, -1e-3, 1e-3, 1e-3, 1e-3, 1e-3]), "lr must be a finite number ≥ 0; model 1 has -0.001"),
    (dict(lr=-1e-3), "lr must be a finite number ≥ 0; model 0 has -0.001"),
    (dict(lr=1e-3, weight_decay=[0.1] * M + [0.1]), "weight_decay has 7 values"),
    (dict(lr=1e-3, weight_decay=float("nan")), "weight_decay must be a finite number ≥ 0"),
    (dict(lr=1e-3, momentum=0.9), "momentum is SGD's; adam takes its momentum from betas[0]"),
    (dict(lr=1e-3, kind="lion"), "unknown optimizer kind 'lion'"),
])
def test_bad_values_are_one_clear_error(arguments, message):
    arguments = {"kind": "adam", **arguments}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        StackedOptimizer([w.requires_grad_() for w in initial_weights()], **arguments)


def test_sgd_momentum_must_be_below_one():
    with pytest.raises(ValueError, match="momentum must be below 1"):
        StackedOptimizer([w.requires_grad_() for w in initial_weights()], "sgd", lr=0.1, momentum=[0.9] * 5 + [1])


def test_a_parameter_without_the_model_axis_is_refused():
    params = [torch.zeros(M, 3, requires_grad=True), torch.zeros(M + 1, 3, requires_grad=True)]
    with pytest.raises(ValueError, match=r"model axis first, \[M, ...\], with the same M; got leading sizes \[6, 7\]"):
        StackedOptimizer(params, "adamw", lr=1e-3)
    with pytest.raises(ValueError, match="model axis first"):
        StackedOptimizer([torch.zeros((), requires_grad=True)], "adamw", lr=1e-3)


def test_a_state_of_another_kind_or_pack_size_is_refused_before_anything_changes():
    adam = StackedOptimizer([w.requires_grad_() for w in initial_weights()], "adam", lr=1e-3)
    sgd = StackedOptimizer([w.requires_grad_() for w in initial_weights()], "sgd", lr=1e-3)
    with pytest.raises(ValueError, match="not a sgd StackedOptimizer's"):
        sgd.load_state_dict(adam.state_dict())
    smaller = StackedOptimizer([torch.zeros(M - 1, 2, requires_grad=True)], "adam", lr=1e-3)
    with pytest.raises(ValueError, match="for 6 models; this pack has 5"):
        smaller.load_state_dict(StackedOptimizer([torch.zeros(M, 2, requires_grad=True)], "adam", lr=1e-3)
                                .state_dict())
    assert sgd.param_groups[0]["kind"] == "sgd" and smaller.param_groups[0]["model_lr"] == [1e-3] * (M - 1)


@pytest.mark.parametrize("live, error, why", [
    ([True, False, True], TypeError, "live must be a bool tensor"),  # AttributeError: 'list' has no 'dim'
    (torch.tensor([1.0, 0.0, 1.0]), TypeError, "live must be a bool tensor"),
    (torch.ones(3, 1, dtype=torch.bool), ValueError, r"live must be \[M\] = \[3\]"),  # zip()'s ValueError
])
def test_a_bad_live_mask_is_named(live, error, why):
    p = torch.randn(3, 4, requires_grad=True)
    optimizer = StackedOptimizer([p], "adam", lr=0.1)
    p.grad = torch.ones_like(p)
    before = p.detach().clone()
    with pytest.raises(error, match=why):
        optimizer.step(live=live)
    assert torch.equal(p, before)


@pytest.mark.parametrize("arguments, why", [(dict(lr="fast"), "lr takes one number, or one number per model"),
                                            (dict(lr="111"), "lr takes one number"), (dict(lr=True), "lr takes"),
                                            (dict(lr=[0.1, True, 0.1]), "lr takes"),
                                            (dict(lr=0.1, eps=True), "eps must be a number")])
def test_numbers_given_as_text_or_bools_are_refused(arguments, why):
    """float('111') and float(True) took them as rates of 111 and 1."""
    with pytest.raises(TypeError, match=why):
        StackedOptimizer([torch.randn(3, 2, requires_grad=True)], "adam", **arguments)


@pytest.mark.parametrize("arguments, why", [(dict(lr=[np.True_, 1e-3]), "lr takes one number"),
                                            (dict(lr=np.array(["1", "2"])), "lr takes one number"),
                                            (dict(lr=1e-3, betas=("0.9", "0.9")), "betas must be two numbers")])
def test_numpy_bools_and_text_are_refused_too(arguments, why):
    with pytest.raises(TypeError, match=why):
        StackedOptimizer([torch.randn(2, 3, requires_grad=True)], "adamw", **arguments)
    optimizer = StackedOptimizer([torch.randn(2, 3, requires_grad=True)], "adamw", lr=np.array([1e-3, 2e-3]),
                                 betas=np.array([0.9, 0.99]))
    assert optimizer.param_groups[0]["model_lr"] == [1e-3, 2e-3] and optimizer.param_groups[0]["betas"] == (0.9, 0.99)


@pytest.mark.parametrize("change, why", [
    (lambda group: group.update(model_lr=[float("nan")] * M), "lr must be a finite number ≥ 0; model 0 has nan"),
    (lambda group: group.update(betas=(2.0, 0.5)), r"betas must be two numbers in \[0, 1\)"),
    (lambda group: group.update(eps=-1.0), "eps must be a finite number ≥ 0"),
    (lambda group: group.update(lr=float("inf")),
     "lr \\(the schedule's factor on every model's rate\\) must be a finite number"),
])
def test_a_state_loaded_is_held_to_the_constructor_s_rules(change, why):
    """load_state_dict took a NaN rate and betas of 2.0, which the constructor refuses, and trained with them
    (issue 55): a state's numbers pass the same checks, before anything changes."""
    optimizer = StackedOptimizer([w.requires_grad_() for w in initial_weights()], "adam", lr=1e-3)
    state = optimizer.state_dict()
    change(state["param_groups"][0])
    with pytest.raises(ValueError, match=why):
        optimizer.load_state_dict(state)
    group = optimizer.param_groups[0]
    assert group["model_lr"] == [1e-3] * M and group["betas"] == (0.9, 0.999) and group["lr"] == 1.0


@pytest.mark.parametrize("params, lr, error, why", [
    ([torch.ones(2, 3, dtype=torch.long)], 0.5, TypeError, "every parameter must be a floating tensor"),
    ([torch.zeros(2, 3, requires_grad=True)], {0.5: "a", 0.25: "b"}, TypeError, "lr takes one number"),
    ([torch.zeros(2, 3, requires_grad=True)], {0.5, 0.25}, TypeError, "lr takes one number"),
])
def test_integer_parameters_and_rates_in_a_dict_or_set_are_refused(params, lr, error, why):
    """An integer parameter was taken and never updated; a dict's keys or a set's items in no order became the
    per-model rates."""
    with pytest.raises(error, match=why):
        StackedOptimizer(params, "sgd", lr=lr)


def test_a_schedule_factor_or_rate_set_after_the_constructor_is_checked_at_the_step():
    """A LambdaLR returning NaN, or a rate set in the group, made the parameters NaN (or walked uphill) without a
    word (issue 55): the step checks the factor, and each new per-model value, as the constructor does."""
    p = torch.randn(2, 3, requires_grad=True)
    optimizer = StackedOptimizer([p], "adam", lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: float("nan") if step else 1.0)
    p.grad = torch.ones(2, 3)
    optimizer.step()
    schedule.step()
    before = p.detach().clone()
    with pytest.raises(ValueError, match="lr \\(the schedule's factor on every model's rate\\) must be a finite"):
        optimizer.step()
    optimizer.param_groups[0]["lr"] = 1.0
    optimizer.param_groups[0]["model_lr"] = [float("nan"), 0.1]
    with pytest.raises(ValueError, match="lr must be a finite number ≥ 0; model 0 has nan"):
        optimizer.step()
    assert torch.equal(p.detach(), before)


def test_a_group_of_another_model_count_is_refused_when_added():
    """A group of 3 models beside one of 2 was taken, and step(live=) failed in torch's broadcasting."""
    optimizer = StackedOptimizer([torch.zeros(2, 3, requires_grad=True)], "adam", lr=1e-3)
    with pytest.raises(ValueError, match="every parameter group needs the first one's model count 2, got "
                                         "leading size 3"):
        optimizer.add_param_group({"params": [torch.zeros(3, 4, requires_grad=True)]})



def stepped_adam():
    p = torch.nn.Parameter(torch.randn(2, 3))
    optimizer = StackedOptimizer([p], "adam", lr=0.1)
    p.grad = torch.ones(2, 3)
    optimizer.step()
    return p, optimizer


@pytest.mark.parametrize("change, why", [
    (lambda state: state["state"][0].update(step=-1), "step -1, not a count"),
    (lambda state: state["state"][0].update(step="x"), "step 'x', not a count"),
    (lambda state: state["state"][0]["exp_avg"].fill_(float("nan")), "exp_avg not finite where its weight is"),
    (lambda state: state["state"][0]["exp_avg_sq"].fill_(-1.0), "exp_avg_sq below 0"),
    (lambda state: state["state"][0].update(exp_avg=torch.zeros(5)), "exp_avg that is not a floating tensor of its "
                                                                     "parameter's shape"),
    (lambda state: state["state"][0].pop("exp_avg"), "no exp_avg and exp_avg_sq"),
    (lambda state: state["state"][0].update(beta_powers=torch.full((2, 2), 2.0, dtype=torch.float64)),
     "beta_powers that are not two powers"),
    (lambda state: state["state"][0].update(momentum_buffer=torch.zeros(2, 3)), "keys \\['momentum_buffer'\\] no adam"),
    (lambda state: state.pop("param_groups"), "no list of 1 parameter groups"),
    (lambda state: state.update(param_groups="ab"), "no list of 1 parameter groups"),
])
def test_a_loaded_state_it_could_not_step_from_is_refused_before_anything_changes(change, why):
    """A step of -1, a NaN moment, a negative second moment, powers of 2: NaN parameters at the next step; a moment
    of another shape, a missing one, a count as text: torch's RuntimeError, KeyError or TypeError there; a state
    without its groups: a KeyError at load (issue 55)."""
    import copy
    p, optimizer = stepped_adam()
    state = copy.deepcopy(optimizer.state_dict())
    before = copy.deepcopy(optimizer.state_dict())
    change(state)
    with pytest.raises(ValueError, match=why):
        optimizer.load_state_dict(state)
    after = optimizer.state_dict()
    assert after["state"][0]["step"] == before["state"][0]["step"]
    assert torch.equal(after["state"][0]["exp_avg"], before["state"][0]["exp_avg"])
