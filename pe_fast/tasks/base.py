"""What a task is to the rest of pe_fast.

* `Task`: the object training, the sweep and its results folder use (data splits, ground truth, loss, scores,
  PE metrics, baselines). Every task class implements all of it; nobody asks `hasattr`.
* `TaskKind`: what the sweep and the report know of a task before any data is loaded: its defaults and
  presets, the PE kinds it accepts, its own settings and flags (TaskSetting: type, default, range, files), the
  summary's columns, how the report reads its results and which figures it adds (TaskView), and how to build the
  Task from the sweep's settings. Each task file defines one KIND; pe_fast.tasks registers it (KINDS).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class TaskView:
    """What the report shows for one task: which results columns, and how they read."""
    score: str                          # the generalisation metric (alignment plot, statement)
    generalisation: tuple[str, ...]     # plotted against σ
    similarity: tuple[str, ...]         # PE vs ground truth, plotted against σ
    summary: tuple[str, ...]            # the report's summary table's columns
    probe: str                          # the attention probe whose mass is the "alignment"
    fit: str | None                     # the training-fit metric quoted in the statement
    reference_pe: str | None = None     # the ground-truth PE whose models' attention maps the others are compared
                                        # with (attn_map_alignment, the paper's measure), if the task has one
    # The report's figures of the task's own ground truth, by name (report/figures.py: FIGURE_TABLE's rows that
    # ask for them, and brain_maps): pe_gradient, learned_pe_grid, learned_pe_on_grid, learned_pe_fc, brain_maps
    figures: tuple[str, ...] = ()
    paper_rho: tuple[float, str] | None = None  # the paper's alignment–generalisation ρ, and where ("on the LST")
    # (name, token coordinates) where the ground truth is the same in every run: the RSA's reference distances
    fixed_geometry: tuple[str, Callable[[], np.ndarray]] | None = None


class Batches(Protocol):
    """index [M, B] -> (inputs [M,B,N,token_dim], targets); its state makes a resumed pack draw the same."""

    def __call__(self, index: Tensor): ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Task(Protocol):
    name: str
    num_tokens: int
    token_dim: int
    num_classes: int              # the output width per read-out token
    readout_token: int | None     # classify from this token; None: predict at every token
    probe_names: list[str]
    probes: Tensor                # [K, N, N] attention probes (shared by all models)
    coordinates: np.ndarray | None  # [N, k] token coordinates (sin2d / sinnd / rope2d), if any
    attention_split: str          # the held-out split that every evaluation scores in full, with its attention stats
    splits: dict                  # name -> split with .x [items, N, token_dim] and __len__
    description: dict             # config.json's "task"
    data_kind: str | None         # results.parquet's data_kind column (real fMRI, simulated, ...), if any
    data_line: str | None         # one line for the sweep's log about the data, if any

    def training_batches(self, seeds: list[int], device: torch.device) -> Batches: ...

    def loss(self, outputs: Tensor, targets) -> Tensor: ...

    # Optional, for a loss that reads some tokens of every item (the masked-token tasks): loss_tokens(targets) ->
    # (tokens [M,B,K], the targets at them); a training step then computes the outputs at those tokens alone
    # (PackTrainer._forward_loss, StackedTransformer's output_tokens).

    def targets(self, split: str, items: Tensor, num_models: int):
        """The targets of the given items of a split as loss() takes them, the same for each of num_models
        models (the tangent kernel's alignment: metrics/tangent_kernel.py)."""

    def score(self, outputs: Tensor, split: str, items: Tensor) -> list[dict]: ...

    def pe_metrics(self, table: np.ndarray) -> dict: ...

    def baselines(self) -> list[dict]:
        """Results rows of non-transformer references (pe "baseline:…"); empty where there are none."""

    def ground_truth(self) -> dict[str, np.ndarray]:
        """Arrays for DIR/ground_truth.npz (the report's brain figures); empty where there are none."""


def per_model_cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """The classification tasks' loss: each model's mean cross-entropy, [M]; outputs [M, B, classes] logits,
    targets [M, B] class indices."""
    M, B, C = outputs.shape
    per_item = torch.nn.functional.cross_entropy(outputs.reshape(M * B, C), targets.reshape(M * B), reduction="none")
    return per_item.view(M, B).mean(1)


@dataclasses.dataclass(frozen=True)
class TaskSetting:
    """A setting of one task's own, and its flag --NAME-WITH-DASHES: the sweep's parser, its validation, config.json
    and --resume take it from here."""
    name: str
    type: type                  # int, float or str
    help: str                   # the flag's help, after the names of the tasks that have it
    default: object = None      # None: the task's loader chooses
    choices: tuple | None = None
    range: tuple | None = None  # (lowest, highest or None, which ends belong: "[]", "[)", "()")
    files: str | None = None    # "one" or "several" (comma-separated): checked to exist, recorded absolute

    def paths(self, value: str) -> list[str]:
        """The files the setting's value names: one, or several comma-separated. A value that is itself an existing
        path is one file: a file's name may hold a comma."""
        if self.files != "several" or os.path.exists(value):
            return [value]
        return value.split(",")


@dataclasses.dataclass(frozen=True)
class TaskKind:
    name: str
    defaults: dict              # what `--task NAME` runs with no other flag (flag name -> value)
    presets: dict[str, dict]    # --preset NAME -> flag values
    pe_kinds: tuple[str, ...]   # the PE kinds this task's tokens support
    settings: tuple[TaskSetting, ...]  # this task's own settings (another task may share one)
    summary: tuple[str, ...]    # summary.txt's metric columns, in order (those present in the results)
    view: TaskView
    load: Callable[..., Task]   # the sweep's Settings -> the Task (ValueError / DataError for bad input)
    readout_token: int | None   # its Task class's readout_token, named here for readers that load no task
    baselines: tuple[str, ...]  # every baseline (results pe "baseline:…") its Task may write, whatever the data
    # the settings -> (token_dim, out_dim) of its Task's models: values a token carries in and predicts, named here
    # for readers that load no task (a weights file's embedding and head are checked against them)
    model_dims: Callable[[dict], tuple[int, int]]
    # A rule across this task's settings: (the settings, the flags given) -> what is wrong, or None
    check: Callable[[dict, set[str]], str | None] = lambda settings, given: None

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(setting.name for setting in self.settings)
