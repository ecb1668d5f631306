"""--init-gamma (issue 52): the embedding, attention and MLP weights drawn with std fan_in^-γ, per model of a pack,
as a grid axis the record, the summary and the report know."""
import math

import numpy as np
import pytest
import torch

from pe_fast.models import ModelConfig
from pe_fast.models.transformer import StackedTransformer
from pe_fast.report import figures
from pe_fast.sweep import grid, resume, settings
from pe_fast.sweep.task_loading import load_task
from sweep_harness import TINY_NETSIM, settings_of, sweep_results

CONFIG = ModelConfig(pe="learned", num_tokens=8, token_dim=48, out_dim=3, width=64, depth=2, heads=4, mlp_width=192)
SEEDS, GAMMAS = [11, 12, 13, 14], [0.25, 0.5, 1.0, None]


def test_each_group_starts_with_std_fan_in_to_the_minus_gamma():
    """The sample std of every rescaled matrix, per model, within 5 % of fan_in^-γ; fan_in read off each layer's
    input width here (the embedding's token_dim, the MLP output's mlp_width)."""
    model = StackedTransformer(CONFIG, SEEDS, [0.1] * 4, init_gammas=GAMMAS)
    D, H = CONFIG.width, CONFIG.mlp_width
    groups = {"embedding": (model.embed.weight, CONFIG.token_dim)}
    for b, block in enumerate(model.blocks):
        groups.update({f"b{b} qkv": (block.attention.w_qkv, D), f"b{b} attention out": (block.attention.out.weight, D),
                       f"b{b} mlp in": (block.mlp_in.weight, D), f"b{b} mlp out": (block.mlp_out.weight, H)})
    for name, (weight, fan_in) in groups.items():
        for m, gamma in enumerate(GAMMAS[:3]):
            measured = weight[m].detach().double().std().item()
            assert measured == pytest.approx(fan_in ** -gamma, rel=0.05), (name, gamma)


def test_a_model_without_gamma_and_what_gamma_leaves_keep_the_default_initialisation():
    """γ None: the model of that seed exactly as without --init-gamma; the head, biases, norms and PE of every model
    as drawn by default (the PE keeps its σ)."""
    scaled = StackedTransformer(CONFIG, SEEDS, [0.1] * 4, init_gammas=GAMMAS)
    default = StackedTransformer(CONFIG, SEEDS, [0.1] * 4)
    for (name, a), (_, b) in zip(scaled.named_parameters(), default.named_parameters()):
        torch.testing.assert_close(a[3], b[3], rtol=0, atol=0, msg=name)
        if not name.endswith(("embed.weight", "w_qkv", "out.weight", "mlp_in.weight", "mlp_out.weight")):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        else:  # the same draws, rescaled: each model's slice is a multiple of its default one
            ratio = (a[0] / b[0]).detach()
            torch.testing.assert_close(ratio, torch.full_like(ratio, ratio.flatten()[0].item()), msg=name)
    assert scaled.head.weight.shape[1] == CONFIG.width


def test_init_gamma_is_a_grid_axis_that_keeps_the_old_numbering():
    flags = [*TINY_NETSIM, "--pe", "learned", "--sigmas", "0.1,1", "--seeds", "2"]
    plain = grid.expand_grid(settings_of(*flags))
    assert all("init_gamma" not in m for m in plain)
    models = grid.expand_grid(settings_of(*flags, "--init-gamma", "0.5,1"))
    assert len(models) == 2 * len(plain)
    assert [m["init_gamma"] for m in models] == [0.5] * 4 + [1.0] * 4
    assert [(m["sigma"], m["seed"]) for m in models[:4]] == [(m["sigma"], m["seed"]) for m in plain]
    s = settings_of(*flags, "--init-gamma", "0.5,1")
    (pack,) = grid.split_into_packs(models, max_pack=100)
    trainer = grid.pack_trainer(s, load_task(s), pack)
    fan_in = trainer.model.blocks[0].mlp_out.weight.shape[1]
    stds = trainer.model.blocks[0].mlp_out.weight.detach().double().flatten(1).std(dim=1)
    # 64 × 16 draws per model: the std within 10 % of fan_in^-γ, and γ = 1's models 64^-0.5 = 8 times smaller
    np.testing.assert_allclose(stds.numpy(), [fan_in ** -m["init_gamma"] for m in pack], rtol=0.1)


def test_a_sweep_over_gamma_records_summarises_and_draws_it(tmp_path):
    """Two γ × two σ in one pack: the results and the summary keep the γ apart, config.json gives the axis back,
    and the σ × γ phase diagram is drawn."""
    out = tmp_path / "run"
    results = sweep_results(out, *TINY_NETSIM, "--pe", "learned", "--sigmas", "0.1,1", "--seeds", "1",
                            "--init-gamma", "0.3,1.2", "--steps", "6", "--eval-every", "3", "--threads", "1",
                            "--eval-items", "32", "--ntk-items", "2")
    models = results[results["pe"] == "learned"]
    assert sorted(models["init_gamma"]) == [0.3, 0.3, 1.2, 1.2] and models["pack"].nunique() == 1
    assert np.isfinite(models["test_mse"]).all()
    resumed = resume.from_resume(settings.build_parser().parse_args(["--resume", "--out", str(out)]))
    assert resumed.init_gamma == (0.3, 1.2)
    summary = (out / "summary.txt").read_text().splitlines()
    assert "init_gamma" in summary[0] and len(summary) == 1 + 4 + 2  # header, σ × γ rows, two baselines
    drawn = tmp_path / "phase.png"
    assert figures.phase_diagram(results, ["test_mse", "ntk_distance"], drawn, "init_gamma") is None and drawn.exists()
    assert "--init-gamma" in figures.phase_diagram(results[results["init_gamma"] != 1.2], ["test_mse"], drawn,
                                                   "init_gamma")
    assert math.isfinite(models["ntk_distance"].iloc[0])
