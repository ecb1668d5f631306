"""--pe-dropout: the authors' sinusoidal PE modules apply Dropout(p) to x + PE at the input of every block while
training, and nothing at evaluation; --pe-dropout-on gives the same to other PEs added to x.
Checked against that formula built by hand around blocks that add no PE, and for the masks' one promise: they
depend on the model's seed and the step alone."""
import json
import shutil

import numpy as np
import pytest
import torch

from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.models.absolute_pe import SINUSOIDAL_PES, PEDropout
from pe_fast.sweep import grid, resume, settings
from pe_fast.sweep.cli import main as sweep_main
from pe_fast.tasks.lst import LSTTask
from pe_fast.train import PackTrainer, TrainConfig

GRID = np.stack(np.divmod(np.arange(16), 4), axis=1).astype(float)
SEEDS = [3, 4]
CPU = torch.device("cpu")


def config(pe="sin2d", p=0.1, **overrides):
    return ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=3, heads=2, mlp_width=32, pe=pe,
                       readout_token=15, pe_dropout=p, **overrides)


def inputs(batch=8):
    return torch.randn(len(SEEDS), batch, 16, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("pe, sigmas", [("sin2d", [None, None]), ("learned", [0.5, 1.0]), ("random", [0.5, 1.0])])
def test_training_forward_is_dropout_of_x_plus_pe_at_every_block_input(pe, sigmas):
    model = StackedTransformer(config(pe=pe), SEEDS, sigmas, GRID).double()
    # The same seeds without a PE have the same weights everywhere else (the PE draws from its own stream)
    plain = StackedTransformer(config(pe="none", p=0.0), SEEDS, [None, None], GRID).double()
    x = inputs()
    masks = PEDropout(0.1, SEEDS, 3, CPU).masks(5, (8, 16, 16), torch.float64)
    got, _ = model(x, None, masks)
    got.square().sum().backward()

    # each block's own PE (one table per block for learned and random), as a leaf of the formula's graph
    tables = [model.absolute.at_block(b).detach().clone().requires_grad_() for b in range(3)]
    h = plain.embed(x)
    for index, block in enumerate(plain.blocks):
        readout = 15 if index == len(plain.blocks) - 1 else None
        h, _ = block((h + tables[index][:, None]) * masks[index], None, None, None, None, readout)
    expected = plain.head(h[:, :, 0])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got, model(x)[0]), "the masks changed nothing"
    if pe == "learned":  # the trained PE's gradient flows through the masked sum
        expected.square().sum().backward()
        for learned, formula in zip(model.absolute.tables, tables):
            torch.testing.assert_close(learned.grad, formula.grad, rtol=1e-10, atol=1e-10)


def test_without_masks_and_with_masks_of_ones_the_op_s_pe_path_gives_the_same():
    """Evaluation passes no masks (the fused op adds the PE itself); a mask of ones routes x + PE through the
    op as one input: both are the same function."""
    model = StackedTransformer(config(), SEEDS, [None, None], GRID).double()
    x = inputs()
    ones = torch.ones(3, len(SEEDS), 8, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(model(x, None, ones)[0], model(x)[0], rtol=1e-12, atol=1e-12)
    # and p changes nothing but training: same weights, same evaluation
    without = StackedTransformer(config(p=0.0), SEEDS, [None, None], GRID).double()
    torch.testing.assert_close(without(x)[0], model(x)[0], rtol=0, atol=0)


def test_masks_drop_a_share_p_and_keep_the_expectation():
    p, shape = 0.1, (64, 16, 32)
    masks = PEDropout(p, SEEDS, 4, CPU).masks(0, shape)
    assert masks.shape == (4, len(SEEDS), *shape)
    assert masks.unique().tolist() == pytest.approx([0.0, 1 / (1 - p)])
    n = masks.numel()
    dropped = (masks == 0).sum().item()
    assert abs(dropped - p * n) < 5 * (n * p * (1 - p)) ** 0.5  # binomial, 5 sd
    assert abs(masks.mean().item() - 1.0) < 0.01


def test_masks_depend_on_the_model_s_seed_and_the_step_only():
    shape = (8, 16, 16)
    pack = PEDropout(0.1, [3, 4], 2, CPU)
    alone = PEDropout(0.1, [4], 2, CPU)
    torch.testing.assert_close(pack.masks(7, shape)[:, 1], alone.masks(7, shape)[:, 0], rtol=0, atol=0)
    # a resumed run (a new object) draws the same masks at the same step
    torch.testing.assert_close(PEDropout(0.1, [3, 4], 2, CPU).masks(7, shape), pack.masks(7, shape), rtol=0, atol=0)
    assert not torch.equal(pack.masks(7, shape), pack.masks(8, shape))
    first = pack.masks(7, shape)
    assert not torch.equal(first[:, 0], first[:, 1])
    assert not torch.equal(first[0], first[1])  # each block its own mask


def test_config_refuses_dropout_of_pes_not_added_to_x_and_outside_0_1():
    for pe in ("none", "rope2d", "relative"):
        with pytest.raises(ValueError, match="added to x"):
            config(pe=pe)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        config(p=1.0)


@pytest.fixture(scope="module")
def lst_task():
    return LSTTask()


def lst_trainer(task, seeds, p=0.1, compile="off"):
    model = ModelConfig(num_tokens=16, token_dim=5, out_dim=4, width=16, depth=1, heads=1, mlp_width=32, pe="sin2d",
                        readout_token=task.readout_token, pe_dropout=p)
    train = TrainConfig(steps=100, batch_size=16, lr=1e-3, eval_every=100, compile=compile)
    return PackTrainer(task, model, train, seeds, [None] * len(seeds), CPU)


def train(trainer, steps):
    for _ in range(steps):
        trainer.train_step()
    return trainer


def test_a_model_trains_the_same_in_a_pack_alone_and_across_a_resume(lst_task):
    pack = train(lst_trainer(lst_task, [1, 2]), 6)
    alone = train(lst_trainer(lst_task, [2]), 6)
    for a, b in zip(pack.model.parameters(), alone.model.parameters()):
        torch.testing.assert_close(a[1:], b, rtol=1e-5, atol=1e-6)
    first = train(lst_trainer(lst_task, [1, 2]), 3)
    resumed = lst_trainer(lst_task, [1, 2])
    resumed.load_state_dict(first.state_dict())
    train(resumed, 3)
    for a, b in zip(resumed.model.parameters(), pack.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # and the dropout did something: without it the same steps end elsewhere
    plain = train(lst_trainer(lst_task, [1, 2], p=0.0), 6)
    assert not torch.allclose(plain.model.head.weight, pack.model.head.weight)


def test_compiled_step_applies_the_same_masks(lst_task):
    """torch.compile is the CUDA default: the masks are an input of the compiled step, drawn outside it."""
    eager, compiled = train(lst_trainer(lst_task, [1, 2]), 3), train(lst_trainer(lst_task, [1, 2], compile="on"), 3)
    torch.testing.assert_close(compiled.loss_buffer[:3], eager.loss_buffer[:3], rtol=1e-4, atol=1e-5)
    plain = train(lst_trainer(lst_task, [1, 2], p=0.0), 3)
    assert not torch.allclose(plain.loss_buffer[:3], eager.loss_buffer[:3], rtol=1e-4, atol=1e-5)


def parse(*flags):
    return settings.from_flags(settings.build_parser().parse_args(["--task", "lst", *flags]))


def test_the_sweep_gives_the_dropout_to_its_sinusoidal_models_only_unless_told(lst_task):
    s = parse("--pe", "learned,sin2d", "--pe-dropout", "0.1")
    assert grid.model_config(s, lst_task, "sin2d").pe_dropout == 0.1
    assert grid.model_config(s, lst_task, "learned").pe_dropout == 0.0
    assert parse("--pe", "sin2d").pe_dropout == 0.0
    s = parse("--pe", "learned,sin2d", "--pe-dropout", "0.1", "--pe-dropout-on", "learned")
    assert grid.model_config(s, lst_task, "learned").pe_dropout == 0.1
    assert grid.model_config(s, lst_task, "sin2d").pe_dropout == 0.0
    # the paper preset's dropout, given to the learned PE too: the fair comparison
    s = parse("--preset", "paper-e200", "--pe", "learned,sin2d", "--pe-dropout-on", "learned,sin2d")
    assert {grid.model_config(s, lst_task, k).pe_dropout for k in ("learned", "sin2d")} == {0.1}


@pytest.mark.parametrize("flags, message", [
    (["--pe", "learned", "--pe-dropout", "0.1"], "--pe-dropout applies to --pe sin1d or sin2d or sinnd only"),
    (["--pe", "sin2d", "--pe-dropout", "1"], "--pe-dropout must be finite and ≥ 0 and < 1"),
    (["--pe", "sin2d", "--pe-dropout", "nan"], "--pe-dropout must be finite"),
    (["--pe", "learned", "--pe-dropout", "0.1", "--pe-dropout-on", "none"], "--pe-dropout-on: 'none' is not a PE"),
    (["--pe", "learned", "--pe-dropout-on", "learned"], "--pe-dropout-on applies with a --pe-dropout above 0"),
    (["--pe", "sin2d", "--pe-dropout", "0.1", "--pe-dropout-on", "learned"], "--pe-dropout applies to --pe learned"),
])
def test_bad_pe_dropout_is_one_line_and_exit_2(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    code = sweep_main(["--task", "lst", *flags, "--steps", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


@pytest.fixture(scope="module")
def tiny_sin2d_run(tmp_path_factory):
    """A finished 2-step sweep of the 2D sinusoidal PE with --pe-dropout 0.1: its config.json."""
    out = tmp_path_factory.mktemp("pe_dropout") / "run"
    code = sweep_main(["--task", "lst", "--pe", "sin2d", "--pe-dropout", "0.1", "--seeds", "1", "--steps", "2",
                       "--eval-every", "2", "--width", "16", "--depth", "1", "--batch-size", "8", "--no-report",
                       "--out", str(out)])
    assert code == 0
    return out / "config.json"


def test_sweep_records_pe_dropout_in_config_json(tiny_sin2d_run):
    recorded = json.loads(tiny_sin2d_run.read_text())["settings"]
    assert recorded["pe_dropout"] == 0.1 and recorded["pe_dropout_on"] == list(SINUSOIDAL_PES)


def test_a_sweep_recorded_before_pe_dropout_on_resumes_with_the_sinusoidal_pes(tiny_sin2d_run, tmp_path):
    older = tmp_path / "run"
    shutil.copytree(tiny_sin2d_run.parent, older)
    config = json.loads(tiny_sin2d_run.read_text())
    del config["settings"]["pe_dropout_on"]
    (older / "config.json").write_text(json.dumps(config))
    args = settings.build_parser().parse_args(["--resume", "--out", str(older)])
    resumed = resume.from_resume(args)
    assert resumed.pe_dropout_on == SINUSOIDAL_PES and resumed.pe_dropout == 0.1
