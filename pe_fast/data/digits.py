"""Real handwritten digits as region data: each pixel of the 8 × 8 images a token (or each 2 × 2 patch of them, 16
tokens on a 4 × 4 grid), each image a time point.

The 1,797 images of scikit-learn's `load_digits` (the UCI "Optical Recognition of Handwritten Digits" test set, E.
Alpaydin and C. Kaynak, 1998; CC BY 4.0; shipped inside scikit-learn, no download) are cut into GROUPS groups of
consecutive images, each one "run" of its own "subject", so that the masked-region task's split by subject is a
fixed split by image (its last quarter of groups is the test set). The ground truth is exact: every pixel's grid
position (row, column), the image quadrant it lies in (the "networks"), and the pixels' correlation over the training
images (the "FC"); for patches, the correlation of the patches' mean grey levels."""
from __future__ import annotations

import numpy as np

from pe_fast.data.regions import DataError, RegionData

SIDE = 8
PATCH = 2  # a patch token is PATCH × PATCH pixels
TOKENS = ("pixels", "patches")
GROUPS = 8  # runs of about 225 images: the last 2 (449 images) are the test set
QUADRANTS = ("top left", "top right", "bottom left", "bottom right")


def source(count: int) -> str:
    return f"scikit-learn load_digits: {count} handwritten digits, 8x8 pixels (UCI, CC BY 4.0)"


def grid_coordinates(side: int = SIDE) -> np.ndarray:
    """[side², 2] (row, column) of every token of a side × side grid, in row-major order (the images' pixels)."""
    rows, columns = np.divmod(np.arange(side * side), side)
    return np.stack([rows, columns], axis=1).astype(np.float64)


def patch_pixels() -> np.ndarray:
    """[16, 4] the pixel indices of each 2 × 2 patch: patches row-major on their 4 × 4 grid, pixels row-major within
    a patch."""
    patch_rows, patch_columns = grid_coordinates(SIDE // PATCH).astype(int).T
    within_rows, within_columns = grid_coordinates(PATCH).astype(int).T
    return ((PATCH * patch_rows[:, None] + within_rows) * SIDE + PATCH * patch_columns[:, None] + within_columns)


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """The images [1797, 64] (grey levels 0-16) and their digits [1797]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("--task digits reads scikit-learn's digits: pip install scikit-learn")
    digits = load_digits()
    return digits.data.astype(np.float32), digits.target.astype(np.int64)


def pixel_correlation(images: np.ndarray) -> np.ndarray:
    """Pearson r between pixels over the images, a constant pixel (the blank border) correlated with none."""
    images = np.asarray(images, dtype=np.float64)
    centred = images - images.mean(0)
    norm = np.linalg.norm(centred, axis=0)
    scaled = centred / np.where(norm > 0, norm, 1.0)
    corr = scaled.T @ scaled
    np.fill_diagonal(corr, 1.0)
    return corr


def image_groups(count: int) -> list[np.ndarray]:
    """The images' indices in GROUPS runs of consecutive images."""
    return np.array_split(np.arange(count), GROUPS)


def training_count(count: int) -> int:
    """How many of the first images train: those of every group but the last quarter (the masked-region task's
    split by subject, which both digit tasks follow)."""
    return sum(len(group) for group in image_groups(count)[:GROUPS - GROUPS // 4])


def load_digit_regions(images: np.ndarray | None = None, tokens: str = "pixels") -> RegionData:
    """The digits as region data; `images` [count, 64]: those of digit_images, already loaded. tokens "patches": a
    patch's series is its mean grey level (what its "FC" correlates); the masked task trains on the pixels
    themselves (pe_fast.tasks.digits)."""
    if tokens not in TOKENS:
        raise ValueError(f"--tokens {tokens!r}: choose from {', '.join(TOKENS)}")
    images = digit_images()[0] if images is None else images
    side = SIDE
    if tokens == "patches":
        images, side = images[:, patch_pixels()].mean(-1), SIDE // PATCH
    groups = image_groups(len(images))
    train = np.arange(training_count(len(images)))
    grid = grid_coordinates(side)
    quadrant = (grid[:, 0] >= side // 2).astype(int) * 2 + (grid[:, 1] >= side // 2).astype(int)
    return RegionData(
        runs=[images[index] for index in groups], subjects=[f"images{i}" for i in range(GROUPS)],
        run_names=["all"] * GROUPS, labels=np.array([f"r{r}c{c}" for r, c in grid.astype(int)]),
        # the grid as "centroids" (the region tasks' 3D positions): token units, in a plane
        centroids=np.concatenate([grid, np.zeros((len(grid), 1))], axis=1), networks=quadrant,
        network_names=list(QUADRANTS), fc=pixel_correlation(images[train]), coupling=None, kind="digits",
        source=source(len(images)),
        tr_seconds=None)
