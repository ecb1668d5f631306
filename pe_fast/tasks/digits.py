"""Masked-pixel prediction on real handwritten digits (pe_fast.data.digits): the fMRI task's objective and measures
(pe_fast.tasks.masked_regions) with pixels (or 2 × 2 patches) for regions, so that the ground truth the PE is compared
with, the token grid, is exact rather than estimated. The tokens' coordinates are the grid's two axes, so the 2D
sinusoidal PE and 2D RoPE apply as on the LST. And the digit classified from the same tokens (digits_class)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from pe_fast import columns
from pe_fast.data.digits import (PATCH, SIDE, TOKENS, digit_images, grid_coordinates, load_digit_regions,
                                 patch_pixels, source, training_count)
from pe_fast.metrics import pe_geometry
from pe_fast.models.transformer import PE_KINDS
from pe_fast.seeds import EVAL_MASK_SEED
from pe_fast.tasks.base import TaskKind, TaskSetting, TaskView, per_model_cross_entropy
from pe_fast.tasks.lst import IndexedBatches
from pe_fast.tasks.masked_regions import (ALL_BASELINES, BY_SUBJECT_SETTINGS, REGION_DEFAULTS, REGION_VIEW,
                                          MaskedRegionTask, RegionSplit, conditional_expectation, masked_input,
                                          probe_matrices, random_masks, reference_gradients)


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
TRAIN_IMAGES = TaskSetting("train_images", int, "train on the first N of the 1,349 training images (default all; "
                           "with --window 1)", range=(1, None, "[)"))


TOKENS_SETTING = TaskSetting("tokens", str, "pixels (64 tokens, default) or patches (16 tokens of 2x2 pixels)",
                             default="pixels", choices=TOKENS)


def check_train_images(count: int, available: int, least: int = 1) -> int:
    if count < least:
        raise ValueError(f"--train-images {count}: the masked task needs at least {least} training images (the "
                         "linear baseline's pixel covariance)")
    if count > available:
        raise ValueError(f"--train-images {count}: the training split has {available} images")
    return count


def patch_mask_as_pixels(mask: torch.Tensor) -> torch.Tensor:
    """[S, 16] a mask of patches -> [S, 64] the mask of their pixels."""
    patch_of_pixel = np.empty(SIDE * SIDE, dtype=np.int64)
    patch_of_pixel[patch_pixels()] = np.arange(len(patch_pixels()))[:, None]
    return mask[:, torch.from_numpy(patch_of_pixel)]


PATCH_DIMS = (PATCH * PATCH + 1, PATCH * PATCH)  # a masked patch task's token_dim, num_classes: 4 pixels and the flag


class DigitsTask(MaskedRegionTask):
    """The masked-region task on the digits, its PEs built on the 2D token grid (the region tasks' sinnd and
    distance measures on the same grid, as the data's "centroids" in a plane). `data`: the pixels' region data
    (load_digit_regions()); tokens "patches": each token a 2 × 2 patch whose 4 pixels are its values, masked and
    predicted together, measured against the patches' 4 × 4 grid, quadrants and correlation."""

    def __init__(self, data, name: str, train_images: int | None = None, tokens: str = "pixels", **options):
        super().__init__(data, name, **options)
        if train_images is not None and self.description["window"] != 1:
            # an item is then a window of images, cut within each run: the first N items spanned N + window - 1
            # images, and no count of items is a count of images
            raise ValueError(f"--train-images {train_images} with --window {self.description['window']}: each item "
                             f"then spans {self.description['window']} images; use one or the other")
        if train_images is not None:  # a small training set, where the PE's inductive bias should matter most
            train = self.splits["train"]
            keep = slice(0, check_train_images(train_images, len(train), least=2))
            self.splits["train"] = type(train)(train.values[keep], train.mask[keep], train.x[keep])
            flat = train.values[keep].numpy().transpose(0, 2, 1).reshape(-1, self.num_tokens).astype(np.float64)
            self.train_covariance = np.cov(flat, rowvar=False)  # the linear reference fits the same images
            self.description["sizes"]["train"] = len(self.splits["train"])
        self.tokens = self.description["tokens"] = tokens
        if tokens == "patches":
            self.group_into_patches(data)
        elif tokens != "pixels":
            raise ValueError(f"--tokens {tokens!r}: choose from {', '.join(TOKENS)}")
        self.coordinates = grid = grid_coordinates(math.isqrt(self.num_tokens))
        # the grid's own attention probes beside the region tasks' (quadrant, distance, pixel correlation)
        self.probe_names = [*self.probe_names, *GRID_PROBES]
        self.probes = torch.cat([self.probes, grid_probes(grid)])
        self.description["probes"] = self.probe_names

    def group_into_patches(self, pixels):
        """The pixel splits (z-scored per pixel, as the pixel task's) as 16 tokens of 4 values, masked anew by
        patch; the ground truth, probes and gradients those of the patches."""
        window, mask_fraction = self.description["window"], self.description["mask_fraction"]
        if window != 1:
            raise ValueError(f"--window {window}: --tokens patches takes --window 1 (a patch's 4 pixels are its "
                             "values)")
        self.data = load_digit_regions(np.concatenate(pixels.runs), tokens="patches")
        self.gradients = reference_gradients(self.data)
        self.pixel_covariance = self.train_covariance  # the linear reference predicts pixels from pixels
        N = len(self.data.labels)
        self.num_tokens = N
        self.token_dim, self.num_classes = PATCH_DIMS
        self.num_masked = max(1, min(N - 1, round(mask_fraction * N)))
        generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
        for split_name, part in self.splits.items():
            values = part.values[:, torch.from_numpy(patch_pixels()), 0]  # [S, 16, 4]
            mask = random_masks((len(values), N), self.num_masked, generator)
            self.splits[split_name] = RegionSplit(values, mask, masked_input(values, mask))
        self.probes = torch.tensor(probe_matrices(self.data, self.probe_names), dtype=torch.float32)
        self.description.update(regions=N, masked_tokens=self.num_masked)

    def baseline_predictions(self, kind: str, split: str) -> torch.Tensor:
        """As the region task's; for patches, the linear reference predicts the masked patches' pixels from the
        visible pixels with the pixels' covariance (the best linear predictor of the pixels themselves)."""
        if self.tokens == "pixels" or kind != "baseline:linear":
            return super().baseline_predictions(kind, split)
        part = self.splits[split]
        pixels = torch.empty(len(part), SIDE * SIDE, 1, dtype=torch.float64)
        pixels[:, torch.from_numpy(patch_pixels()), 0] = part.values.double()
        filled = conditional_expectation(pixels, patch_mask_as_pixels(part.mask), self.pixel_covariance)
        return filled[:, torch.from_numpy(patch_pixels()), 0].float()

    def pe_metrics(self, table: np.ndarray) -> dict:
        """The region task's measures, and the paper's RSA against the tokens' grid distance."""
        return {"pe_rsa": pe_geometry.rsa(table, self.coordinates), **super().pe_metrics(table)}


@dataclasses.dataclass
class DigitSplit:
    x: torch.Tensor  # [images, 64, 1]: grey levels scaled to [0, 1]
    y: torch.Tensor  # [images] the digit

    def __len__(self) -> int:
        return len(self.y)


CLASS_BASELINES = ("baseline:logistic", "baseline:majority")  # a logistic regression on the pixels; the commonest digit


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
        images, digits = digit_images()
        if np.abs(images[:, self.readout_token]).max() != 0:
            raise ValueError("the read-out pixel is not blank in every image")
        cut = training_count(len(images))
        x = torch.from_numpy(images / 16.0).float()
        x = x[:, patch_pixels()] if tokens == "patches" else x.unsqueeze(-1)  # [P, 16 patches, 4 pixels]
        self.num_tokens, self.token_dim = x.shape[1:]
        y = torch.from_numpy(digits)
        kept = cut if train_images is None else check_train_images(train_images, cut)
        if len(shown := y[:kept].unique()) < 2:  # the logistic baseline's fit, after training, failed on one class
            raise ValueError(f"--train-images {kept}: the first {kept} training image(s) show the digit "
                             f"{int(shown[0])} only; a classifier needs two classes or more (the first 2 images "
                             f"show {len(y[:2].unique())})")
        self.splits = {"train": DigitSplit(x[:kept], y[:kept]), "test": DigitSplit(x[cut:], y[cut:])}
        # the masked task's measures on the same tokens: the grid, the tokens' correlation, the quadrants
        self.measures = DigitsTask(load_digit_regions(images), "digits", tokens=tokens)
        self.coordinates = self.measures.coordinates
        self.probes = grid_probes(self.coordinates)
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
        return self.measures.pe_metrics(table)

    def baselines(self) -> list[dict]:
        """A logistic regression on the pixels (multinomial, scikit-learn's default regularisation), and the most
        frequent training digit."""
        from sklearn.linear_model import LogisticRegression
        train = self.splits["train"]
        flat = {name: split.x.reshape(len(split), -1).numpy() for name, split in self.splits.items()}
        fit = LogisticRegression(max_iter=2000).fit(flat["train"], train.y.numpy())
        common = int(torch.bincount(train.y).argmax())
        rows = []
        for kind, predict in zip(CLASS_BASELINES, (lambda name: fit.predict(flat[name]),
                                                   lambda name: np.full(len(self.splits[name]), common))):
            row = {"pe": kind, "sigma": float("nan")}
            for name, split in self.splits.items():
                row[columns.score(name, columns.ACCURACY)] = float(np.mean(predict(name) == split.y.numpy()))
            rows.append(row)
        return rows

    def ground_truth(self) -> dict[str, np.ndarray]:
        """The masked task's (the grid as centroids, the tokens' correlation, the quadrants): the report's RSA and
        figures read them."""
        return self.measures.ground_truth()


# A GPU's share of both digit tasks: the finer σ grid and ten seeds, so that the paired σ differences get intervals
# three seeds cannot give; still stopping when every score levels off. The masked task may train 20,000 steps, since
# its 5,000-step default and a 15,000-step run had not levelled off on 2 cores (docs/reproduction-digits.md).
GPU_PRESET = dict(pe="learned,sin2d,none", sigmas="0.01,0.1,0.2,0.5,1,2", seeds=10)


def load(s) -> DigitsTask:
    return DigitsTask(load_digit_regions(), s.task, train_images=s.train_images, tokens=s.tokens,
                      mask_fraction=s.mask_fraction, window=s.window, split=s.split)


KIND = TaskKind(
    name="digits",
    # The fMRI default's training, with the controls the grid allows: the 2D sinusoidal PE and no PE.
    defaults={**REGION_DEFAULTS, "pe": "learned,sin2d,none"},
    presets={"all-pes": dict(pe="learned,sin2d,rope2d,sin1d,random,none"),
             "gpu": {**GPU_PRESET, "steps": 20_000, "eval_every": 500}},
    pe_kinds=PE_KINDS,
    settings=(*BY_SUBJECT_SETTINGS, TRAIN_IMAGES, TOKENS_SETTING),
    summary=("train_mse", "test_mse", "test_r2", "pe_dist_spearman", "pe_procrustes", "pe_rsa", "pe_fc_corr",
             "pe_modularity", "pe_effective_rank"),
    # the PE against the exact grid first, then against the pixels' correlation and the quadrants; attention
    # alignment on each pixel's four grid neighbours; its learned-PE figures lay the PE out on the grid, and compare
    # its similarity with the pixels' correlation, as fMRI's does with FC
    view=dataclasses.replace(REGION_VIEW, probe="neighbours",
                             similarity=("pe_dist_spearman", "pe_procrustes", "pe_rsa", "pe_fc_corr", "pe_modularity",
                                         "pe_segregation", "pe_gradient_corr"),
                             figures=(*REGION_VIEW.figures, "learned_pe_on_grid")),
    load=load,
    readout_token=DigitsTask.readout_token,
    baselines=ALL_BASELINES,
    # a patch's 4 pixels are its values (--window 1); a pixel's, its window of one
    model_dims=lambda s: PATCH_DIMS if s["tokens"] == "patches" else MaskedRegionTask.model_dims(s),
)

CLASS_KIND = TaskKind(
    name="digits_class",
    # the masked task's model and training, read out at one token: converges within the budget on 2 cores
    defaults={**REGION_DEFAULTS, "pe": "learned,sin2d,none", "batch_size": 64, "steps": 3000},
    presets={"all-pes": dict(pe="learned,sin2d,rope2d,sin1d,random,none"), "gpu": GPU_PRESET},
    pe_kinds=PE_KINDS,
    settings=(TRAIN_IMAGES, TOKENS_SETTING),
    summary=("train_acc", "test_acc", "pe_dist_spearman", "pe_procrustes", "pe_rsa", "pe_fc_corr",
             "pe_effective_rank"),
    view=TaskView(score="test_acc", generalisation=("test_acc",),
                  similarity=("pe_dist_spearman", "pe_procrustes", "pe_rsa", "pe_fc_corr", "pe_modularity"),
                  summary=("train_acc", "test_acc", "pe_dist_spearman", "pe_procrustes", "pe_rsa", "pe_fc_corr"),
                  probe="neighbours", fit=None, figures=("learned_pe_on_grid",)),
    load=lambda s: DigitClassTask(s.train_images, s.tokens),
    readout_token=DigitClassTask.readout_token,
    baselines=CLASS_BASELINES,
    model_dims=lambda s: (PATCH * PATCH if s["tokens"] == "patches" else 1, DigitClassTask.num_classes),
)

