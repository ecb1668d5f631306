"""A nonlinear stochastic network of modules: the paper's second experiment.

Every node i follows

    τ dx_i/dt = −x_i + φ( Σ_j G_ij x_j + ε_i(t) ),       φ = tanh by default,

with ε_i drawn N(0, noise²) independently per node and integration step and held fixed within the
step (an input noise, as in the first author's earlier network code; its effect therefore depends on
dt). It is integrated with Heun's method (explicit trapezoid, RK2), run for a burn-in and then
sampled every `sample_every` steps. Each run starts from its own random state and noise, so runs are
independent draws (the "subjects" of a split).

The coupling G (`modular_graph`): nodes split into `modules` modules of near-equal size; a directed
excitatory edge j→i exists with probability `p_within` inside a module and `p_between` across
modules; each node's excitatory inputs are scaled to sum to 1; a uniform inhibition −inhibition/N is
added to every entry (self included); finally G is scaled so that its largest real eigenvalue equals
`coupling`.

Why this scaling: with positive weights alone the all-ones pattern is the network's strongest mode,
so near a useful gain the whole network falls into one saturated up or down state and the modules
disappear from the FC. The uniform inhibition cancels that mode (fully at `inhibition=1`) and leaves
the module patterns as the slowest modes. Scaling by the leading eigenvalue makes `coupling` mean the
same distance from instability whatever the size, module count and densities. With noise 1 the
average slope of tanh is about 0.6, so coupling 1.6 puts the module modes near, but below, the point
where modules become bistable: activity is neither dead (the noise drives it) nor saturated (|x| stays
below ~0.8), within-module correlation is ~0.25-0.35 and between-module correlation slightly
negative (the inhibition), and a masked node is partly predictable from the others (a linear
predictor explains 20-37 % of its variance; measured for 100-200 nodes, 4-10 modules, seeds 0-2).
At coupling 1.8 modules flip between saturated ±1 states (the linear predictor then explains
~80 %): keep coupling at or below ~1.6 at these defaults.

Deterministic from `seed` (graph and dynamics use separate streams, so the graph does not depend on
the length of the simulation).
"""

from __future__ import annotations

import numpy as np

from pe_fast.data.regions import RegionData, correlation_fc

TRANSFERS = {
    "tanh": np.tanh,
    # The first author's earlier network code (Ito et al. 2020): a logistic shifted by 2.
    "sigmoid": lambda u: 1.0 / (1.0 + np.exp(-(u - 2.0))),
    # For analysis and tests: the linear system has a closed-form solution.
    "linear": lambda u: u,
}

# Noise is drawn this many integration steps at a time (part of the stream's definition: keep fixed).
_NOISE_BLOCK = 512
# The smallest leading real part of G's eigenvalues, relative to its spectral radius, taken as a growing mode.
NO_GROWING_MODE = 1e-3


def module_of_nodes(nodes: int, modules: int) -> np.ndarray:
    """[nodes] module id 0..modules-1 in contiguous blocks whose sizes differ by at most one."""
    if not 1 <= modules <= nodes:
        raise ValueError(f"need 1 <= modules ({modules}) <= nodes ({nodes})")
    return np.arange(nodes) * modules // nodes


def modular_graph(nodes: int, modules: int, p_within: float, p_between: float, coupling: float,
                  inhibition: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Coupling matrix G [nodes, nodes] (row i = inputs of node i) and each node's module.

    Excitatory edges with densities p_within / p_between, no self-edges, each node's excitatory input
    summing to 1 (a node with none gets none), plus −inhibition/nodes everywhere, all scaled so that
    the largest real part of G's eigenvalues is `coupling`.
    """
    if not (0 <= p_within <= 1 and 0 <= p_between <= 1):
        raise ValueError("edge densities must lie in [0, 1]")
    module = module_of_nodes(nodes, modules)
    same = module[:, None] == module[None, :]
    edges = rng.random((nodes, nodes)) < np.where(same, p_within, p_between)
    np.fill_diagonal(edges, False)
    indegree = edges.sum(1, keepdims=True)
    g = edges / np.maximum(indegree, 1) - inhibition / nodes
    eigenvalues = np.linalg.eigvals(g)
    leading = eigenvalues.real.max()
    # A graph without a growing mode (e.g. no cycle of excitatory edges, as few nodes per module draw) has a leading
    # real part of 0 or below, which eigvals returns as rounding noise up to ~1e-5 of the spectrum (a defective
    # eigenvalue 0): scaled to `coupling`, that noise would blow G up by 10⁵ or more and saturate every node.
    if leading <= NO_GROWING_MODE * max(np.abs(eigenvalues).max(), 1e-300):
        raise ValueError("the graph has no growing mode to scale (too few excitatory edges): raise p_within or "
                         "p_between, put more nodes in each module or lower inhibition")
    return g * (coupling / leading), module


def integrate(coupling: np.ndarray, x0: np.ndarray, *, tau: float, dt: float, timepoints: int,
              sample_every: int = 1, burn_in: int = 0, transfer: str = "tanh", noise: float = 0.0,
              rng: np.random.Generator | None = None) -> np.ndarray:
    """Heun's method for τ dx/dt = −x + φ(G x + ε), all runs at once.

    x0: [R, N] initial states of R independent runs. Takes `burn_in` steps, then `timepoints` ×
    `sample_every` steps, keeping the state after every `sample_every`-th. Returns [timepoints, R, N]
    (float64). With noise 0, rng is not needed.
    """
    phi = TRANSFERS[transfer]
    x = np.array(x0, dtype=np.float64)
    gt = np.ascontiguousarray(coupling.T)
    h = dt / tau
    out = np.empty((timepoints,) + x.shape)
    total = burn_in + timepoints * sample_every
    eps = np.zeros(x.shape)
    for start in range(0, total, _NOISE_BLOCK):
        block = min(_NOISE_BLOCK, total - start)
        if noise:
            noises = noise * rng.standard_normal((block,) + x.shape)
        for i in range(block):
            e = noises[i] if noise else eps
            k1 = phi(x @ gt + e) - x
            predictor = x + h * k1
            k2 = phi(predictor @ gt + e) - predictor
            x = x + 0.5 * h * (k1 + k2)
            done = start + i + 1 - burn_in
            if done > 0 and done % sample_every == 0:
                out[done // sample_every - 1] = x
    return out


def simulate_network(nodes: int = 100, modules: int = 5, p_within: float = 0.3, p_between: float = 0.02,
                     coupling: float = 1.6, inhibition: float = 1.0, noise: float = 1.0, tau: float = 1.0,
                     dt: float = 0.1, sample_every: int = 5, burn_in: int = 500, timepoints: int = 1000,
                     runs: int = 4, transfer: str = "tanh", seed: int = 0) -> RegionData:
    """Simulate `runs` independent runs of the modular network; see the module docstring for the model.

    Time is in units of τ; one sample every `sample_every`·dt (default 0.5 τ) after `burn_in` steps
    (default 50 τ). Returns RegionData of kind "netsim": runs [timepoints, nodes] float32,
    subjects "run0".., networks = modules, coupling = G, fc = correlation of the simulated series,
    no centroids. The defaults take about a second on this project's 2-core machine.
    """
    if transfer not in TRANSFERS:
        raise ValueError(f"transfer must be one of {sorted(TRANSFERS)}, not {transfer!r}")
    graph_seed, dynamics_seed = np.random.SeedSequence(seed).spawn(2)
    g, module = modular_graph(nodes, modules, p_within, p_between, coupling, inhibition,
                              np.random.default_rng(graph_seed))
    rng = np.random.default_rng(dynamics_seed)
    x0 = 0.1 * rng.standard_normal((runs, nodes))
    series = integrate(g, x0, tau=tau, dt=dt, timepoints=timepoints, sample_every=sample_every,
                       burn_in=burn_in, transfer=transfer, noise=noise, rng=rng)
    run_list = [np.ascontiguousarray(series[:, r], dtype=np.float32) for r in range(runs)]
    names = [f"run{r}" for r in range(runs)]
    return RegionData(
        runs=run_list,
        subjects=names,
        run_names=names,
        labels=np.array([f"node_{i}" for i in range(nodes)]),
        centroids=None,
        networks=module,
        network_names=[f"module_{k}" for k in range(modules)],
        fc=correlation_fc(run_list),
        coupling=g,
        kind="netsim",
        source=(f"netsim seed {seed}: {nodes} nodes, {modules} modules, p_within {p_within}, p_between {p_between}, "
                f"coupling {coupling}, inhibition {inhibition}, noise {noise}, {transfer}, tau {tau}, dt {dt}, "
                f"sample every {sample_every} steps after {burn_in}; fc = correlation of the simulated series"),
        tr_seconds=None,
    )
