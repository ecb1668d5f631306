"""Learning rate, weight decay, momentum and optimizer as grid axes (issue 14): the grid and its packs, the
results columns, and a model of a mixed pack training exactly as the same model in a pack of its own."""
import numpy as np

from pe_fast.sweep import grid
from sweep_harness import TINY_NETSIM, settings_of, sweep_results

NETSIM = [*TINY_NETSIM, "--seeds", "2", "--pe", "learned", "--sigmas", "0.1,1", "--steps", "12", "--eval-every", "6",
          "--warmup", "0", "--threads", "1", "--eval-items", "64"]


def settings(*flags):
    return settings_of(*NETSIM, *flags)


def test_grid_crosses_every_axis_and_packs_by_optimizer_kind():
    s = settings("--lr", "1e-3,3e-3", "--weight-decay", "0,0.01", "--optimizer", "adamw,sgd", "--momentum", "0,0.9")
    models = grid.expand_grid(s)
    # adamw: 2 lr × 2 wd; sgd: 2 lr × 2 wd × 2 momenta; each × 2 σ × 2 seeds
    assert len(models) == (4 + 8) * 4
    assert all(m["momentum"] is None for m in models if m["optimizer"] == "adamw")
    assert {(m["lr"], m["weight_decay"], m["momentum"]) for m in models if m["optimizer"] == "sgd"} == {
        (lr, wd, mu) for lr in (1e-3, 3e-3) for wd in (0, 0.01) for mu in (0, 0.9)}
    packs = grid.split_into_packs(models, max_pack=1000)
    assert [{m["optimizer"] for m in p} for p in packs] == [{"adamw"}, {"sgd"}]
    config = grid.train_config(s, packs[1])
    assert config.optimizer == "sgd" and config.lr == tuple(m["lr"] for m in packs[1])
    assert config.momentum == tuple(m["momentum"] for m in packs[1])


def test_single_values_keep_the_grid_and_its_order():
    models = grid.expand_grid(settings())
    assert [(m["sigma"], m["seed"]) for m in models] == [(0.1, 2235), (0.1, 6312), (1.0, 2235), (1.0, 6312)]
    assert {m["lr"] for m in models} == {3e-3} and {m["optimizer"] for m in models} == {"adam"}


def sweep(out, *flags):
    return sweep_results(out, *NETSIM, *flags)


def test_mixed_pack_trains_each_model_as_its_own_pack(tmp_path):
    """Three learning rates and two weight decays in one Adam pack; the lr = 1e-3, wd = 0.01 models against a
    sweep of only those. Identical batches and initial weights (per seed), so the only difference is the
    optimizer: the stacked one here, torch's fused Adam there, which round alike (tests/test_stacked_optimizer.py
    finds them equal bit for bit); the pack size changes the matmuls' blocking, hence the tolerance."""
    mixed = sweep(tmp_path / "mixed", "--lr", "3e-4,1e-3,3e-3", "--weight-decay", "0,0.01")
    alone = sweep(tmp_path / "alone", "--lr", "1e-3", "--weight-decay", "0.01")
    models = mixed[mixed["pe"] == "learned"]
    assert len(models) == 3 * 2 * 2 * 2 and set(models["pack"]) == {0}
    for column in ("lr", "lr_last", "weight_decay", "optimizer", "momentum"):
        assert column in models, column
    assert (models["lr_last"] == models["lr"]).all()  # constant schedule: the last rate is the base rate
    picked = models[(models["lr"] == 1e-3) & (models["weight_decay"] == 0.01)].sort_values(["sigma", "seed"])
    reference = alone[alone["pe"] == "learned"].sort_values(["sigma", "seed"])
    for column in ("train_mse", "test_mse", "pe_fc_corr"):
        np.testing.assert_allclose(picked[column].to_numpy(), reference[column].to_numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=column)
    # the models with other rates did train differently
    assert not np.allclose(models[models["lr"] == 3e-4]["train_mse"].mean(), picked["train_mse"].mean(), rtol=1e-3)
    summary = (tmp_path / "mixed" / "summary.txt").read_text()
    assert "lr" in summary.splitlines()[0] and "weight_decay" in summary.splitlines()[0]
    assert len(summary.splitlines()) == 1 + 2 * 3 * 2 + 2  # header, σ × lr × wd rows, two baselines


def test_sgd_and_adam_in_one_sweep_train_in_separate_packs(tmp_path):
    results = sweep(tmp_path / "run", "--optimizer", "adam,sgd", "--momentum", "0,0.9", "--lr", "1e-2")
    models = results[results["pe"] == "learned"]
    assert models.groupby("optimizer")["pack"].nunique().to_dict() == {"adam": 1, "sgd": 1}
    sgd = models[models["optimizer"] == "sgd"]
    assert sorted(sgd["momentum"].unique()) == [0.0, 0.9] and models[models["optimizer"] == "adam"][
        "momentum"].isna().all()
    assert np.isfinite(models["test_mse"]).all()
