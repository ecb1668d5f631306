"""Region time series for the fMRI and network-simulation tasks.

Every source returns a `RegionData` (runs [T, N] + labels, centroids, networks, FC, provenance):

* `load_schaefer100_hcp()`: real HCP resting BOLD, Schaefer-100 / Yeo-7 (brain_atlas.py).
* `load_glasser360_surrogate(...)`: Glasser-360 / CAB-NP, series simulated from real HCP FC (brain_atlas.py).
* `load_user_data(path, regions=None, ...)`: the user's .npy / .npz / .h5 / CIFTI files (user_data.py).
* `simulate_network(...)`: a nonlinear stochastic modular network (netsim.py).

Problems the user can fix raise `DataError` (one line: the problem and the fix).
"""

from pe_fast.data.brain_atlas import load_glasser360_surrogate, load_schaefer100_hcp
from pe_fast.data.netsim import simulate_network
from pe_fast.data.regions import DataError, RegionData, correlation_fc
from pe_fast.data.user_data import load_user_data

# Named packaged data sets (for a CLI flag such as --atlas).
ATLASES = {"schaefer100": load_schaefer100_hcp, "glasser360": load_glasser360_surrogate}

__all__ = ["ATLASES", "DataError", "RegionData", "correlation_fc", "load_glasser360_surrogate",
           "load_schaefer100_hcp", "load_user_data", "simulate_network"]
