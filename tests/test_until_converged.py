"""--until converged: a pack ends at the first evaluation where every model's score has levelled off (the report's
convergence test), with the same training as a run to the full budget up to there, and a resumed pack stops where
an uninterrupted one does. The reference is the budget run's own curve, judged here by the test's own arithmetic."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from pe_fast.sweep import grid
from pe_fast.sweep.task_loading import load_task
from pe_fast.train import PackTrainer
from sweep_harness import TINY_NETSIM, settings_of, sweep_results

# the tiny network levels off at step 2,000: a budget of 8 evaluations leaves room past it
BUDGET = 3200
FLAGS = [*TINY_NETSIM, "--seeds", "2", "--sigmas", "0.1,2", "--steps", str(BUDGET), "--eval-every", "400",
         "--threads", "1"]


def first_plateau(curves: pd.DataFrame, score: str) -> int | None:
    """The first evaluation step at which every model gained at most 0.01 over the last quarter of the steps so
    far (scores at the quarters' boundaries read by linear interpolation), with at least 4 evaluations."""
    table = curves.pivot_table(index="step", columns="model_id", values=score).sort_index()
    for count, end in enumerate(table.index, start=1):
        if count < 4:
            continue
        so_far = table.loc[:end]
        gains = [so_far[m].iloc[-1] - np.interp(0.75 * end, so_far.index, so_far[m]) for m in so_far]
        if max(gains) <= 0.01:
            return int(end)
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    threads = torch.get_num_threads()
    folder = tmp_path_factory.mktemp("until")
    try:
        budget = sweep_results(folder / "budget", *FLAGS, "--until", "budget")
        converged = sweep_results(folder / "converged", *FLAGS, "--until", "converged")
    finally:
        torch.set_num_threads(threads)
    curves = {name: pd.read_parquet(folder / name / "curves.parquet") for name in ("budget", "converged")}
    return budget, converged, curves


def test_stops_at_the_first_plateau_of_every_model(runs):
    budget, converged, curves = runs
    models = ~budget["pe"].str.startswith("baseline")
    stop = first_plateau(curves["budget"], "test_r2")
    assert stop is not None and stop < BUDGET
    assert set(converged.loc[models, "steps"]) == {stop} and set(converged.loc[models, "stopped"]) == {"converged"}
    assert set(budget.loc[models, "steps"]) == {BUDGET} and set(budget.loc[models, "stopped"]) == {"budget"}
    # the same training up to the stop: identical held-out scores (scored in full at every evaluation)
    before = curves["budget"][curves["budget"]["step"] <= stop].reset_index(drop=True)
    pd.testing.assert_series_equal(curves["converged"]["test_r2"], before["test_r2"])
    assert curves["converged"]["step"].max() == stop


def test_the_report_says_when_each_pack_stopped(runs, tmp_path):
    from pe_fast.report.numbers import stopping_lines
    _, converged, curves = runs
    stop = int(curves["converged"]["step"].max())
    (line,) = stopping_lines(converged, BUDGET)
    assert f"stopped at step {stop:,} of {BUDGET:,}: every model's score had levelled off" in line


def test_a_resumed_pack_stops_where_an_uninterrupted_one_does():
    s = settings_of(*FLAGS, "--until", "converged")
    task = load_task(s)
    pack = grid.expand_grid(s)

    def trainer():
        return PackTrainer(task, grid.model_config(s, task, "learned"), grid.train_config(s, pack),
                           [m["seed"] for m in pack], [m["sigma"] for m in pack], torch.device("cpu"))

    whole = trainer().run()
    assert whole.stopped == "converged" and whole.steps < s.steps
    first = trainer()
    saved = {}

    class Killed(Exception):
        pass

    def checkpoint():
        saved["state"] = first.state_dict()
        if first.step >= whole.steps // 2:
            raise Killed

    with pytest.raises(Killed):
        first.run(checkpoint=checkpoint)
    resumed = trainer()
    resumed.load_state_dict(saved["state"])
    result = resumed.run()
    assert (result.steps, result.stopped) == (whole.steps, whole.stopped)
    assert [r["test_r2"] for r in result.final] == [r["test_r2"] for r in whole.final]


def test_until_converged_needs_a_score_to_follow():
    s = settings_of(*FLAGS)
    task = load_task(s)
    pack = grid.expand_grid(s)
    config = dataclasses.replace(grid.train_config(s, pack), until="converged", plateau_score=None)
    with pytest.raises(ValueError, match="plateau_score"):
        PackTrainer(task, grid.model_config(s, task, "learned"), config, [0], [0.1], torch.device("cpu"))
