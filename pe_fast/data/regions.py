"""The one return type of every brain / network data source: region time series plus their ground truth.

A data source (the packaged atlases, the user's files, the network simulation) returns a `RegionData`:
a list of runs, each a [T_r, N] array of one run's activity in N regions (tokens), and what is known
about the regions: names, 3D centroids, a module (network) partition, functional connectivity (FC)
and, for simulated networks, the coupling matrix.

Runs are in raw units (not z-scored): the task decides the normalisation. They may be read-only
memory maps of the user's file; read them in slices (``run[t0:t1]``) and cast per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


# The connectivity gradients every region task compares learned PEs with (metrics.gradients.fc_gradients); a
# diffusion map of n regions has n − 2 of them at most, hence the fewest regions a task takes.
GRADIENTS = 3
MIN_REGIONS = GRADIENTS + 2


class DataError(ValueError):
    """A problem with the user's data or set-up: one line naming the problem and the fix.

    The CLI prints the message and exits with status 2.
    """


@dataclass
class RegionData:
    """Region time series and their ground truth.

    runs:          each [T_r, N]; float32, except memory-mapped user files, which keep the file's dtype
                   (cast slices with ``np.asarray(run[a:b], np.float32)``). Raw units, not z-scored.
                   Read-only where shared (memory maps, the packaged data's cache): copy before editing.
    subjects:      subject id of each run (split by subject = group runs by this).
    run_names:     name of each run, e.g. "REST1_LR".
    labels:        [N] region names.
    centroids:     [N, 3] region centroids in MNI mm, or None when unknown.
    networks:      [N] int 0..K-1 ground-truth module of each region, or None.
    network_names: K names, or None.
    fc:            [N, N] ground-truth functional connectivity (Pearson r, unit diagonal).
    coupling:      [N, N] coupling matrix G of a simulated network (netsim only), else None.
    kind:          "fmri" | "simulated from real FC" | "netsim".
    source:        one-line provenance, for reports and config.json.
    tr_seconds:    sampling interval in seconds, or None.
    gradients:     [N, k] reference connectivity gradients (column 0 = the principal gradient), or None: the
                   task computes them from fc (pe_fast.metrics.gradients.fc_gradients).
    covariance:    [N, N] the covariance that generated a simulated Gaussian series (the Glasser-360 surrogate),
                   or None: with it the linear baseline is the best predictor there is, not an estimate of it.
    """

    runs: list[np.ndarray]
    subjects: list[str]
    run_names: list[str]
    labels: np.ndarray
    centroids: np.ndarray | None
    networks: np.ndarray | None
    network_names: list[str] | None
    fc: np.ndarray
    coupling: np.ndarray | None
    kind: str
    source: str
    tr_seconds: float | None
    gradients: np.ndarray | None = None
    covariance: np.ndarray | None = None

    def __post_init__(self):
        n = len(self.labels)
        if not self.runs or len(self.subjects) != len(self.runs) or len(self.run_names) != len(self.runs):
            raise ValueError("RegionData needs at least one run and one subject id and run name per run")
        for r in self.runs:
            if r.ndim != 2 or r.shape[1] != n:
                raise ValueError(f"a run of shape {r.shape} does not match {n} region labels")
        if self.fc.shape != (n, n):
            raise ValueError(f"fc of shape {self.fc.shape} does not match {n} regions")
        if self.centroids is not None and self.centroids.shape != (n, 3):
            raise ValueError(f"centroids of shape {self.centroids.shape} do not match {n} regions")
        if self.networks is not None:
            if self.networks.shape != (n,) or self.network_names is None:
                raise ValueError("networks must be [N] ints with network_names")
            if self.networks.min() < 0 or self.networks.max() >= len(self.network_names):
                raise ValueError("network ids must lie in 0..len(network_names)-1")
        if self.coupling is not None and self.coupling.shape != (n, n):
            raise ValueError(f"coupling of shape {self.coupling.shape} does not match {n} regions")
        if self.covariance is not None and self.covariance.shape != (n, n):
            raise ValueError(f"covariance of shape {self.covariance.shape} does not match {n} regions")
        if self.gradients is not None and (self.gradients.ndim != 2 or len(self.gradients) != n):
            raise ValueError(f"gradients of shape {self.gradients.shape} do not match {n} regions")

    @property
    def n_regions(self) -> int:
        return len(self.labels)

    @property
    def n_timepoints(self) -> int:
        """Time points over all runs."""
        return sum(r.shape[0] for r in self.runs)

    def runs_of(self, subjects: Sequence[str]) -> list[int]:
        """Indices of the runs that belong to the given subjects (for a split by subject)."""
        wanted = set(subjects)
        return [i for i, s in enumerate(self.subjects) if s in wanted]

    def summary(self) -> str:
        """One line for logs: kind, sizes, what ground truth is there."""
        k = "no networks" if self.network_names is None else f"{len(self.network_names)} networks"
        c = "centroids" if self.centroids is not None else "no centroids"
        return (f"{self.kind}: {self.n_regions} regions, {len(self.runs)} runs of "
                f"{len(set(self.subjects))} subjects, {self.n_timepoints} time points, {k}, {c}; {self.source}")


# the FC sums T squared values in float64: |x| at most 1e150 keeps even 1e8 time points finite
MAX_ABS_VALUE = 1e150
# and a region's spread (or a connectivity gradient's) at least 1e-150, so that its squares stay normal floats
# (1e-300 > 2.2e-308): less would underflow to a sd of 0 and read as a constant region
MIN_SPREAD = 1 / MAX_ABS_VALUE
MAX_COORDINATE_MM = 1e6  # a kilometre: far beyond any brain, in any unit a table would use
# a millimetre: a brain's regions lie tens of mm apart; centroids in metres (0.1 across) make the sinusoidal PE over
# them (sinnd, whose fastest wave turns once per 2π units) the same for every region
MIN_MEDIAN_DISTANCE_MM = 1.0


def centroids_problem(centroids: np.ndarray, coinciding: bool = True) -> str | None:
    """What keeps centroids [N, 3] from being the regions' places, whatever their source (a regions table, a
    results folder's ground truth), or None; coinciding=False leaves out whether they coincide (the caller names
    the regions that do)."""
    if not np.isfinite(centroids).all():
        return "hold NaN or Inf"
    if np.abs(centroids).max() > MAX_COORDINATE_MM:  # squared distances would overflow to inf
        return f"hold values beyond ±{MAX_COORDINATE_MM:,.0f}"
    span = float(np.ptp(centroids, axis=0).max()) if len(centroids) else 0.0
    if 0 < span < MIN_MEDIAN_DISTANCE_MM:  # and below ~1e-154 their squared distances underflow to 0 as well
        return (f"span only {span:.3g} mm, less than {MIN_MEDIAN_DISTANCE_MM:g} mm (a brain's regions lie tens of mm "
                f"apart: metres?)")
    # the median too: one region far off left a table in metres above the span's rule
    median = median_centroid_distance(centroids) if len(centroids) > 1 else 0.0
    if 0 < median < MIN_MEDIAN_DISTANCE_MM:
        return (f"lie a median {median:.3g} mm apart, less than {MIN_MEDIAN_DISTANCE_MM:g} mm (a brain's regions lie "
                f"tens of mm apart: metres?)")
    if coinciding and median == 0:
        return "put over half the pairs of regions on one point (their median distance, the 3D measures' scale, is 0)"
    return None


def median_centroid_distance(centroids: np.ndarray) -> float:
    """The median distance between two regions' centroids: the length scale of the 3D measures (the near_3d
    attention probe). It is 0 when more than half the pairs of regions share a point, which leaves those
    measures undefined (0 / 0), and with every region on one point the Procrustes fit of a PE to the
    centroids too (its SVD does not converge): a centroid source must refuse such centroids."""
    d = np.linalg.norm(centroids[:, None] - centroids[None, :], axis=-1)
    return float(np.median(d[np.triu_indices(len(centroids), 1)]))


def correlation_fc(runs: Sequence[np.ndarray], chunk_rows: int = 4096) -> np.ndarray:
    """FC of a set of runs: the Pearson correlation of each run, averaged with weights T_r.

    Equal to the correlation of the concatenated runs after each run is z-scored per region, so a
    run's own mean and scale do not leak into the FC. Reads each run in slices of `chunk_rows` rows,
    so a memory-mapped run is never loaded whole. A region that is constant in a run gets zero
    correlations in that run (its diagonal stays 1).
    """
    n = runs[0].shape[1]
    total = np.zeros((n, n))
    weight = 0
    for run in runs:
        t = run.shape[0]
        mean = np.zeros(n)
        for a in range(0, t, chunk_rows):
            mean += np.asarray(run[a:a + chunk_rows], np.float64).sum(0)
        mean /= t
        cov = np.zeros((n, n))
        for a in range(0, t, chunk_rows):
            x = np.asarray(run[a:a + chunk_rows], np.float64) - mean  # centred first: raw BOLD means are ~1e4
            cov += x.T @ x
        sd = np.sqrt(np.diag(cov))
        scale = np.where(sd > 0, 1.0 / np.where(sd > 0, sd, 1.0), 0.0)
        total += t * (cov * scale[:, None] * scale[None, :])
        weight += t
    fc = total / weight
    np.fill_diagonal(fc, 1.0)
    return (fc + fc.T) / 2
