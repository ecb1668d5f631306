"""Simulation and data settings that broke the sweep after it had started, or only after minutes or lines of numpy
warnings: each is now refused up front (exit 2, one line naming the flag, nothing written) or works. Through the
real entry point, as tests/test_bad_input.py and tests/test_bad_data.py."""
import math
import time

import numpy as np
import pytest
import torch
from sweep_harness import narrowed
from test_bad_input import NETSIM, assert_one_line

from pe_fast.sweep.cli import main as sweep_main
from pe_fast.tasks import netsim as netsim_task

DIGITS = ["--task", "digits", "--width", "16", "--depth", "1", "--steps", "2", "--eval-every", "1", "--seeds", "1",
          "--pe", "learned", "--sigmas", "0.5", "--batch-size", "2"]


def refused(args, must_name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        code = sweep_main(narrowed(*args, "--threads", "1", "--out", str(tmp_path / "run")))
    finally:
        torch.set_num_threads(threads)
    assert_one_line(capsys, code, must_name)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("args, must_name", [
    # 2 nodes per module at density 0.3: no cycle of excitatory edges, the leading eigenvalue was rounding noise
    # (1e-8) that scaled G by 10⁸, every node saturated and constant, R² = 0 / 0 at the first evaluation
    (NETSIM + ["--nodes", "10", "--modules", "5"], "--nodes 10"),
    (NETSIM + ["--coupling", "1e300"], "--coupling"),
    (NETSIM + ["--coupling", "5"], "≤ 4"),
    # the maxima that took minutes (an O(nodes³) eigenvalue problem, 5 × 10⁶ steps of a 1,000-node network)
    (NETSIM + ["--nodes", "10000", "--timepoints", "2", "--runs", "2"], "--nodes"),
    (NETSIM + ["--nodes", "1000", "--timepoints", "1000000", "--runs", "2"], "--timepoints 1000000"),
    (DIGITS + ["--train-images", "1"], "--train-images 1"),
    # 4 nodes that do simulate: the 3 connectivity gradients of 4 regions ended in a traceback after training
    (NETSIM + ["--nodes", "4", "--modules", "1", "--p-within", "1", "--inhibition", "0"], "--nodes"),
    # noise 1e300 simulated and trained on independent noise: no network left in the data
    (NETSIM + ["--noise", "1e300"], "--noise"),
], ids=["few nodes per module", "coupling 1e300", "coupling saturating", "nodes 10000", "nodes × timepoints",
        "one digit image", "fewer nodes than gradients", "noise drowning the network"])
def test_refused_in_one_line(args, must_name, tmp_path, capsys, monkeypatch):
    start = time.monotonic()
    with np.errstate(all="warn"):
        refused(args, must_name, tmp_path, capsys, monkeypatch)
    assert time.monotonic() - start < 30


def test_the_simulation_limits_each_alone_pass_the_checks():
    """Each documented maximum, the others at their least, is within the time rule (measured: docs)."""
    for nodes, timepoints, runs in ((netsim_task.MAX_NODES, 2, 1), (6, netsim_task.MAX_TIMEPOINTS, 1),
                                    (6, 2, netsim_task.MAX_RUNS)):
        given = dict(nodes=nodes, timepoints=timepoints, runs=runs)
        assert netsim_task.network_size(given, set(given)) is None, given
    assert netsim_task.network_size({}, set()) is None  # the defaults


def test_ten_nodes_in_larger_modules_train(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = narrowed(*NETSIM, "--nodes", "10", "--modules", "2", "--p-within", "0.8", "--steps", "1", "--threads", "1",
                    "--no-report", "--out", str(tmp_path / "n10"))
    threads = torch.get_num_threads()
    try:
        assert sweep_main(args) == 0, capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "n10" / "results.parquet").exists()


def constant_data(n=6, t=20):
    from pe_fast.data.regions import RegionData
    runs = [np.ones((t, n), np.float32) * i for i in range(1, 5)]
    return RegionData(runs=runs, subjects=[f"s{i}" for i in range(4)], run_names=["r"] * 4,
                      labels=np.array([f"n{i}" for i in range(n)]), centroids=None, networks=None,
                      network_names=None, fc=np.eye(n), coupling=None, kind="netsim", source="constant",
                      tr_seconds=None)


def test_constant_data_are_refused_by_the_task():
    from pe_fast.tasks.masked_regions import MaskedRegionTask
    with pytest.raises(ValueError, match="constant"):
        MaskedRegionTask(constant_data(), "netsim")


def test_a_zero_reference_scores_nan_not_a_crash():
    from pe_fast.tasks.masked_regions import MaskedRegionTask
    data = constant_data()
    rng = np.random.default_rng(0)
    data.runs[0] = rng.normal(size=data.runs[0].shape).astype(np.float32)  # training varies, the test run not
    data.runs[3] = rng.normal(size=data.runs[3].shape).astype(np.float32)
    task = MaskedRegionTask(data, "netsim")
    part = task.splits["test"]
    part.values.zero_()  # as if every masked target were 0
    rows = task.score(torch.zeros(1, *part.values.shape), "test", torch.arange(len(part)))
    assert math.isnan(rows[0]["test_r2"])
