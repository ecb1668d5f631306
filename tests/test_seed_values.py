"""--seed-values: the seeds themselves instead of the first --seeds, so that a run can add one seed to an earlier
one. A model is its seed's model whichever way the seed was chosen."""
import numpy as np

from pe_fast.sweep import grid
from pe_fast.results.settings import Settings
from sweep_harness import TINY_NETSIM, run_sweep, settings_of, sweep_results

NETSIM = [*TINY_NETSIM, "--pe", "learned", "--sigmas", "0.1,1", "--steps", "12", "--eval-every", "6", "--warmup",
          "0", "--threads", "1", "--eval-items", "64"]


def settings(*flags):
    return settings_of(*NETSIM, *flags)


def test_seed_values_are_the_grid_seeds_in_the_given_order():
    s = settings("--seed-values", "6068,5")
    assert s.seeds == 2
    assert [(m["sigma"], m["seed"]) for m in grid.expand_grid(s)] == [(0.1, 6068), (0.1, 5), (1.0, 6068), (1.0, 5)]
    assert [m["seed"] for m in grid.expand_grid(settings("--seeds", "3"))][:3] == list(grid.AUTHOR_SEEDS[:3])


def test_seeds_beyond_the_authors_are_each_trained_once():
    """Beyond the authors' 15 came 1, 2, 3, ...: at --seeds 44 that reached 29, one of theirs, and the same model
    was trained and counted twice. The first of them keep their values (runs of up to 43 seeds are unchanged)."""
    for count in (16, 43, 44, 300):
        seeds = grid.model_seeds(settings("--seeds", str(count), "--sigmas", "0.1"))
        assert len(seeds) == len(set(seeds)) == count
        assert seeds[:15] == list(grid.AUTHOR_SEEDS[:count])
    assert grid.model_seeds(settings("--seeds", "43", "--sigmas", "0.1"))[15:] == list(range(1, 29))


def test_seed_values_survive_config_json():
    s = settings("--seed-values", "6312")
    again = Settings.from_json(s.to_json(), packs=[[0, 1]])
    assert again.seed_values == (6312,) and again.seeds == 1
    assert Settings.from_json(settings("--seeds", "2").to_json(), packs=[[0]]).seed_values is None


def sweep(out, *flags):
    return sweep_results(out, *NETSIM, *flags)


def test_a_seed_chosen_by_value_trains_as_in_the_run_that_counted_it(tmp_path):
    """The second seed of --seeds 2 against --seed-values of that seed alone, as a user adds a seed: the same
    initial weights and batches, so the same model; the pack size changes the matmuls' blocking, hence the
    tolerance. Then a resume that repeats the flag is accepted (it is the recorded value)."""
    counted = sweep(tmp_path / "counted", "--seeds", "2")
    alone = sweep(tmp_path / "alone", "--seed-values", str(grid.AUTHOR_SEEDS[1]))
    key = ["pe", "sigma", "seed"]
    models = [run[run["pe"] == "learned"] for run in (counted, alone)]  # not the baselines' rows
    both = models[0].merge(models[1], on=key, suffixes=("_counted", "_alone"))
    assert set(models[1]["seed"]) == {grid.AUTHOR_SEEDS[1]} and len(both) == 2  # one model per σ
    for column in ("train_mse", "test_mse", "test_r2", "pe_fc_corr"):
        np.testing.assert_allclose(both[f"{column}_alone"], both[f"{column}_counted"], rtol=1e-4, atol=1e-6,
                                   err_msg=column)
    resumed = run_sweep("--resume", "--out", str(tmp_path / "alone"), "--seed-values", str(grid.AUTHOR_SEEDS[1]),
                        "--no-report")
    assert resumed.returncode == 0, resumed.stderr
