"""Writes the tiny example data set of this folder: series.npy and regions.csv (see README.md here).

    python docs/example-fmri/make_example.py

Four subjects × 200 time points × 10 regions in three networks. Each region's signal is its network's slow
shared signal plus a weaker global one and its own noise, so the regions of one network correlate with each other
more than with the rest; the centroids are made-up points in MNI-like millimetres, all distinct. Deterministic:
the same numbers on every run (numpy's PCG64 with seed 2406).
"""
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SUBJECTS, TIMEPOINTS = 4, 200
# label, x, y, z (mm), network
REGIONS = [
    ("V1_L", -10, -90, 2, "visual"), ("V1_R", 12, -88, 4, "visual"),
    ("V4_L", -30, -78, -12, "visual"), ("V4_R", 32, -76, -10, "visual"),
    ("M1_L", -38, -22, 58, "somatomotor"), ("M1_R", 40, -20, 56, "somatomotor"),
    ("SMA", 2, -6, 62, "somatomotor"),
    ("PCC", 0, -52, 28, "default"), ("mPFC", -2, 50, 8, "default"), ("AG_L", -46, -66, 34, "default"),
]


def ar1(rng: np.random.Generator, shape: tuple[int, ...], phi: float) -> np.ndarray:
    """A unit-variance AR(1) series along the first axis: slow, like BOLD."""
    noise = rng.standard_normal(shape)
    out = np.empty(shape)
    out[0] = noise[0]
    for t in range(1, shape[0]):
        out[t] = phi * out[t - 1] + np.sqrt(1 - phi ** 2) * noise[t]
    return out


def series(rng: np.random.Generator) -> np.ndarray:
    networks = sorted({r[4] for r in REGIONS})
    member = np.array([networks.index(r[4]) for r in REGIONS])
    subjects = []
    for _ in range(SUBJECTS):
        shared = ar1(rng, (TIMEPOINTS, len(networks)), 0.8)[:, member]  # each region gets its network's signal
        global_signal = ar1(rng, (TIMEPOINTS, 1), 0.9)
        own = ar1(rng, (TIMEPOINTS, len(REGIONS)), 0.5)
        subjects.append(1.0 * shared + 0.4 * global_signal + 0.7 * own)
    return np.stack(subjects).astype(np.float32)  # [subjects, time, regions]


def main() -> None:
    rng = np.random.default_rng(2406)
    np.save(HERE / "series.npy", series(rng))
    lines = ["label,x,y,z,network"] + [",".join(map(str, r)) for r in REGIONS]
    (HERE / "regions.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
