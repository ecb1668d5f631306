"""The nonlinear stochastic network simulation as a pe_fast task: masked-node prediction
(pe_fast.tasks.masked_regions) on a modular network simulated by pe_fast.data.netsim."""
from __future__ import annotations

import inspect

from pe_fast.data.regions import MIN_REGIONS
from pe_fast.tasks.base import TaskKind, TaskSetting
from pe_fast.tasks.masked_regions import (ALL_BASELINES, BY_SUBJECT_SETTINGS, REGION_DEFAULTS, REGION_PES,
                                          REGION_PRESETS, REGION_SUMMARY, REGION_VIEW, MaskedRegionTask)

# The network's settings, passed to pe_fast.data.simulate_network (its docstring explains each one); None: its
# default.
SEE = "see pe_fast.data.simulate_network"
# The simulation's size, far above any network of this study (the paper's 100 nodes, 4 runs of 1,000 time points),
# so that a typo is one line, not a failed allocation or an hour of silent simulation. Each maximum alone (the
# others at their least) finishes its data generation within about a minute on the project's 2-core machine
# (docs/reproduction-netsim.md): 3,000 nodes (30 s: the graph's eigenvalues, O(nodes³), take most of it), 10⁶ time
# points (the integration's 5 × 10⁶ steps, 65 s), 10,000 runs.
MAX_NODES = 3_000
MAX_TIMEPOINTS = 10**6
MAX_RUNS = 10_000
# ... and of the three together: the simulation keeps its series [timepoints, runs, nodes] in float64, so each flag
# within its range could still ask for terabytes (8 GB here)
MAX_VALUES = 10**9
# ... and its time: (burn-in + timepoints × sample_every) Heun steps of runs × nodes² each plus a fixed cost per
# step (~25,000 of those units), and the leading eigenvalue's 1.5 × nodes³, each unit ~5e-10 s on one core: at most
# about a minute (what each maximum alone takes).
STEP_OVERHEAD = 25_000
MAX_WORK = 1.3e11
# Past a few times the defaults' 1.6 the nodes saturate at ±1 and stop varying (at 5 every run of the defaults has
# constant nodes; 1e300 overflows): the range that still simulates a varying network at the defaults.
MAX_COUPLING = 4.0
# The noise enters inside tanh, so every value simulates; but past ~10 it drowns the coupling: the mean
# within-module correlation of the defaults falls from 0.33 (noise 1) to 0.026 (3) and 0.004 (10), below the FC's
# sampling error, and the nodes are independent noise with no network left for a PE to mirror.
MAX_NOISE = 10.0
NETWORK_SETTINGS = (
    TaskSetting("nodes", int, SEE, range=(MIN_REGIONS, MAX_NODES, "[]")),
    TaskSetting("modules", int, SEE, range=(1, None, "[)")),
    TaskSetting("p_within", float, SEE, range=(0, 1, "[]")), TaskSetting("p_between", float, SEE, range=(0, 1, "[]")),
    # 0: no network at all, nothing for a PE to mirror (the PE–coupling correlation is undefined)
    TaskSetting("coupling", float, SEE, range=(0, MAX_COUPLING, "(]")),
    TaskSetting("inhibition", float, SEE, range=(0, None, "[)")),
    TaskSetting("noise", float, SEE, range=(0, MAX_NOISE, "[]")),
    TaskSetting("timepoints", int, SEE, range=(2, MAX_TIMEPOINTS, "[]")),
    TaskSetting("runs", int, SEE, range=(2, MAX_RUNS, "[]")), TaskSetting("netsim_seed", int, SEE, range=(0, 2**32, "[)")),
)
NETWORK = tuple(setting.name for setting in NETWORK_SETTINGS)


def simulated_network(s):
    from pe_fast.data.netsim import simulate_network
    network = {k: getattr(s, k) for k in NETWORK if getattr(s, k) is not None and k != "netsim_seed"}
    # Checked here to name the flags (simulate_network's own check names its arguments); a flag not given takes
    # simulate_network's default.
    defaults = inspect.signature(simulate_network).parameters
    nodes, modules = (network.get(k, defaults[k].default) for k in ("nodes", "modules"))
    if modules > nodes:
        raise ValueError(f"--modules {modules} is more than --nodes {nodes}: every module needs at least one node")
    try:
        return simulate_network(**network, seed=s.netsim_seed or 0)
    except ValueError as error:
        if "no growing mode" not in str(error):
            raise
        graph = ", ".join(f"--{k.replace('_', '-')} {network.get(k, defaults[k].default)}"
                          for k in ("modules", "p_within", "p_between", "inhibition"))
        raise ValueError(f"--nodes {nodes} with {graph} and --netsim-seed {s.netsim_seed or 0} draws a network "
                         "without a growing mode to scale to --coupling (too few excitatory edges, e.g. no cycle): "
                         "give more --nodes per module, a higher --p-within or --p-between, or a lower "
                         "--inhibition") from None


def network_size(s: dict, given: set[str]) -> str | None:
    """The simulated series within MAX_VALUES, a flag not given at simulate_network's default."""
    from pe_fast.data.netsim import simulate_network
    defaults = inspect.signature(simulate_network).parameters
    nodes, timepoints, runs = (s.get(k) if s.get(k) is not None else defaults[k].default
                               for k in ("nodes", "timepoints", "runs"))
    if nodes * timepoints * runs > MAX_VALUES:
        return (f"--nodes {nodes} × --timepoints {timepoints} × --runs {runs}: {nodes * timepoints * runs:,} "
                f"simulated values; at most {MAX_VALUES:,} (8 GB in float64)")
    steps = defaults["burn_in"].default + timepoints * defaults["sample_every"].default
    work = steps * (runs * nodes**2 + STEP_OVERHEAD) + 1.5 * nodes**3
    if work > MAX_WORK:
        return (f"--nodes {nodes}, --timepoints {timepoints}, --runs {runs}: the simulation would take about "
                f"{work * 5e-10 / 60:,.0f} min; at most (500 + 5 × timepoints) × (runs × nodes² + {STEP_OVERHEAD:,}) "
                f"+ 1.5 × nodes³ ≤ {MAX_WORK:.2g} (about a minute): fewer nodes, time points or runs")
    return None


KIND = TaskKind(
    name="netsim",
    # σ = 2 creeps up for longer here than on fMRI: 7,000 steps reach the report's plateau
    # (docs/reproduction-netsim.md, 8 min 48 s on 2 cores); evaluations every 500 steps pay for the extra 2,000.
    defaults={**REGION_DEFAULTS, "steps": 7000, "eval_every": 500},
    presets={**REGION_PRESETS, "all-pes": dict(pe="learned,none,sin1d,random")},
    pe_kinds=REGION_PES,
    settings=BY_SUBJECT_SETTINGS + NETWORK_SETTINGS,
    summary=REGION_SUMMARY,
    view=REGION_VIEW,
    check=network_size,
    load=lambda s: MaskedRegionTask.from_settings(simulated_network(s), s),
    readout_token=MaskedRegionTask.readout_token,
    baselines=ALL_BASELINES,
    model_dims=MaskedRegionTask.model_dims,
)
