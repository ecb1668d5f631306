"""Masked-pixel prediction on real handwritten digits (pe_fast.data.digits): the fMRI task's objective and measures
(pe_fast.tasks.masked_regions) with pixels for regions, so that the ground truth the PE is compared with, the pixel
grid, is exact rather than estimated. The tokens' coordinates are the grid's two axes, so the 2D sinusoidal PE and
2D RoPE apply as on the LST."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from pe_fast import columns
from pe_fast.metrics import gradients as gradient_metrics
from pe_fast.metrics import pe_geometry
from pe_fast.models.transformer import PE_KINDS
from pe_fast.tasks.base import TaskKind, TaskSetting, TaskView, per_model_cross_entropy
from pe_fast.tasks.lst import IndexedBatches
from pe_fast.tasks.masked_regions import REGION_DEFAULTS, REGION_SETTINGS, REGION_VIEW, MaskedRegionTask


GRID_PROBES = ("same_row", "same_column", "neighbours")


def grid_probes(grid: np.ndarray) -> torch.Tensor:
    """[3, N, N] attention probes of the pixel grid (row, column): same row, same column, the 4 neighbours; zero
    on the diagonal (attention to itself says nothing about structure)."""
    rows, cols = grid[:, :1], grid[:, 1:]
    stacked = np.stack([rows == rows.T, cols == cols.T,
                        np.abs(rows - rows.T) + np.abs(cols - cols.T) == 1]).astype(np.float32)
    stacked[:, np.arange(len(grid)), np.arange(len(grid))] = 0.0
    return torch.from_numpy(stacked)


# --train-images: the first N training images only (both digit tasks)
TRAIN_IMAGES = TaskSetting("train_images", int, "train on the first N of the 1,348 training images (default all)",
                           range=(1, None, "[)"))


TOKENS = ("pixels", "patches")
TOKENS_SETTING = TaskSetting("tokens", str, "pixels (64 tokens, default) or patches (16 tokens of 2x2 pixels)",
                             default="pixels", choices=TOKENS)


def check_train_images(count: int, available: int) -> int:
    if count > available:
        raise ValueError(f"--train-images {count}: the training split has {available} images")
    return count


class DigitsTask(MaskedRegionTask):
    """The masked-region task on the digits, its PEs built on the 2D pixel grid (the region tasks' sinnd and
    distance measures on the same grid, as the data's "centroids" in a plane)."""

    def __init__(self, data, name: str, train_images: int | None = None, **options):
        super().__init__(data, name, **options)
        if train_images is not None:  # a small training set, where the PE's inductive bias should matter most
            train = self.splits["train"]
            keep = slice(0, check_train_images(train_images, len(train)))
            self.splits["train"] = type(train)(train.values[keep], train.mask[keep], train.x[keep])
            flat = train.values[keep].numpy().transpose(0, 2, 1).reshape(-1, self.num_tokens).astype(np.float64)
            self.train_covariance = np.cov(flat, rowvar=False)  # the linear reference fits the same images
            self.description["sizes"]["train"] = len(self.splits["train"])
        from pe_fast.data.digits import grid_coordinates
        self.coordinates = grid = grid_coordinates()
        # the grid's own attention probes beside the region tasks' (quadrant, distance, pixel correlation)
        self.probe_names = [*self.probe_names, *GRID_PROBES]
        self.probes = torch.cat([self.probes, grid_probes(grid)])
        self.description["probes"] = self.probe_names


@dataclasses.dataclass
class DigitSplit:
    x: torch.Tensor  # [images, 64, 1]: grey levels scaled to [0, 1]
    y: torch.Tensor  # [images] the digit

    def __len__(self) -> int:
        return len(self.y)


class DigitClassTask:
    """The digit of each image, in the shape of a small vision transformer: every pixel a token (or every 2 × 2
    patch: 16 tokens of 4 grey levels on a 4 × 4 grid), the answer read out at the top-left token (the top-left pixel
    is blank in every image, so it serves as a class token with a position of its own; the top-left patch is
    nearly blank). The same split by image as the masked task; the PE measured against the token grid."""

    name = "digits_class"
    num_classes = 10
    readout_token = 0
    attention_split = "test"
    probe_names = list(GRID_PROBES)

    def __init__(self, train_images: int | None = None, tokens: str = "pixels"):
        from pe_fast.data.digits import SIDE, digit_images, load_digit_regions, source, training_count
        if tokens not in TOKENS:
            raise ValueError(f"--tokens {tokens!r}: choose from {', '.join(TOKENS)}")
        images, digits = digit_images()
        if np.abs(images[:, self.readout_token]).max() != 0:
            raise ValueError("the read-out pixel is not blank in every image")
        cut = training_count(len(images))
        x = torch.from_numpy(images / 16.0).float()
        if tokens == "patches":  # [P, 8, 8] -> [P, 16 patches (row-major), 4 pixels (row-major within the patch)]
            x = x.view(-1, SIDE // 2, 2, SIDE // 2, 2).permute(0, 1, 3, 2, 4).reshape(-1, (SIDE // 2) ** 2, 4)
        else:
            x = x.unsqueeze(-1)
        self.num_tokens, self.token_dim = x.shape[1:]
        y = torch.from_numpy(digits)
        kept = cut if train_images is None else check_train_images(train_images, cut)
        self.splits = {"train": DigitSplit(x[:kept], y[:kept]), "test": DigitSplit(x[cut:], y[cut:])}
        side = math.isqrt(self.num_tokens)
        rows, cols = np.divmod(np.arange(self.num_tokens), side)
        self.coordinates = np.stack([rows, cols], axis=1).astype(np.float64)
        self.probes = grid_probes(self.coordinates)
        # pixels: the masked task's measures (the grid, the pixels' correlation, the quadrants); patches: the grid's
        self.measures = DigitsTask(load_digit_regions(images), "digits") if tokens == "pixels" else None
        self.data_kind, self.data_line = "digits", f"data: digits: {source(len(images))}"
        self.description = {"task": self.name, "source": source(len(images)), "tokens": tokens, "readout_token": 0,
                            "sizes": {name: len(split) for name, split in self.splits.items()},
                            "split": f"images 0-{kept - 1} train, {cut}-{len(images) - 1} test"}

    def training_batches(self, seeds: list[int], device: torch.device) -> IndexedBatches:
        train = self.splits["train"]
        return IndexedBatches(train.x.to(device), train.y.to(device))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each model, [M]: outputs [M, B, 10] logits."""
        return per_model_cross_entropy(outputs, targets)

    def targets(self, split: str, items: torch.Tensor, num_models: int) -> torch.Tensor:
        return self.splits[split].y[items].expand(num_models, -1)

    def score(self, outputs: torch.Tensor, split: str, items: torch.Tensor) -> list[dict]:
        correct = (outputs.argmax(-1) == self.splits[split].y[items]).float()
        return [{columns.score(split, columns.ACCURACY): float(row.mean())} for row in correct]

    def pe_metrics(self, table: np.ndarray) -> dict:
        if self.measures is not None:
            return self.measures.pe_metrics(table)
        return {"pe_dist_spearman": pe_geometry.distance_spearman(table, self.coordinates),
                "pe_procrustes": pe_geometry.top_components_procrustes(table, self.coordinates),
                **gradient_metrics.rank_metrics(table)}

    def baselines(self) -> list[dict]:
        """A logistic regression on the pixels (multinomial, scikit-learn's default regularisation), and the most
        frequent training digit."""
        from sklearn.linear_model import LogisticRegression
        train = self.splits["train"]
        flat = {name: split.x.reshape(len(split), -1).numpy() for name, split in self.splits.items()}
        fit = LogisticRegression(max_iter=2000).fit(flat["train"], train.y.numpy())
        common = int(torch.bincount(train.y).argmax())
        rows = []
        for kind, predict in (("baseline:logistic", lambda name: fit.predict(flat[name])),
                              ("baseline:majority", lambda name: np.full(len(self.splits[name]), common))):
            row = {"pe": kind, "sigma": float("nan")}
            for name, split in self.splits.items():
                row[columns.score(name, columns.ACCURACY)] = float(np.mean(predict(name) == split.y.numpy()))
            rows.append(row)
        return rows

    def ground_truth(self) -> dict[str, np.ndarray]:
        return {}  # the grid is fixed: pe_fast.data.digits.grid_coordinates()


def load(s) -> DigitsTask:
    from pe_fast.data.digits import load_digit_regions
    return DigitsTask(load_digit_regions(), s.task, train_images=s.train_images, mask_fraction=s.mask_fraction,
                      window=s.window, split=s.split)


KIND = TaskKind(
    name="digits",
    # The fMRI default's training, with the controls the grid allows: the 2D sinusoidal PE and no PE.
    defaults={**REGION_DEFAULTS, "pe": "learned,sin2d,none"},
    presets={"all-pes": dict(pe="learned,sin2d,rope2d,sin1d,random,none"),
             # a GPU's share: the finer σ grid and ten seeds
             "gpu": dict(pe="learned,sin2d,none", sigmas="0.01,0.1,0.2,0.5,1,2", seeds=10)},
    pe_kinds=PE_KINDS,
    settings=(*REGION_SETTINGS, TRAIN_IMAGES),
    summary=("train_mse", "test_mse", "test_r2", "pe_dist_spearman", "pe_procrustes", "pe_fc_corr", "pe_modularity",
             "pe_effective_rank"),
    # the PE against the exact grid first, then against the pixels' correlation and the quadrants; attention
    # alignment on each pixel's four grid neighbours; its learned-PE figure compares the PE's similarity with the
    # pixels' correlation, as fMRI's does with FC (digits_class draws the PE on the grid)
    view=dataclasses.replace(REGION_VIEW, probe="neighbours",
                             similarity=("pe_dist_spearman", "pe_procrustes", "pe_fc_corr", "pe_modularity",
                                         "pe_segregation", "pe_gradient_corr")),
    load=load,
)

CLASS_KIND = TaskKind(
    name="digits_class",
    # the masked task's model and training, read out at one token: converges within the budget on 2 cores
    defaults={**REGION_DEFAULTS, "pe": "learned,sin2d,none", "batch_size": 64, "steps": 3000},
    presets={"all-pes": dict(pe="learned,sin2d,rope2d,sin1d,random,none")},
    pe_kinds=PE_KINDS,
    settings=(TRAIN_IMAGES, TOKENS_SETTING),
    summary=("train_acc", "test_acc", "pe_dist_spearman", "pe_procrustes", "pe_fc_corr", "pe_effective_rank"),
    view=TaskView(score="test_acc", generalisation=("test_acc",),
                  similarity=("pe_dist_spearman", "pe_procrustes", "pe_fc_corr", "pe_modularity"),
                  summary=("train_acc", "test_acc", "pe_dist_spearman", "pe_procrustes", "pe_fc_corr"),
                  probe="neighbours", fit=None, figures=("learned_pe_grid",)),
    load=lambda s: DigitClassTask(s.train_images, s.tokens),
)

