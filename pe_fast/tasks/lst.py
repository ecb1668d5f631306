"""The Latin Square Task (LST) as a pe_fast task: 16 tokens (one per cell, a 5-dim one-hot), 4 classes read out at
the last cell, the 4×4 grid as ground truth. The puzzles themselves (files, solver, generator, distances,
generalisation set) are pe_fast.tasks.lst_puzzles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from pe_fast import columns
from pe_fast.metrics import gradients as gradient_metrics
from pe_fast.metrics import pe_geometry
from pe_fast.models import PE_KINDS
from pe_fast.models.absolute_pe import sinusoidal_nd
from pe_fast.tasks.base import TaskKind, TaskSetting, TaskView, per_model_cross_entropy
from pe_fast.tasks.lst_puzzles import (CONDITIONS, DEFAULT_GENERALISATION, DEFAULT_OOD_MIN_DISTANCE,
                                       DEFAULT_OOD_PER_CONDITION, NUM_CELLS, NUM_SHAPES, NUM_SYMBOLS, Puzzles,
                                       PuzzleFileError, authors_puzzles, default_generalisation_set, encode,
                                       first_repeat, generalisation_set, nearest_jaccard_distance,
                                       read_puzzle_folder, stratified_split)

PROBE_NAMES = ("same_row", "same_col", "same_row_or_col")


def grid_coordinates() -> np.ndarray:
    """(row, col) of each of the 16 cells in row-major order, [16,2] float64."""
    cells = np.arange(NUM_CELLS)
    return np.stack([cells // 4, cells % 4], axis=1).astype(np.float64)


def probes() -> torch.Tensor:
    """Relation matrices [3,16,16] (PROBE_NAMES): T[i,j] = 1 if cell j shares cell i's row (column,
    row or column) and j != i."""
    rc = grid_coordinates()
    same_row = rc[:, None, 0] == rc[None, :, 0]
    same_col = rc[:, None, 1] == rc[None, :, 1]
    not_self = ~np.eye(NUM_CELLS, dtype=bool)
    stacked = np.stack([same_row & not_self, same_col & not_self, (same_row | same_col) & not_self])
    return torch.from_numpy(stacked.astype(np.float32))


# --------------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------------


@dataclass
class LSTSplit:
    """Model-ready puzzles: ``x`` [P,16,5] float32, ``y`` [P] int64 (shape - 1), ``condition`` [P] int64."""

    x: torch.Tensor
    y: torch.Tensor
    condition: torch.Tensor

    @classmethod
    def from_puzzles(cls, puzzles: Puzzles) -> "LSTSplit":
        return cls(
            encode(puzzles.grids),
            torch.as_tensor(puzzles.answers - 1, dtype=torch.int64),
            torch.as_tensor(puzzles.conditions, dtype=torch.int64),
        )

    def __len__(self) -> int:
        return len(self.y)


class LSTTask:
    """The LST as a classification task: 16 tokens of 5 features, 4 classes, read out at the last cell.

    Splits: "train"/"test" = 90/10 split (stratified by condition, seed 42) of the training pool (``train_path``,
    by default the authors' 9,000 puzzles, which ship with pe_fast); "ood" = puzzles far (Jaccard) from the
    whole pool, read from ``ood_path`` or built by generalisation_set.
    """

    name = "lst"
    num_tokens = NUM_CELLS
    token_dim = NUM_SYMBOLS
    num_classes = NUM_SHAPES
    # No special token: the model reads its answer out at the last cell, as the authors' did.
    readout_token = NUM_CELLS - 1
    condition_names = CONDITIONS
    probe_names = PROBE_NAMES
    attention_split = "ood"  # the split whose attention statistics are recorded at each evaluation
    data_kind = data_line = None  # the puzzles' provenance is in the description

    def __init__(
        self,
        train_path: str | os.PathLike | None = None,
        ood_path: str | os.PathLike | None = None,
        seed: int = 0,
        ood_per_condition: int = DEFAULT_OOD_PER_CONDITION,
        ood_min_distance: float = DEFAULT_OOD_MIN_DISTANCE,
    ):
        pool = authors_puzzles() if train_path is None else read_puzzle_folder(train_path)
        if ood_path is not None:
            ood = read_puzzle_folder(ood_path)
            both = np.concatenate([pool.grids, ood.grids])
            if (repeat := first_repeat(both)) is not None:  # each alone has none: an ood puzzle is a pool's
                raise PuzzleFileError(ood_path, 0, f"its puzzle {repeat[0] - len(pool) + 1} is a training puzzle "
                                                   f"(puzzle {repeat[1] + 1} of {pool.source}): generalisation "
                                                   f"would be scored on puzzles the models trained on",
                                      setting="lst_ood")
        elif train_path is None and (ood_per_condition, ood_min_distance, seed) == DEFAULT_GENERALISATION:
            ood = default_generalisation_set()  # what the next line would draw, as it drew it once
        else:
            ood = generalisation_set(pool, ood_per_condition, ood_min_distance, seed=seed)
        train, test = stratified_split(pool, test_fraction=0.1, seed=42)
        if not len(test):  # every evaluation scores the test split
            raise PuzzleFileError(train_path, 0, f"its {len(pool)} puzzles leave no test puzzle (a tenth of each "
                                                 f"condition's, rounded): give at least 6 of one condition")
        achieved = float(nearest_jaccard_distance(ood.grids, pool.grids).min()) if len(ood) else None

        self.puzzles = {"train": train, "test": test, "ood": ood}
        self.splits = {name: LSTSplit.from_puzzles(p) for name, p in self.puzzles.items()}
        self.probes = probes()
        self.coordinates = grid_coordinates()
        self.description = {
            "task": self.name,
            "pool_source": pool.source,
            "ood_source": ood.source,
            "seed": seed,
            "split_seed": 42,
            "sizes": {name: len(p) for name, p in self.puzzles.items()},
            "conditions": {name: p.condition_counts() for name, p in self.puzzles.items()},
            "ood_min_distance_required": None if ood_path is not None else ood_min_distance,
            "ood_min_distance_achieved": achieved,
        }

    # ---- what training needs from the task: the loss, the scores and the PE's ground truth ----

    def training_batches(self, seeds: list[int], device: torch.device) -> "IndexedBatches":
        """index [M, B] -> (inputs [M,B,16,5], targets [M,B]) over the training split."""
        train = self.splits["train"]
        return IndexedBatches(train.x.to(device), train.y.to(device))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each model, [M]: outputs [M,B,4] logits, targets [M,B] (shape − 1)."""
        return per_model_cross_entropy(outputs, targets)

    def targets(self, split: str, items: torch.Tensor, num_models: int) -> torch.Tensor:
        return self.splits[split].y[items].expand(num_models, -1)

    def score(self, outputs: torch.Tensor, split: str, items: torch.Tensor) -> list[dict]:
        """Accuracy of each model on the given items of a split, overall and per condition.
        outputs [M, len(items), 4]."""
        truth = self.splits[split].y[items]
        condition = self.splits[split].condition[items]
        correct = (outputs.argmax(-1) == truth).float()  # [M, count]
        rows = []
        for m in range(len(outputs)):
            row = {columns.score(split, columns.ACCURACY): float(correct[m].mean())}
            for c, name in enumerate(CONDITIONS):
                members = condition == c
                row[columns.score(split, columns.ACCURACY, name)] = float(correct[m][members].mean()) if members.any() else float("nan")
            rows.append(row)
        return rows

    def pe_metrics(self, table: np.ndarray) -> dict:
        """How well one PE table [16, D] mirrors the 4×4 grid: the paper's RSA, Procrustes and distance measures."""
        grid_pe = sinusoidal_nd(self.coordinates, table.shape[1])
        metrics = {"pe_rsa": pe_geometry.rsa(table, self.coordinates),
                   "pe_procrustes": pe_geometry.procrustes_disparity(table, grid_pe),
                   "pe_dist_spearman": pe_geometry.distance_spearman(table, self.coordinates),
                   **gradient_metrics.rank_metrics(table)}
        # the PE's top two principal axes against the grid's rows and columns (issue 19)
        metrics["pe_row_axis_r2"], metrics["pe_col_axis_r2"] = gradient_metrics.grid_axis_alignment(
            table, *self.coordinates.T)
        return metrics

    def baselines(self) -> list[dict]:
        return []  # the paper's references are PE kinds (sin2d, none), trained like the others

    def ground_truth(self) -> dict[str, np.ndarray]:
        return {}  # the grid is fixed: grid_coordinates() and probes()


class IndexedBatches:
    """Batches are rows of the training split; no state of their own (the batch order is train.py's)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __call__(self, index: torch.Tensor):
        return self.x[index], self.y[index]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


# The authors' configuration, from their code and logs: 4000 epochs of 63 steps; meant for a GPU. Their
# sinusoidal PE modules apply dropout 0.1 to x + PE (pe_dropout; the other PEs get none): without it our 2D
# sinusoidal PE fits better and generalises worse than theirs (docs/reproduction-lst.md, "The paper's figure at
# epoch 200").
AUTHORS_SINUSOIDAL_PE_DROPOUT = 0.1
PAPER = dict(pe="learned,sin2d,sin1d,rope,relative,none,random",
             sigmas=",".join(f"{s / 10:g}" for s in range(1, 21)), seeds=15, steps=252_000, width=160, depth=4,
             heads=1, mlp_width=640, batch_size=128, lr=1e-4, optimizer="adamw", schedule="constant", warmup=0,
             eval_every=12_600, pe_dropout=AUTHORS_SINUSOIDAL_PE_DROPOUT)

KIND = TaskKind(
    name="lst",
    defaults=dict(pe="learned,sin2d,none", sigmas="0.1,0.2,2.0", seeds=3, steps=2000, width=64, depth=4, heads=1,
                  batch_size=128, lr=1e-3, optimizer="adamw", schedule="constant", warmup=0, eval_every=250),
    presets={
        # Fits 2 CPU cores in about 10 minutes and shows the paper's effect (docs/reproduction-lst.md).
        "cpu": dict(pe="learned,sin2d", sigmas="0.2,2.0", seeds=3, steps=6000, width=32, depth=4, heads=1,
                    mlp_width=128, batch_size=64, lr=2e-3, schedule="cosine", warmup=200, eval_every=1000),
        "paper": PAPER,
        # The paper's figure at the authors' epoch 200 (200 × 63 steps), where every setting has reached its final
        # accuracy (their logs, which ship in pe_fast/data/lst_authors): their 21 settings × 15 seeds, for
        # `python -m pe_fast.compare_lst_logs`. Checkpoints every 500 steps, so that a GPU granted in short
        # slots makes progress in each (docs/reproduction-lst.md, "The paper's figure at epoch 200").
        "paper-e200": {**PAPER, "pe": "learned,sin2d", "steps": 12_600, "eval_every": 3_150, "checkpoint_every": 500},
    },
    pe_kinds=PE_KINDS,
    settings=(TaskSetting("lst_train", str, "training puzzles: a CSV file or a folder of them", files="one"),
              TaskSetting("lst_ood", str, "generalisation puzzles (CSV); default: generated, unlike the training set",
                          files="one")),
    summary=("train_acc", "test_acc", "ood_acc", "ood_acc_binary", "ood_acc_ternary", "ood_acc_quaternary",
             "pe_rsa", "pe_dist_spearman", "pe_effective_rank", "pe_row_axis_r2", "pe_col_axis_r2"),
    view=TaskView(
        score="ood_acc",
        generalisation=("ood_acc", "ood_acc_binary", "ood_acc_ternary", "ood_acc_quaternary"),
        similarity=("pe_rsa", "pe_dist_spearman", "pe_procrustes"),
        summary=("train_acc", "test_acc", "ood_acc", "ood_acc_binary", "ood_acc_ternary", "ood_acc_quaternary",
                 "pe_rsa"),
        probe="same_row_or_col", fit="train_acc", reference_pe="sin2d", figures=("learned_pe_grid",),
        paper_rho=(0.96, "on the LST"),  # unverified
        fixed_geometry=("grid distance", grid_coordinates)),
    load=lambda s: LSTTask(train_path=s.lst_train, ood_path=s.lst_ood),
    readout_token=LSTTask.readout_token,
    baselines=(),
    model_dims=lambda s: (LSTTask.token_dim, LSTTask.num_classes),
)
