"""The nonlinear stochastic network simulation as a pe_fast task: masked-node prediction
(pe_fast.tasks.masked_regions) on a modular network simulated by pe_fast.data.netsim."""
from __future__ import annotations

import inspect

from pe_fast.tasks.base import TaskKind, TaskSetting
from pe_fast.tasks.masked_regions import (REGION_DEFAULTS, REGION_SETTINGS, REGION_PES, REGION_PRESETS,
                                          REGION_SUMMARY, REGION_VIEW, MaskedRegionTask)

# The network's settings, passed to pe_fast.data.simulate_network (its docstring explains each one); None: its
# default.
SEE = "see pe_fast.data.simulate_network"
# The simulation's size, far above any network of this study (the paper's 100 nodes, 4 runs of 1,000 time points),
# so that a typo is one line, not a failed allocation: 10,000 nodes already make a 10⁸-entry attention map per item.
MAX_NODES = 10_000
MAX_TIMEPOINTS = 10**6
MAX_RUNS = 10_000
# ... and of the three together: the simulation keeps its series [timepoints, runs, nodes] in float64, so each flag
# within its range could still ask for terabytes (8 GB here)
MAX_VALUES = 10**9
NETWORK_SETTINGS = (
    TaskSetting("nodes", int, SEE, range=(2, MAX_NODES, "[]")),
    TaskSetting("modules", int, SEE, range=(1, None, "[)")),
    TaskSetting("p_within", float, SEE, range=(0, 1, "[]")), TaskSetting("p_between", float, SEE, range=(0, 1, "[]")),
    TaskSetting("coupling", float, SEE, range=(0, None, "[)")),
    TaskSetting("inhibition", float, SEE, range=(0, None, "[)")),
    TaskSetting("noise", float, SEE, range=(0, None, "[)")),
    TaskSetting("timepoints", int, SEE, range=(2, MAX_TIMEPOINTS, "[]")),
    TaskSetting("runs", int, SEE, range=(1, MAX_RUNS, "[]")), TaskSetting("netsim_seed", int, SEE, range=(0, None, "[)")),
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
    return simulate_network(**network, seed=s.netsim_seed or 0)


def network_size(s: dict, given: set[str]) -> str | None:
    """The simulated series within MAX_VALUES, a flag not given at simulate_network's default."""
    from pe_fast.data.netsim import simulate_network
    defaults = inspect.signature(simulate_network).parameters
    nodes, timepoints, runs = (s.get(k) if s.get(k) is not None else defaults[k].default
                               for k in ("nodes", "timepoints", "runs"))
    if nodes * timepoints * runs > MAX_VALUES:
        return (f"--nodes {nodes} × --timepoints {timepoints} × --runs {runs}: {nodes * timepoints * runs:,} "
                f"simulated values; at most {MAX_VALUES:,} (8 GB in float64)")
    return None


KIND = TaskKind(
    name="netsim",
    # σ = 2 creeps up for longer here than on fMRI: 7,000 steps reach the report's plateau
    # (docs/reproduction-netsim.md, 8 min 48 s on 2 cores); evaluations every 500 steps pay for the extra 2,000.
    defaults={**REGION_DEFAULTS, "steps": 7000, "eval_every": 500},
    presets={**REGION_PRESETS, "all-pes": dict(pe="learned,none,sin1d,random")},
    pe_kinds=REGION_PES,
    settings=REGION_SETTINGS + NETWORK_SETTINGS,
    summary=REGION_SUMMARY,
    view=REGION_VIEW,
    check=network_size,
    load=lambda s: MaskedRegionTask.from_settings(simulated_network(s), s),
)
