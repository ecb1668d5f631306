"""The modular network simulation: determinism, graph structure, modular FC, bounded activity, Heun's order."""
import numpy as np
import pytest
from scipy.linalg import expm

from pe_fast.data import simulate_network
from pe_fast.data.netsim import integrate, modular_graph, module_of_nodes

SMALL = {"nodes": 60, "modules": 4, "timepoints": 600, "runs": 3}


@pytest.fixture(scope="module")
def default_net():
    return simulate_network()


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = simulate_network(seed=7, **SMALL), simulate_network(seed=7, **SMALL), simulate_network(seed=8, **SMALL)
    for x, y in zip(a.runs, b.runs):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.coupling, b.coupling)
    assert not np.array_equal(a.coupling, c.coupling) and not np.array_equal(a.runs[0], c.runs[0])
    # The graph comes from its own stream: a longer simulation keeps the same network.
    longer = simulate_network(seed=7, **{**SMALL, "timepoints": 700})
    np.testing.assert_array_equal(longer.coupling, a.coupling)


def test_region_data_fields(default_net):
    d = default_net
    assert d.kind == "netsim" and d.centroids is None and d.tr_seconds is None
    assert d.subjects == ["run0", "run1", "run2", "run3"] and [r.shape for r in d.runs] == [(1000, 100)] * 4
    assert d.runs[0].dtype == np.float32 and d.coupling.shape == (100, 100)
    assert list(np.bincount(d.networks)) == [20] * 5 and len(d.network_names) == 5
    want = sum(np.corrcoef(r.T.astype(np.float64)) for r in d.runs) / 4  # equal run lengths: a plain mean
    np.testing.assert_allclose(d.fc, want, atol=1e-9)


def test_modules_are_near_equal_contiguous_blocks():
    m = module_of_nodes(103, 5)
    assert sorted(np.bincount(m)) == [20, 20, 21, 21, 21] and np.all(np.diff(m) >= 0)


def test_graph_densities_row_sums_and_leading_eigenvalue():
    g, module = modular_graph(200, 4, 0.3, 0.05, coupling=1.6, inhibition=1.0, rng=np.random.default_rng(0))
    assert np.isclose(np.linalg.eigvals(g).real.max(), 1.6)
    edges = g > g.min() + 1e-12  # every entry carries the same inhibition; edges add a positive weight
    same = module[:, None] == module[None, :]
    off = ~np.eye(200, dtype=bool)
    assert abs(edges[same & off].mean() - 0.3) < 0.02 and abs(edges[~same].mean() - 0.05) < 0.01
    assert not edges.diagonal().any()
    # Excitatory weights of a node's inputs are equal, and the all-ones pattern is balanced out.
    np.testing.assert_allclose(g.sum(1), 0.0, atol=1e-9)


def test_fc_is_modular_and_activity_bounded_but_alive(default_net):
    d = default_net
    same = d.networks[:, None] == d.networks[None, :]
    off = ~np.eye(d.n_regions, dtype=bool)
    within, between = d.fc[same & off].mean(), d.fc[~same].mean()
    assert within > between + 0.15
    x = np.stack(d.runs)
    assert np.abs(x).max() < 0.95  # tanh bounds |x| by 1; well below means not saturated
    assert x.std(axis=1).min() > 0.05  # every node of every run fluctuates
    module_means = np.stack([x[:, :, d.networks == k].mean(axis=(1, 2)) for k in range(5)])
    assert np.abs(module_means).max() < 0.2  # no module stuck in an up or down state


def test_masked_nodes_are_partly_linearly_predictable(default_net):
    train = np.concatenate(default_net.runs[:2]).astype(np.float64)
    test = np.concatenate(default_net.runs[2:]).astype(np.float64)
    masked = np.arange(0, 100, 5)
    seen = np.setdiff1d(np.arange(100), masked)
    mean, cov = train.mean(0), np.cov(train.T)
    beta = np.linalg.solve(cov[np.ix_(seen, seen)], cov[np.ix_(seen, masked)])
    pred = (test[:, seen] - mean[seen]) @ beta + mean[masked]
    r2 = 1 - ((test[:, masked] - pred) ** 2).sum() / ((test[:, masked] - test[:, masked].mean(0)) ** 2).sum()
    assert 0.1 < r2 < 0.7  # a task with signal, but not a trivial one


def test_heun_matches_the_matrix_exponential_with_second_order_error():
    rng = np.random.default_rng(0)
    g = 0.5 * rng.normal(size=(6, 6)) / np.sqrt(6)
    x0 = rng.normal(size=(2, 6))
    tau, t_end = 0.7, 2.1
    exact = x0 @ expm((g - np.eye(6)) * t_end / tau).T  # linear φ, no noise: x(t) = e^{(G - I) t/τ} x0
    errors = []
    for steps in (30, 60, 120):
        out = integrate(g, x0, tau=tau, dt=t_end / steps, timepoints=1, sample_every=steps, transfer="linear")
        errors.append(np.abs(out[-1] - exact).max())
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert errors[-1] < 1e-4 and np.all((ratios > 3.6) & (ratios < 4.4))


def test_sampling_and_burn_in_pick_the_right_steps():
    rng = np.random.default_rng(1)
    g = 0.3 * rng.normal(size=(4, 4))
    x0 = rng.normal(size=(1, 4))
    dense = integrate(g, x0, tau=1.0, dt=0.05, timepoints=40, transfer="linear")
    sampled = integrate(g, x0, tau=1.0, dt=0.05, timepoints=6, sample_every=4, burn_in=13, transfer="linear")
    np.testing.assert_allclose(sampled, dense[13 + 4 * np.arange(1, 7) - 1], rtol=1e-12)


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="transfer"):
        simulate_network(transfer="relu", **SMALL)
    with pytest.raises(ValueError, match="modules"):
        simulate_network(nodes=3, modules=5)
