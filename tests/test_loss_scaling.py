"""--precision fp16: autocast to float16, float32 weights and optimizer state, one dynamic loss scale per model
(precision.LossScaler) and a per-model skip in the stacked optimizer (StackedOptimizer.step(live=)). An overflow in
one model's gradients skips that model's step alone; a model steps and skips alike in a pack and alone; scales grow
after GradScaler's interval; a checkpoint continues bit for bit; fp32 and bf16 train exactly as before."""
import io
import math

import pytest
import torch

from pe_fast import precision
from pe_fast.models import ModelConfig
from pe_fast.stacked_optim import StackedOptimizer
from pe_fast.tasks.lst import LSTTask
from pe_fast.train import PackTrainer, TrainConfig

SEEDS, SIGMAS = [1, 2, 3], [0.2, 1.0, 2.0]


@pytest.fixture(scope="module")
def lst_task():
    return LSTTask()


def trainer(task, seeds=SEEDS, sigmas=SIGMAS, **train) -> PackTrainer:
    config = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=2, heads=2, mlp_width=32,
                         readout_token=task.readout_token)
    train = {"precision": "fp16", "lr": 3e-3, **train}
    return PackTrainer(task, config, TrainConfig(steps=100, batch_size=16, eval_every=100, **train), seeds, sigmas,
                       torch.device("cpu"))


def model_state(t: PackTrainer, m: int) -> list[torch.Tensor]:
    """Model m's parameters, Adam moments and bias-correction powers (its step count), then its loss scale and
    clean-step count, copied."""
    tensors = [p[m] for p in t.model.parameters()]
    for state in t.optimizer.state.values():
        tensors += [state["exp_avg"][m], state["exp_avg_sq"][m], state["beta_powers"][:, m]]
    return [x.clone() for x in tensors + [t.scaler.scale[m], t.scaler.clean[m]]]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def step_with_overflow(t: PackTrainer, m: int):
    """One training step with an inf in model m's gradient of the first parameter and a NaN in that of the last."""
    params = list(t.model.parameters())
    hooks = [p.register_hook(lambda g, v=v: g.index_fill(0, torch.tensor([m]), v))
             for p, v in ((params[0], math.inf), (params[-1], math.nan))]
    t.train_step()
    for hook in hooks:
        hook.remove()


def test_an_overflow_skips_that_models_step_and_no_other(lst_task):
    clean, hit = trainer(lst_task), trainer(lst_task)
    for _ in range(3):
        clean.train_step()
        hit.train_step()
    before = model_state(hit, 1)
    clean.train_step()
    step_with_overflow(hit, 1)
    after = model_state(hit, 1)
    assert same(after[:-2], before[:-2])  # parameters, moments and step count as they were
    assert after[-2] == before[-2] / 2 == 2.0 ** 15 and after[-1] == 0  # the scale backs off
    assert not same(model_state(clean, 1)[:-2], before[:-2])  # where the clean run's model 1 did step
    for _ in range(3):
        clean.train_step()
        hit.train_step()
    for m in (0, 2):
        assert same(model_state(hit, m), model_state(clean, m)), m
    assert all(torch.isfinite(p).all() for p in hit.model.parameters())
    assert not same(model_state(hit, 1), after)  # model 1 trains on from where it stopped


def elementwise_losses(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Each model's loss [M] from stacked weights and inputs [M, R, C]: Σ (w·x)² in float16, elementwise, which
    rounds alike at every position of a pack. The backward's float16 s·2(w·x) overflows for large w·x or scale."""
    return ((w.half() * x.half()) ** 2).float().sum((1, 2))


def train_elementwise(lrs: list[float], input_scales: list[float], seeds: list[int], steps: int):
    """A pack of len(lrs) stacked weights trained with the real LossScaler and StackedOptimizer (AdamW) on
    per-model input streams; returns the final state and each step's scales."""
    w = torch.stack([torch.randn(8, 40, generator=torch.Generator().manual_seed(s)) for s in seeds])
    w.requires_grad_()
    optimizer = StackedOptimizer([w], "adamw", lr=lrs, weight_decay=0.01)
    scaler = precision.LossScaler(len(lrs), torch.device("cpu"), enabled=True, growth_interval=3)
    streams = [torch.Generator().manual_seed(1000 + s) for s in seeds]
    history = []
    for _ in range(steps):
        x = torch.stack([c * torch.randn(8, 40, generator=g) for c, g in zip(input_scales, streams)])
        optimizer.zero_grad()
        scaler.scaled_loss(elementwise_losses(w, x)).backward()
        scaler.step(optimizer)
        history.append(scaler.scale.clone())
    state = optimizer.state[w]
    return [w.detach(), state["exp_avg"], state["exp_avg_sq"], state["beta_powers"].T, scaler.scale,
            scaler.clean], torch.stack(history)


def test_a_model_steps_and_skips_alone_exactly_as_in_its_pack():
    """Bit for bit: the loss scaling and the per-model skip are elementwise along the model axis (the real model's
    float16 matmuls are not, next test)."""
    lrs, input_scales, seeds = [1e-2, 3e-2, 1e-2, 5e-3], [0.5, 2.0, 8.0, 1.0], [11, 22, 33, 44]
    pack, history = train_elementwise(lrs, input_scales, seeds, steps=40)
    # the premise: the models overflowed at different steps, and both backed off and grew
    assert len({tuple(h.tolist()) for h in history.T}) == len(lrs)
    assert (history.diff(dim=0) < 0).any() and (history.diff(dim=0) > 0).any()
    for m in range(len(lrs)):
        alone, alone_history = train_elementwise(lrs[m:m + 1], input_scales[m:m + 1], seeds[m:m + 1], steps=40)
        assert torch.equal(alone_history[:, 0], history[:, m])
        assert same([t[m] for t in pack], [t[0] for t in alone]), m


def test_the_real_model_alone_trains_as_in_its_pack_to_float16_rounding(lst_task):
    """Not to the bit: torch 2.13's CPU float16 bmm rounds a batch of one differently from a batch of several (a
    16×16×16 product differs in the last bit for 6 of 40 random draws), which the single model's attention output
    projection meets. The losses agree to 1e-3 relative over 30 steps (measured 7.5e-5 after 40 steps, as far as
    fp16 is from fp32 there); an overflow at the same step skips and backs off alike."""
    pack, alone = trainer(lst_task), trainer(lst_task, seeds=SEEDS[1:2], sigmas=SIGMAS[1:2])
    for step in range(30):
        if step == 5:
            step_with_overflow(pack, 1)
            step_with_overflow(alone, 0)
        else:
            pack.train_step()
            alone.train_step()
    torch.testing.assert_close(pack.loss_buffer[:30, 1], alone.loss_buffer[:30, 0], rtol=1e-3, atol=0)
    assert torch.equal(pack.scaler.scale[1:2], alone.scaler.scale) and alone.scaler.scale.item() == 2.0 ** 15


def test_scales_start_and_grow_as_gradscalers_and_back_off_per_model(lst_task):
    reference = torch.amp.GradScaler("cpu")
    assert (precision.INITIAL_SCALE, precision.GROWTH_INTERVAL) == (reference.get_scale(),
                                                                    reference.get_growth_interval())
    t = trainer(lst_task)
    assert torch.equal(t.scaler.scale, torch.full((3,), 2.0 ** 16))
    # from 2⁴, far from float16's overflow (this pack's σ = 2 model overflows at 2¹⁸ by itself)
    t.scaler.load_state_dict({"scale": torch.full((3,), 2.0 ** 4), "clean": torch.zeros(3, dtype=torch.int32)})
    t.scaler.growth_interval = 3
    history = []
    for step in range(8):
        step_with_overflow(t, 0) if step == 3 else t.train_step()
        history.append([math.log2(s) for s in t.scaler.scale.tolist()])
    # every model doubles after 3 clean steps; model 0 halves at step 3 and counts its 3 clean steps from there
    assert history == [[4] * 3, [4] * 3, [5] * 3, [4, 5, 5], [4, 5, 5], [4, 6, 6], [5, 6, 6], [5, 6, 6]]


def everything(t: PackTrainer) -> list[torch.Tensor]:
    return ([p.detach() for p in t.model.parameters()] + [s for m in range(t.M) for s in model_state(t, m)]
            + [t.loss_buffer])


def test_a_checkpoint_continues_bit_for_bit(lst_task):
    whole, first = trainer(lst_task), trainer(lst_task)
    for t in (whole, first):
        t.train_step()
        step_with_overflow(t, 1)  # per-model step counts and scales that differ
        t.train_step()
    file = io.BytesIO()
    torch.save(first.state_dict(), file)
    file.seek(0)
    state = torch.load(file, weights_only=True)
    assert tuple(state) == PackTrainer.STATE_KEYS
    resumed = trainer(lst_task)
    resumed.load_state_dict(state)
    assert {s["beta_powers"].dtype for s in resumed.optimizer.state.values()} == {torch.float64}
    for _ in range(4):
        whole.train_step()
        resumed.train_step()
    assert same(everything(resumed), everything(whole))


def test_a_checkpoint_from_before_fp16_loads_with_the_initial_scales(lst_task):
    t = trainer(lst_task)
    t.train_step()
    step_with_overflow(t, 2)
    state = t.state_dict()
    del state["scaler"]
    resumed = trainer(lst_task)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.scaler.scale, torch.full((3,), 2.0 ** 16))
    assert torch.equal(resumed.scaler.clean, torch.zeros(3, dtype=torch.int32))


def step_as_before(t: PackTrainer):
    """The training step before fp16, by hand: the sum of the models' losses, its backward, the optimizer."""
    inputs, targets = t.batches(t.sampler.next())
    losses, _ = t.forward_loss(inputs, targets, t.pe_dropout_masks(inputs))
    t.optimizer.zero_grad(set_to_none=True)
    losses.sum().backward()
    t.optimizer.step()
    t.scheduler.step()
    t.step += 1


@pytest.mark.parametrize("name", ["fp32", "bf16"])
@pytest.mark.parametrize("lr", [3e-3, (1e-3, 3e-3, 1e-2)])  # torch's fused AdamW; the stacked optimizer
def test_fp32_and_bf16_train_exactly_as_before(lst_task, name, lr):
    ours, before = trainer(lst_task, precision=name, lr=lr), trainer(lst_task, precision=name, lr=lr)
    assert not ours.scaler.enabled
    for _ in range(4):
        ours.train_step()
        step_as_before(before)
    assert same([p.detach() for p in ours.model.parameters()], [p.detach() for p in before.model.parameters()])


KINDS = {"adamw": (torch.optim.AdamW, {}), "adam": (torch.optim.Adam, {}), "sgd": (torch.optim.SGD, {"momentum": 0.9})}


def masked_pack_and_models_alone(kind: str, masks: torch.Tensor | None):
    """Four models [4, 7, 40] with their own lr and decay, 30 steps of the gradient 0.5·p + noise: the stacked
    optimizer with `masks` [steps, 4] (None: no mask), and each model alone with torch.optim, skipping the steps
    its mask leaves out (GradScaler's skip)."""
    lrs, decays, steps = [1e-2, 3e-2, 1e-2, 3e-3], [0.0, 0.1, 0.01, 0.0], 30
    torch_optimizer, extra = KINDS[kind]
    noise = torch.randn(steps, 4, 7, 40, generator=torch.Generator().manual_seed(5))
    start = torch.randn(4, 7, 40, generator=torch.Generator().manual_seed(6))
    pack = start.clone().requires_grad_()
    optimizer = StackedOptimizer([pack], kind, lr=lrs, weight_decay=decays, momentum=extra.get("momentum", 0.0))
    for step in range(steps):
        pack.grad = 0.5 * pack.detach() + noise[step]
        if masks is None:
            optimizer.step()
        else:
            pack.grad[~masks[step]] = math.inf  # what a left-out model holds must not matter
            optimizer.step(live=masks[step])
    alone = []
    for m in range(4):
        w = start[m].clone().requires_grad_()
        reference = torch_optimizer([w], lr=lrs[m], weight_decay=decays[m], foreach=False, **extra)
        for step in range(steps):
            if masks is None or masks[step, m]:
                w.grad = 0.5 * w.detach() + noise[step, m]
                reference.step()
        alone.append(w.detach())
    return pack.detach(), alone


@pytest.mark.parametrize("kind", KINDS)
def test_without_a_mask_the_stacked_step_is_torchs_bit_for_bit(kind):
    pack, alone = masked_pack_and_models_alone(kind, None)
    assert all(torch.equal(pack[m], w) for m, w in enumerate(alone))


@pytest.mark.parametrize("kind", KINDS)
def test_with_a_mask_each_model_trains_as_torch_skipping_its_left_out_steps(kind):
    """To float32 rounding, not the bit: a masked step keeps each model's β₁ᵗ, β₂ᵗ as a running product where torch
    computes the power afresh, a float64 ulp apart, now and then one float32 ulp of a step."""
    masks = torch.rand(30, 4, generator=torch.Generator().manual_seed(7)) > 0.3
    masks[0, 0] = False  # a model left out of its very first step
    pack, alone = masked_pack_and_models_alone(kind, masks)
    for m, w in enumerate(alone):
        torch.testing.assert_close(pack[m], w, rtol=1e-5, atol=1e-6)
