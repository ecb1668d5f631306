"""Masked-region prediction: the task of the paper's fMRI and network-simulation experiments.

One token per region (or network node). A sample is one TR of every region (or a window of w TRs); a fraction
of the tokens is masked and the model predicts their values. Token features are [values · (1 − mask), mask],
so the stacked input embedding's mask column is a learned mask embedding and a masked token carries no value.
Loss: MSE on the masked tokens. Each run is z-scored per region; train and test are split by subject (or by run).

Training draws fresh masks every step from each model's own generator (a model trains the same in a pack as
alone); evaluation uses one fixed mask per item, the same for every model and baseline.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch import Tensor

from pe_fast import columns
from pe_fast.data.regions import median_centroid_distance
from pe_fast.host_to_device import upload
from pe_fast.metrics import gradients as gradient_metrics
from pe_fast.metrics import modules as module_metrics
from pe_fast.metrics import pe_geometry
from pe_fast.metrics.correlation import pearson
from pe_fast.models import PE_KINDS
from pe_fast.seeds import EVAL_MASK_SEED, MASK_SEED_OFFSET
from pe_fast.tasks.base import TaskSetting, TaskView

SPLITS = ("subject", "run")
BASELINES = ("baseline:mean", "baseline:linear")
# only where the data carry the covariance that generated them (RegionData.covariance)
TRUE_COVARIANCE_BASELINE = "baseline:linear-true"
ALL_BASELINES = (*BASELINES, TRUE_COVARIANCE_BASELINE)  # where the data give their true covariance

# What the fMRI and the network-simulation task share as TaskKinds (pe_fast.tasks.fmri, pe_fast.tasks.netsim).
# sin2d and rope2d need a 2D grid, which brain regions and network nodes do not have.
REGION_PES = tuple(k for k in PE_KINDS if k not in ("sin2d", "rope2d"))
SPLIT = TaskSetting("split", str, "train/test split (default subject; run: each subject's last run, fmri only)",
                    default="subject", choices=SPLITS)
REGION_SETTINGS = (
    TaskSetting("mask_fraction", float, "fraction of tokens masked (default 0.2)", default=0.2, range=(0, 1, "()")),
    TaskSetting("window", int, "time points per token (default 1)", default=1, range=(1, None, "[)")),
    SPLIT,
)
# the network simulation's runs and the digit images are each a subject of its own: no subject has two runs
BY_SUBJECT_SETTINGS = tuple(dataclasses.replace(s, choices=("subject",)) if s is SPLIT else s for s in REGION_SETTINGS)
REGION_SUMMARY = ("train_mse", "test_mse", "test_r2", "pe_fc_corr", "pe_coupling_corr", "pe_modularity",
                  "pe_segregation", "pe_dist_spearman", "pe_gradient_corr", "pe_effective_rank", "pe_pc1_share")
REGION_VIEW = TaskView(
    score="test_r2",
    generalisation=("test_r2", "test_mse"),
    similarity=("pe_fc_corr", "pe_coupling_corr", "pe_modularity", "pe_segregation", "pe_dist_spearman",
                "pe_procrustes", "pe_gradient_corr"),
    summary=("test_mse", "test_r2", "pe_fc_corr", "pe_modularity", "pe_segregation"),
    probe="same_network", fit=None, figures=("pe_gradient", "learned_pe_fc"))
# Sized to reach the plateau of the test loss within 10 minutes on 2 CPU cores (docs/reproduction-fmri.md):
# four σ, and a constant rate, so that a flat last quarter is the models' plateau and not a schedule's end.
REGION_DEFAULTS = dict(pe="learned", sigmas="0.01,0.1,0.5,2", seeds=3, steps=5000, width=32, depth=2, heads=1,
                       mlp_width=64, batch_size=32, lr=3e-3, optimizer="adam", schedule="constant", warmup=50,
                       eval_every=250, eval_items=512, until="converged")
# The six σ of the earlier default, for a finer σ curve at 1.5× the time; and the default trained 4× longer, which
# reached the plateau on both tasks (docs/reproduction-fmri.md, -netsim.md: 38 min for fMRI, 26 for netsim, 2 cores).
REGION_PRESETS = {"full-grid": dict(sigmas="0.01,0.1,0.2,0.5,1,2"),
                  "converged": dict(steps=20_000, eval_every=1_250, until="budget")}


@dataclasses.dataclass
class RegionSplit:
    values: Tensor  # [S, N, w] z-scored targets of every sample
    mask: Tensor    # [S, N] bool, the fixed evaluation mask
    x: Tensor       # [S, N, w + 1] model input under the evaluation mask

    def __len__(self) -> int:
        return len(self.values)


def reference_gradients(data) -> np.ndarray:
    """[N, 3] connectivity gradients of the ground-truth FC; the data's own maps (cubnm's gradient 1 for
    Schaefer-100) replace the leading columns."""
    gradients = gradient_metrics.fc_gradients(data.fc)
    if data.gradients is not None:
        k = min(data.gradients.shape[1], gradients.shape[1])
        gradients[:, :k] = data.gradients[:, :k]
    return gradients


def zscore(run: np.ndarray) -> np.ndarray:
    """[T, N] -> each region to mean 0, sd 1 over the run (a constant region stays 0)."""
    run = np.asarray(run, dtype=np.float64)
    sd = run.std(0)
    return ((run - run.mean(0)) / np.where(sd > 0, sd, 1.0)).astype(np.float32)


def windows(run: np.ndarray, width: int) -> np.ndarray:
    """[T, N] -> [T − w + 1, N, w]: every window of w consecutive TRs (stride 1); T ≥ w (MaskedRegionTask checks)."""
    T = run.shape[0]
    index = np.arange(T - width + 1)[:, None] + np.arange(width)[None, :]
    return np.ascontiguousarray(run[index].transpose(0, 2, 1))


def random_masks(shape: tuple[int, int], count: int, generator: torch.Generator) -> Tensor:
    """[S, N] bool with exactly `count` masked tokens per row, uniformly at random."""
    lowest = torch.rand(shape, generator=generator).topk(count, dim=1, largest=False).indices
    return torch.zeros(shape, dtype=torch.bool).scatter_(1, lowest, True)


def masked_input(values: Tensor, mask: Tensor) -> Tensor:
    """[..., N, w] values and [..., N] mask -> [..., N, w + 1] token features."""
    visible = values * (~mask).unsqueeze(-1).to(values.dtype)
    return torch.cat([visible, mask.unsqueeze(-1).to(values.dtype)], dim=-1)


def split_runs(subjects: list[str], run_names: list[str], by: str) -> tuple[list[int], list[int]]:
    """Indices of the training and test runs. By subject: the last max(1, S // 4) subjects (in order of first
    appearance) are the test set. By run: each subject's last run is its test run."""
    if by not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {by!r}")
    if by == "subject":
        order = list(dict.fromkeys(subjects))
        if len(order) < 2:
            raise ValueError(f"a split by subject needs at least 2 subjects, the data has {len(order)} "
                             "(use --split run)")
        test_subjects = set(order[-max(1, len(order) // 4):])
        test = [i for i, s in enumerate(subjects) if s in test_subjects]
    else:
        last = {s: i for i, s in enumerate(subjects)}
        if len(last) == len(subjects):
            raise ValueError("a split by run needs a subject with at least 2 runs (use --split subject)")
        test = [i for i in last.values() if subjects.count(subjects[i]) > 1]
    train = [i for i in range(len(subjects)) if i not in test]
    return train, test


def probe_matrices(data, names: list[str]) -> np.ndarray:
    """Attention probes [K, N, N] with a zero diagonal: a token's attention to itself says nothing about
    structure. same_network: 1 within a module; near_3d: exp(−d²/2s²), s = the median centroid distance / 2;
    fc: max(FC, 0); coupling: |G| + |Gᵀ| scaled to max 1."""
    probes = []
    for name in names:
        if name == "same_network":
            p = (data.networks[:, None] == data.networks[None, :]).astype(np.float64)
        elif name == "near_3d":
            d = np.linalg.norm(data.centroids[:, None] - data.centroids[None, :], axis=-1)
            scale = median_centroid_distance(data.centroids) / 2
            p = np.exp(-d ** 2 / (2 * scale ** 2))
        elif name == "fc":
            p = np.clip(data.fc, 0.0, None)
        elif name == "coupling":
            g = np.abs(data.coupling) + np.abs(data.coupling.T)
            p = g / max(g.max(), 1e-12)
        else:
            raise ValueError(f"unknown probe {name!r}")
        p = np.array(p, dtype=np.float64)
        np.fill_diagonal(p, 0.0)
        probes.append(p)
    return np.stack(probes)


def conditional_expectation(values: Tensor, mask: Tensor, covariance: np.ndarray) -> Tensor:
    """[S, N, w] float64 values with their masked tokens replaced by E[x_masked | x_visible] under a zero-mean
    Gaussian of this [N, N] covariance, each of the w columns on its own; mask [S, N], the same count per row."""
    # A tiny ridge keeps Σ_vv invertible when regions are (nearly) collinear.
    covariance = torch.from_numpy(covariance)
    covariance = covariance + 1e-6 * covariance.diagonal().mean() * torch.eye(len(covariance), dtype=covariance.dtype)
    predictions = values.clone()
    # All rows mask the same number of tokens, so the systems batch: Σ_vv a = x_v, x̂_m = Σ_mv a.
    for start in range(0, len(values), 256):
        m = mask[start:start + 256]
        masked_idx = m.nonzero()[:, 1].view(len(m), -1)
        visible_idx = (~m).nonzero()[:, 1].view(len(m), -1)
        s_vv = covariance[visible_idx[:, :, None], visible_idx[:, None, :]]
        s_mv = covariance[masked_idx[:, :, None], visible_idx[:, None, :]]
        x_v = torch.gather(values[start:start + 256], 1, visible_idx.unsqueeze(-1).expand(-1, -1, values.shape[-1]))
        filled = s_mv @ torch.linalg.solve(s_vv, x_v)
        predictions[start:start + 256].scatter_(1, masked_idx.unsqueeze(-1).expand(-1, -1, values.shape[-1]), filled)
    return predictions


class MaskedRegionTask:
    """Masked-region prediction on a RegionData (pe_fast.data): real fMRI, a surrogate, or a simulated network."""

    readout_token = None  # predict at every token
    attention_split = "test"  # the split whose attention statistics are recorded at each evaluation
    num_classes: int      # the output width per token = the window (the name is the model builder's)

    @staticmethod
    def model_dims(settings: dict) -> tuple[int, int]:
        """(token_dim, num_classes) for the settings: a window of values and the mask flag in, the window out."""
        return settings["window"] + 1, settings["window"]

    def __init__(self, data, name: str, mask_fraction: float = 0.2, window: int = 1, split: str = "subject",
                 eval_max_items: int = 4096):
        if not 0 < mask_fraction < 1:
            raise ValueError(f"the mask fraction must be in (0, 1), got {mask_fraction}")
        if window < 1:
            raise ValueError(f"the window must be at least 1 TR, got {window}")
        shortest = min(run.shape[0] for run in data.runs)
        if window > shortest:  # named as the flag: the sweep passes --window here as given
            raise ValueError(f"--window {window} is longer than the shortest run of the data ({shortest} time "
                             f"points): give --window {shortest} or less")
        self.name, self.data = name, data
        self.gradients = reference_gradients(data)
        self.data_kind = data.kind  # real fMRI, simulated from real FC, or a simulated network: never mixed up
        self.data_line = f"data: {data.kind}: {data.source}"
        N = len(data.labels)
        self.num_tokens = N
        self.token_dim, self.num_classes = self.model_dims({"window": window})
        self.num_masked = max(1, min(N - 1, round(mask_fraction * N)))
        train_runs, test_runs = split_runs(list(data.subjects), list(data.run_names), split)

        def samples(run_indices):
            return np.concatenate([windows(zscore(data.runs[i]), window) for i in run_indices])

        train_values, test_values = samples(train_runs), samples(test_runs)
        for split_name, values in (("training", train_values), ("test", test_values)):
            if not values.any():  # z-scored: every region constant in every run, nothing to predict (R² = 0 / 0)
                raise ValueError(f"every region of the {split_name} runs is constant over its run: the data hold "
                                 "nothing to predict")
        generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
        self.splits: dict[str, RegionSplit] = {}
        for split_name, values in (("train", train_values), ("test", test_values)):
            values = torch.from_numpy(values)
            mask = random_masks((len(values), N), self.num_masked, generator)
            self.splits[split_name] = RegionSplit(values, mask, masked_input(values, mask))
        # The final evaluation scores at most this many evenly spaced test items, so that one evaluation of a
        # large pack fits in memory and time; the training split's intermediate subset is train.py's.
        test = self.splits["test"]
        if len(test) > eval_max_items:
            keep = torch.linspace(0, len(test) - 1, eval_max_items).round().long()
            self.splits["test"] = RegionSplit(test.values[keep], test.mask[keep], test.x[keep])

        self.coordinates = data.centroids  # the "sinnd" PE's input: sinusoids of the 3D centroids
        self.probe_names = [name for name, available in (
            ("same_network", data.networks is not None), ("near_3d", data.centroids is not None),
            ("fc", True), ("coupling", data.coupling is not None)) if available]
        self.probes = torch.tensor(probe_matrices(data, self.probe_names), dtype=torch.float32)
        # Covariance of the z-scored training TRs: the linear baseline's model.
        flat = train_values.transpose(0, 2, 1).reshape(-1, N).astype(np.float64)
        self.train_covariance = np.cov(flat, rowvar=False)
        self.baseline_kinds = BASELINES + ((TRUE_COVARIANCE_BASELINE,) if data.covariance is not None else ())
        self.description = {
            "task": name, "kind": data.kind, "source": data.source, "regions": N, "window": window,
            "mask_fraction": mask_fraction, "masked_tokens": self.num_masked, "split": split,
            "train_runs": [f"{data.subjects[i]}/{data.run_names[i]}" for i in train_runs],
            "test_runs": [f"{data.subjects[i]}/{data.run_names[i]}" for i in test_runs],
            "sizes": {k: len(v) for k, v in self.splits.items()}, "probes": self.probe_names,
        }

    # ---- what training needs from the task ----

    def training_batches(self, seeds: list[int], device: torch.device) -> "MaskedBatches":
        """A callable index [M, B] -> (inputs [M,B,N,w+1], (values, mask)): each model masks its own batch
        with its own generator."""
        return MaskedBatches(self.splits["train"].values.to(device), self.num_masked, seeds, device)

    def loss(self, outputs: Tensor, targets: tuple[Tensor, Tensor]) -> Tensor:
        """Mean squared error over the masked tokens of each model, [M]."""
        values, mask = targets
        squared = ((outputs - values) ** 2).mean(-1)  # [M, B, N]
        weight = mask.to(squared.dtype)
        return (squared * weight).sum((1, 2)) / weight.sum((1, 2))

    def loss_tokens(self, targets: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The masked tokens of each item [M,B,K], in order: the only outputs loss() reads, so that a training step
        computes them alone (StackedTransformer's output_tokens); and the targets at them, every one masked."""
        values, mask = targets
        # each masked token's rank among its item's masked tokens is its slot: the K masked tokens in token order,
        # with static shapes (no nonzero()) and no sort; unmasked tokens go to a spare slot K, dropped
        K = self.num_masked
        slot = torch.where(mask, mask.cumsum(2) - 1, K)
        every_token = torch.arange(mask.shape[2], device=mask.device).expand(mask.shape)
        tokens = mask.new_zeros((*mask.shape[:2], K + 1), dtype=torch.long).scatter_(2, slot, every_token)[..., :K]
        values = values.gather(2, tokens.unsqueeze(-1).expand(*tokens.shape, values.shape[-1]))
        return tokens, (values, torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device))

    def targets(self, split: str, items: Tensor, num_models: int) -> tuple[Tensor, Tensor]:
        """(values, mask) of the items under the split's fixed evaluation mask."""
        part = self.splits[split]
        values, mask = part.values[items], part.mask[items]
        return values.expand(num_models, *values.shape), mask.expand(num_models, *mask.shape)

    def score(self, outputs: Tensor, split: str, items: Tensor) -> list[dict]:
        """MSE and R² on the masked tokens. R² = 1 − MSE / mean(target²): each run is z-scored, so the
        reference predictor is each region's run mean."""
        part = self.splits[split]
        values, mask = part.values[items], part.mask[items]
        weight = mask.to(torch.float64).unsqueeze(-1).expand_as(values)
        total = weight.sum()
        reference = ((values.double() ** 2) * weight).sum() / total
        reference = float(reference)
        rows = []
        for m in range(len(outputs)):
            mse = float((((outputs[m].double() - values.double()) ** 2) * weight).sum() / total)
            # masked targets all 0 (regions constant over these items' runs): R² is undefined, not a crash
            rows.append({columns.score(split, columns.MSE): mse,
                         columns.score(split, columns.R2): 1.0 - mse / reference if reference > 0 else math.nan})
        return rows

    def pe_metrics(self, table: np.ndarray) -> dict:
        """How the PE's token-similarity structure matches the ground truth."""
        data = self.data
        similarity = pe_geometry.cosine_similarity_matrix(table)
        upper = pe_geometry.upper_triangle(similarity)
        metrics = {"pe_fc_corr": pearson(upper, pe_geometry.upper_triangle(data.fc))}
        if data.coupling is not None:
            symmetric = np.abs(data.coupling) + np.abs(data.coupling.T)
            metrics["pe_coupling_corr"] = pearson(upper, pe_geometry.upper_triangle(symmetric))
        if data.networks is not None:
            metrics["pe_modularity"] = module_metrics.newman_modularity(similarity, data.networks)
            metrics["pe_segregation"] = module_metrics.segregation(similarity, data.networks)
        if data.centroids is not None:
            metrics["pe_dist_spearman"] = pe_geometry.distance_spearman(table, data.centroids)
            metrics["pe_procrustes"] = pe_geometry.top_components_procrustes(table, data.centroids)
        metrics.update(gradient_metrics.rank_metrics(table))
        # which of the PE's first principal components follows each connectivity gradient (issue 19)
        for k, (r, pc) in enumerate(gradient_metrics.gradient_alignment(table, self.gradients), start=1):
            suffix = "" if k == 1 else str(k)
            metrics[f"pe_gradient{suffix}_corr"], metrics[f"pe_gradient{suffix}_pc"] = r, pc
        return metrics

    # ---- the references that are not transformers ----

    def baseline_predictions(self, kind: str, split: str) -> Tensor:
        """Predictions [S, N, w] of a baseline under the split's evaluation masks.
        baseline:mean: every masked token = the mean of the visible tokens at that TR.
        baseline:linear: the conditional expectation E[x_masked | x_visible] of a Gaussian with the training
        TRs' covariance, each TR of a window on its own.
        baseline:linear-true: the same with the covariance that generated simulated data: the best predictor of
        a masked region from the visible ones at its TR (for a Gaussian series), which the fitted one estimates."""
        part = self.splits[split]
        values, mask = part.values.double(), part.mask
        visible = (~mask).unsqueeze(-1).double()
        if kind == "baseline:mean":
            mean = (values * visible).sum(1, keepdim=True) / visible.sum(1, keepdim=True)
            return mean.expand_as(values).float()
        if kind not in self.baseline_kinds:
            raise ValueError(f"unknown baseline {kind!r} for these data; they have {', '.join(self.baseline_kinds)}")
        covariance = (self.train_covariance if kind == "baseline:linear"
                      else np.asarray(self.data.covariance, dtype=np.float64))
        return conditional_expectation(values, mask, covariance).float()

    def baselines(self) -> list[dict]:
        """One results row per baseline, with the same score columns as the transformers'."""
        rows = []
        for kind in self.baseline_kinds:
            row = {"pe": kind, "sigma": math.nan}
            for split in self.splits:
                items = torch.arange(len(self.splits[split]))
                row.update(self.score(self.baseline_predictions(kind, split).unsqueeze(0), split, items)[0])
            rows.append(row)
        return rows


    def ground_truth(self) -> dict[str, np.ndarray]:
        data = self.data
        arrays = {"fc": data.fc, "labels": np.asarray(data.labels, dtype=str), "gradients": self.gradients}
        for name in ("networks", "centroids", "coupling"):
            if getattr(data, name) is not None:
                arrays[name] = getattr(data, name)
        return arrays

    @classmethod
    def from_settings(cls, data, s) -> "MaskedRegionTask":
        return cls(data, s.task, mask_fraction=s.mask_fraction, window=s.window, split=s.split)


class MaskedBatches:
    """Training batches of the masked-region task: each model draws its masks from its own generator, whose
    state is part of a training checkpoint (state_dict / load_state_dict)."""

    def __init__(self, values: Tensor, num_masked: int, seeds: list[int], device: torch.device):
        self.values, self.num_masked, self.device = values, num_masked, device
        self.generators = [torch.Generator().manual_seed(int(s) + MASK_SEED_OFFSET) for s in seeds]

    def __call__(self, index: Tensor):
        M, B = index.shape
        N = self.values.shape[1]
        # drawn on the host from each model's own generator (a model trains the same in any pack), then ordered in
        # one call: the same masks as random_masks per model, for half the host time of twelve
        scores = torch.stack([torch.rand((B, N), generator=g) for g in self.generators])
        lowest = scores.topk(self.num_masked, dim=2, largest=False).indices
        mask = torch.zeros(M, B, N, dtype=torch.bool).scatter_(2, lowest, True)
        mask = upload(mask, self.device)
        values = self.values[index]
        return masked_input(values, mask), (values, mask)

    def state_dict(self) -> dict:
        return {"generators": [g.get_state() for g in self.generators]}

    def load_state_dict(self, state: dict):
        for generator, saved in zip(self.generators, state["generators"], strict=True):
            generator.set_state(saved)
