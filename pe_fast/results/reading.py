"""Reading a sweep's results folder, finished or still running, through pe_fast.results.run_folder: its files as a
Run, its settings as the record (of any pe_fast version), and whether folders pooled as one run trained alike."""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pe_fast import memory
from pe_fast.data import declared_size
from pe_fast.data.regions import MIN_SPREAD, centroids_problem
from pe_fast.models.absolute_pe import ADDITIVE_PES, SIGMA_PES
from pe_fast.models.single import SingleTransformer
from pe_fast.models.transformer import PE_KINDS
from pe_fast.results import migrate, run_folder, weights
from pe_fast.results.summary import is_baseline
from pe_fast.results.settings import (FLAGS, FLOAT32_MAX, GRID_AXES, SettingError, Settings, check_choices, check_packs,
                                      check_executor_flags, check_range, check_ranges, check_task_rules, check_text,
                                      check_types, pe_dropout_of, trained_with)
from pe_fast.precision import PRECISIONS
from pe_fast.program_exit import brief, escaped
from pe_fast.tasks import KINDS
from pe_fast.train import COMPILE_MODES, OPTIMIZERS, UNTIL, compile_problem


class OneLineError(ValueError):
    """An error whose message is one line whoever prints it: the control characters of the names it quotes (a
    folder's name holding a line break) shown as their escapes, as the programs' error line shows them."""

    def __init__(self, message: object = ""):
        super().__init__(escaped(str(message)))


class ReportError(OneLineError):
    """A results folder the report cannot read: reported as one line, exit code 2; to a Python caller of
    load_run, a bad argument (a ValueError)."""


POOLED_CHAIN = "pooled chain"  # Run._loaded's key: the pooled folders a source folder was reached through


# inputs beyond this magnitude are the caller's to rescale; within it, an overflow inside a model is its weights'
INPUT_SCALE = 1e3


@dataclasses.dataclass
class Run:
    """A results folder as Python objects (pe_fast.load_run): results and curves one row per model (and
    evaluation), the PE tables and mean attention maps by key (run_folder.py names the keys)."""
    config: dict
    results: pd.DataFrame
    curves: pd.DataFrame
    pe_tables: dict[str, np.ndarray]
    notes: list[str]  # how the run was read (partial, derived results): shown at the top of report.md
    path: Path | None = None
    diverged: tuple[str, ...] = ()  # the pe_tables keys left out of pe_tables for holding NaN or inf
    _loaded: dict = dataclasses.field(default_factory=dict, repr=False)  # packs, source folders, the task: once

    @property
    def settings(self) -> dict:
        """The sweep's settings as config.json records them (flag name -> value)."""
        return self.config.get("settings") or {}

    def pe_table(self, model_id: int) -> np.ndarray:
        """The final PE table of one model (learned, random or fixed PEs): [N, D], or [L, N, D] with one per
        block."""
        model_id = _model_id(model_id)
        ids = self.results["model_id"] if "model_id" in self.results else pd.Series(dtype=float)
        if not (ids == model_id).any():
            known = sorted(int(i) for i in ids.dropna())
            raise ModelNotFound(f"model_id {model_id}: not a model of {self.path} (its models: {_id_ranges(known)})")
        key = run_folder.pe_table_key(model_id)
        if key in self.diverged:
            raise NoPETable(f"model {model_id}'s PE table in {self.path}'s {run_folder.PE_TABLES} holds NaN or inf: "
                            f"its training diverged (its train_loss in run.results says so)")
        if key not in self.pe_tables:
            pe = self.results.loc[ids == model_id, "pe"].iloc[0]
            raise NoPETable(f"model {model_id} has no PE table in {self.path}: its PE is {pe!r}, "
                            + ("which has none" if pe not in ADDITIVE_PES else f"and {run_folder.PE_TABLES} does not "
                                                                            f"hold its table"))
        pack = next((p for p, ids in enumerate(self.config.get("packs") or []) if isinstance(ids, list)
                     and model_id in ids), None) if run_folder.POOLED_FROM not in self.config else None
        if pack is not None and (run_folder.pack_folder(self.path, pack) / run_folder.WEIGHTS).is_file():
            self._pack_weights(model_id, torch.device("cpu"))  # loaded once: its PE checked against this table
        return self.pe_tables[key]

    # ---- the trained models (each finished pack's weights.safetensors) ----

    def model(self, model_id: int, device: torch.device | str = "cpu") -> SingleTransformer:
        """Model `model_id` alone, as a plain torch module with its trained weights and PE (models/single.py:
        hook points, run_with_cache, run_with_hooks, attention), in eval mode on `device`."""
        model_id = _model_id(model_id)
        pool = self._pooled_source(model_id)
        if pool is not None:
            source, source_id = pool
            return source.model(source_id, device)
        pack, position = self._pack_weights(model_id, device)
        return SingleTransformer(pack.model, position).to(device).eval()

    def models(self, device: torch.device | str = "cpu") -> Iterator[tuple[int, SingleTransformer]]:
        """(model id, model) for every trained model of the run, in id order: of a sweep still running or stopped,
        those of its finished packs (the models its results hold)."""
        trained = self.results[~is_baseline(self.results["pe"])]["model_id"]
        for model_id in sorted(int(i) for i in trained):
            yield model_id, self.model(model_id, device)

    def pack(self, index: int, device: torch.device | str = "cpu") -> weights.PackWeights:
        """Pack `index` as the sweep trained it: the stacked model of all its models (for batch work), their ids
        in its order, and the step its weights were taken at."""
        packs = self._packs()
        if not packs and run_folder.POOLED_FROM in self.config:
            raise ModelNotFound(f"pack {brief(index)}: {self.path} pools finished sweeps and has no packs of its own: "
                                f"open its models with run.model(i), or the packs of its sources "
                                f"({', '.join(self.config[run_folder.POOLED_FROM])})")
        if _whole(index) is None or not 0 <= _whole(index) < len(packs):
            raise ModelNotFound(f"pack {brief(index)}: {self.path} has "
                                + (f"packs 0 to {len(packs) - 1}" if packs else "no packs"))
        index = _whole(index)
        device = _device(device)
        path = run_folder.pack_folder(self.path, index) / run_folder.WEIGHTS
        if path.exists() and not path.is_file():
            raise ReportError(f"{path} is not a file; not a pe_fast weights file")
        if not path.is_file():
            raise ReportError(f"{self.path}: pack {index} has no {run_folder.WEIGHTS} (trained with --no-weights, "
                              f"by a pe_fast from before weights were kept, or not finished yet)")
        try:
            loaded = weights.load_pack_weights(path, device)
        except weights.UnreadableWeights as error:
            raise ReportError(str(error))
        if loaded.model_ids != list(packs[index]):
            raise ReportError(f"{path}: holds models {loaded.model_ids[:6]}, config.json's pack {index} "
                              f"{list(packs[index])[:6]}: not this run's pack")
        if (differs := self._not_this_runs(loaded)) is not None:
            raise ReportError(f"{path}: its models have {differs}: not this run's pack")
        return loaded

    def _not_this_runs(self, loaded: weights.PackWeights) -> str | None:
        """What of a pack's model configuration (from its weights file) the run's own record contradicts: its
        settings' shape, its results' PE kind and seeds, its attention maps' tokens; None where all agree. A
        weights file copied from another run of the same model ids would otherwise open as this run's models."""
        found = loaded.model.config
        settings = (self.config.get("settings") or {}) if isinstance(self.config, dict) else {}
        wanted = {name: settings.get(name) for name in MODEL_SHAPE}
        rows = self.results[self.results["model_id"].isin(loaded.model_ids)] if "model_id" in self.results else None
        if rows is not None and len(rows):
            wanted["pe"] = rows["pe"].iloc[0]
        if rows is not None and "seed" in rows:  # the file's own record of each model's seed
            recorded = dict(zip(rows["model_id"].astype(int), rows["seed"]))
            for model_id, seed in zip(loaded.model_ids, loaded.model.seeds):
                if recorded.get(model_id) != seed:
                    return f"model {model_id} seeded {seed!r}, where the run's results say {recorded.get(model_id)!r}"
        if (problem := pe_tables_problem(loaded, self.pe_tables)) is not None:
            return problem
        if rows is not None and "train_loss" in rows:  # a diverged model's loss is not finite
            losses = dict(zip(rows["model_id"].astype(int), pd.to_numeric(rows["train_loss"], errors="coerce")))
            models = len(loaded.model_ids)
            for m, model_id in enumerate(loaded.model_ids):
                held = [t[m] for t in loaded.model.state_dict().values() if t.dim() and t.shape[0] == models]
                if np.isfinite(losses.get(model_id, np.nan)) and not all(bool(t.isfinite().all()) for t in held):
                    return (f"for model {model_id} weights that hold NaN or inf, where its train_loss in the results "
                            f"is {losses[model_id]:.3g}")
        maps = self.pe_tables.get(run_folder.attention_map_key(loaded.model_ids[0]))
        if maps is not None:
            wanted["num_tokens"] = maps.shape[-1]
        return next((f"{name} {getattr(found, name)!r}, where the run's is {value!r}" for name, value in wanted.items()
                     if value is not None and getattr(found, name) != value), None)

    def model_ids(self) -> list[int]:
        """The ids of the run's trained models (not its baselines)."""
        pooled = self._pooled_sources()
        if pooled is not None:
            return sorted(pooled)
        return sorted(i for pack in self._packs() for i in pack)

    def task_inputs(self, split: str) -> torch.Tensor:
        """The items of one of the task's splits as the models take them, [items, N, token_dim] (the task is
        loaded from the run's settings, once)."""
        task = self.task()
        if not isinstance(split, str) or split not in task.splits:
            raise ModelNotFound(f"split {brief(split)}: the task's splits are {', '.join(task.splits)}")
        return task.splits[split].x

    def attention(self, model_id: int, inputs: torch.Tensor) -> torch.Tensor:
        """Model `model_id`'s attention probabilities on `inputs` [items, N, token_dim]: [L, items, H, N, N]."""
        model = self.model(model_id)  # on the CPU
        tokens = model.as_tokens(inputs, "inputs")
        c = model.config
        # every block's pattern twice (the cache and the stacked result) and its activations, in the model's dtype
        per_item = c.depth * c.num_tokens * (2 * c.heads * c.num_tokens + 4 * c.width + c.mlp_width)
        needed, free = len(tokens) * per_item * model.embed.weight.element_size(), memory.free_bytes(
            torch.device("cpu"))
        if needed > free // 2:
            raise ValueError(f"inputs: {len(tokens):,} items need about {needed / 2**30:,.1f} GiB for model "
                             f"{model_id}'s attention, more than half the free memory ({free / 2**30:,.1f} GiB); "
                             f"pass at most {max(1, free // 2 // per_item // model.embed.weight.element_size()):,} "
                             f"at a time")
        if not (finite := torch.isfinite(tokens).flatten(1).all(1)).all():  # the pattern would be NaN, silently
            raise ValueError(f"inputs: item {int((~finite).nonzero()[0])} holds NaN or Inf; the model's attention "
                             f"needs finite tokens")
        pattern = model.attention(tokens)
        if bool(torch.isfinite(pattern).all()):
            return pattern
        if not all(bool(p.isfinite().all()) for p in model.parameters()):  # opened: its train_loss is not finite
            raise ValueError(f"model_id {model_id}: its weights hold NaN or Inf (its training diverged; its "
                             f"train_loss in run.results says so), so its attention is not defined")
        item = int((~torch.isfinite(pattern).transpose(0, 1).flatten(1).all(1)).nonzero()[0])
        largest_input = tokens.abs().max().item()
        if largest_input > INPUT_SCALE:  # finite tokens too large for the model's arithmetic (x·1e30) overflow in it
            raise ValueError(f"inputs: item {item} overflows model {model_id}'s {model.embed.weight.dtype} arithmetic "
                             f"(its attention would be NaN): values up to {largest_input:.3g}, where the task's "
                             f"inputs lie within a few units")
        largest_weight = max(p.abs().max().item() for p in model.parameters())
        raise ReportError(f"model_id {model_id}: its {model.embed.weight.dtype} arithmetic overflows on item {item}, "
                          f"whose values lie within {largest_input:.3g}: its weights reach {largest_weight:.3g}, "
                          f"which {self.path}'s weights file holds for no trained model")

    def _packs(self) -> list[list[int]]:
        packs = self.config.get("packs")
        if not (isinstance(packs, list) and all(isinstance(p, list) and all(type(i) is int for i in p)
                                                for p in packs)):
            raise ReportError(f"{self.path}/config.json lists no packs of model ids; its models cannot be opened")
        return packs

    def _pack_weights(self, model_id: int, device) -> tuple[weights.PackWeights, int]:
        index = next((p for p, pack in enumerate(self._packs()) if model_id in pack), None)
        if index is None:
            raise ModelNotFound(f"model_id {model_id}: not a trained model of {self.path} "
                                f"(its models: {_id_ranges(self.model_ids())})")
        key = (index, str(device))
        if key not in self._loaded:
            self._loaded[key] = self.pack(index, device)
        pack = self._loaded[key]
        return pack, pack.model_ids.index(model_id)

    def _pooled_sources(self) -> dict[int, tuple[int, int]] | None:
        """A pooled folder's model id -> (its source folder's place in pooled_from, the id there)."""
        if run_folder.POOLED_FROM not in self.config:
            return None
        sources = {}
        for entry in self.config.get("models") or []:
            origin = entry.get("pooled_from") if isinstance(entry, dict) else None
            if isinstance(origin, list) and len(origin) == 2 and all(type(v) is int for v in origin) \
                    and type(entry.get("model_id")) is int:
                sources[entry["model_id"]] = tuple(origin)
        return sources

    def _pooled_source(self, model_id: int) -> tuple[Run, int] | None:
        sources = self._pooled_sources()
        if sources is None:
            return None
        if model_id not in sources:
            raise ModelNotFound(f"model_id {model_id!r}: not a trained model of {self.path} "
                                f"(its models: {_id_ranges(sorted(sources))})")
        folder, source_id = sources[model_id]
        folders = self.config[run_folder.POOLED_FROM]  # absolute folder names (check_pooled_from)
        if not 0 <= folder < len(folders):
            raise ReportError(f"{self.path}/config.json: model {model_id}'s source folder is not among pooled_from")
        if folder not in self._loaded:
            source, seen = Path(folders[folder]), self._loaded.get(POOLED_CHAIN, ()) + (self.path.resolve(),)
            if source.resolve() in seen:  # a pooled run of pooled runs may go on; one that comes back never ends
                raise ReportError(f"{self.path}/config.json: pooled_from leads back to {source}, a loop")
            if not run_folder.is_results_folder(source):  # nothing else is listed, let alone read (/etc was)
                raise ReportError(f"{self.path}/config.json: pooled_from names {source}, which is not a results "
                                  f"folder (moved or deleted since the pooling?)")
            opened = read_run(source)
            # trained as the pooled folder records (its width, steps, lr ...): pooling checked its sources alike. A
            # record of some settings only (a hand-made folder) has nothing to compare
            try:
                records = {self.path: recorded_settings(self.path, self), source: recorded_settings(source, opened)}
            except ReportError:
                records = {}
            if records:
                check_alike(records)
            self._loaded[folder] = opened
            self._loaded[folder]._loaded[POOLED_CHAIN] = seen
        source = self._loaded[folder]
        # the source's row of that model is the pooled row (a pooled_from reordered or pointing elsewhere would
        # open another seed's or task's model under this id)
        ours = self.results[self.results["model_id"] == model_id]
        theirs = source.results[source.results["model_id"] == source_id] if "model_id" in source.results else ours[:0]
        identity = [c for c in ("task", "pe", "sigma", "seed") if c in ours and c in theirs]
        if len(ours) != 1 or len(theirs) != 1 or not all(
                ours[c].iloc[0] == theirs[c].iloc[0] or (pd.isna(ours[c].iloc[0]) and pd.isna(theirs[c].iloc[0]))
                for c in identity):
            raise ReportError(f"{self.path}/config.json: model {model_id}'s source, model {source_id} of "
                              f"{folders[folder]}, is not the model the pooled results record")
        return source, source_id

    def task(self):
        """The task the run trained on, loaded from its settings (once): its splits, scores and ground truth."""
        if "task" not in self._loaded:
            settings = recorded_settings(self.path, self)
            try:
                task = KINDS[settings.task].load(settings)
            except (ValueError, OSError) as error:
                raise ReportError(f"{self.path}: the task cannot be loaded from its settings ({error})")
            check_task_recorded(self.path, self.config, task)  # other data would be scored as its models'
            self._loaded["task"] = task
        return self._loaded["task"]


def check_task_recorded(directory: Path, config: dict, task):
    """The task loaded from a run's settings is the one the run trained on, or ReportError: config.json's
    description of it (task_description_difference) and DIR/ground_truth.npz (check_ground_truth), both written at
    the sweep's start. A data file changed since would be scored, or resumed, as the run's data."""
    if (difference := task_description_difference(config.get("task"), task)) is not None:
        key, was, now = difference
        key = str(key)[:60]  # a key of the file's, its control characters escaped with the message (ReportError)
        if was is NOT_DESCRIBED:
            found = f"lacks {key}, where the task its settings load has {key} {brief(now)}"
        elif now is NOT_DESCRIBED:
            found = f"has {key} {brief(was)}, which the task its settings load does not describe"
        else:
            found = f"has {key} {brief(was)}, where the task its settings load has {brief(now)}"
        raise ReportError(f"{directory / run_folder.CONFIG}: its task {found}: the task's data changed since the "
                          f"sweep started (or config.json was edited); use the data the sweep started with")
    check_ground_truth(directory, task, config.get("settings") or {})


def check_ground_truth(directory: Path, task, settings: dict):
    """DIR/ground_truth.npz is the ground truth of the task its settings load now (task.ground_truth()), or
    ReportError naming the task's data files: a data file changed since the sweep started (regions swapped, say)
    keeps its sizes."""
    expected = task.ground_truth()
    path = directory / run_folder.GROUND_TRUTH
    if not expected or not path.exists():
        return
    found = read_ground_truth(regular_file(path))
    if set(found) != set(expected) or not all(
            np.array_equal(found[key], np.asarray(value), equal_nan=found[key].dtype.kind == "f")
            for key, value in expected.items()):
        kind = KINDS.get(settings.get("task"))
        files = [f"--{setting.name.replace('_', '-')} {settings[setting.name]}" for setting in
                 (kind.settings if kind else ()) if setting.files and settings.get(setting.name) is not None]
        data = f"the task's data ({', '.join(files)})" if files else "the task's data"
        raise ReportError(f"{data} changed since the sweep started: its ground truth is not the one {path} holds "
                          f"(or that file was edited); use the data the sweep started with")


def task_description_difference(recorded, task) -> tuple[str, object, object] | None:
    """(key, recorded value, loaded value) where config.json's task description differs from the task loaded from
    its settings (its data's sizes, runs, split, conditions), or None; NOT_DESCRIBED for a value one lacks. Not
    its sources (a path, a package's version), which the recorded settings fix: pe_fast installed elsewhere still
    reads or resumes the run. An older folder's record has no description: None."""
    if recorded is None:
        return None
    if not isinstance(recorded, dict):
        return "its kind", recorded, "a JSON object"
    loaded = json.loads(json.dumps(task.description))  # as config.json holds it: lists for tuples
    differing = [key for key in sorted({*recorded, *loaded}, key=lambda key: (key != "task", str(key)))  # name first
                 if not str(key).endswith("source") and recorded.get(key) != loaded.get(key)]
    return (differing[0], recorded.get(differing[0], NOT_DESCRIBED), loaded.get(differing[0], NOT_DESCRIBED)) \
        if differing else None


NOT_DESCRIBED = object()  # task_description_difference's value of a key one description lacks


class ModelNotFound(OneLineError):
    """A model id, pack or split a run does not have (a caller's argument)."""


class NoPETable(KeyError, ValueError):
    """A model of the run without a PE table (a lookup that finds nothing, and a caller's bad argument)."""

    def __str__(self):  # KeyError's would quote the message
        return escaped(str(self.args[0]))


def _whole(value) -> int | None:
    """A model id or pack index as an int: a Python or numpy integer (run.results holds numpy ones), not a bool;
    None for anything else, or for a caller's integral type whose int() raises."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        return None
    try:
        return int(value)
    except Exception:  # a caller's object registered as an integer: named as the refusal names anything else
        return None


def _model_id(value) -> int:
    """Every method taking a model id takes it here: the ids run.results holds, a string or a float refused."""
    whole = _whole(value)
    if whole is None:
        raise ModelNotFound(f"model_id {brief(value)}: expected a model id (an int)")
    return whole


def _device(device) -> torch.device:
    """The device a caller names, where this machine has it and can hold weights: torch says otherwise in a
    RuntimeError, for CUDA on a build without it an AssertionError, for meta (no data) a NotImplementedError once
    the weights are copied there, none naming the argument."""
    try:
        named = torch.device(device)
        torch.zeros(1, device=named).cpu()
    except (RuntimeError, TypeError, ValueError, AssertionError, NotImplementedError) as error:
        raise ValueError(f"device {brief(device)}: not a device of this machine ({str(error).splitlines()[0][:120]})") \
            from None
    return named


def _id_ranges(ids: list[int]) -> str:
    return f"{ids[0]} to {ids[-1]}" if ids else "none"


# ----------------------------------------------------------------------------------------------------------------
# Reading a results folder, finished or running
# ----------------------------------------------------------------------------------------------------------------


def _present(path: Path) -> bool:
    """Whether a file the folder may lack is there in any form: a FIFO, a device or a dangling link in its place is
    read, and refused by regular_file, rather than skipped as absent."""
    return path.exists() or path.is_symlink()


def regular_file(path: Path) -> Path:
    """path, where it is a regular file (through links): a FIFO or a device in a folder someone else made would block
    or flood the reader; one ReportError naming it otherwise."""
    if not path.is_file():
        what = "is not a regular file" if path.exists() or path.is_symlink() else "does not exist"
        raise ReportError(f"{path} {what}; not a pe_fast results folder")
    return path


def check_expansion(path: Path, declared: int, stored: int):
    """One ReportError where `declared` bytes in memory from `stored` on disk cannot be a file pe_fast wrote (a file
    in a folder someone else made may declare far more than it holds)."""
    problem = declared_size.inflation(path, declared, stored, "a file pe_fast writes")
    if problem is not None:
        raise ReportError(problem)


def check_parquet_size(path: Path, file):
    """check_expansion for an open parquet file: 8 bytes a cell once read, or its pages' own uncompressed size where
    larger (text: a few compressed bytes may hold a 300 MB string), or its text as every row reads it (a dictionary
    page holds a 300 KB string once, and 4,000 rows read it 4,000 times). Returns its metadata."""
    import pyarrow.parquet
    meta = pyarrow.parquet.read_metadata(file)
    pages = sum(meta.row_group(g).column(c).total_uncompressed_size
                for g in range(meta.num_row_groups) for c in range(meta.num_columns))
    stored = path.stat().st_size
    check_expansion(path, max(meta.num_rows * max(1, meta.num_columns) * 8, pages), stored)
    check_expansion(path, _parquet_text_bytes(path, file, meta), stored)
    return meta


def _parquet_text_bytes(path: Path, file, meta) -> int:
    """The bytes of the text columns' strings over every row, counted from their dictionaries and indices (never
    decoded row by row)."""
    import pyarrow as pa
    import pyarrow.compute as compute
    import pyarrow.parquet
    fields = list(meta.schema.to_arrow_schema())
    if nested := next((f.name for f in fields if pa.types.is_nested(f.type)), None):
        raise ReportError(f"{path}: column {str(nested)[:40]!r} is nested (a list or a struct); not a table pe_fast "
                          f"reads")
    # flat: each leaf column is a field; text and bytes are stored as BYTE_ARRAY, however the arrow schema types them
    text = [meta.schema.column(c).name for c in range(meta.num_columns)
            if meta.schema.column(c).physical_type == "BYTE_ARRAY"]
    if not text:
        return 0
    total = 0
    for chunk in pyarrow.parquet.ParquetFile(file, read_dictionary=text).read(columns=text).columns:
        for part in chunk.chunks:
            lengths = compute.fill_null(compute.binary_length(part.dictionary), 0).to_numpy(zero_copy_only=False)
            indices = compute.fill_null(part.indices, 0).to_numpy(zero_copy_only=False)
            total += int(lengths.astype(np.int64)[indices].sum()) if len(lengths) else 0
    file.seek(0)
    return total


def check_parquet_schema(path: Path, meta):
    """Every column of a results or curves file stored as the sweep stores it: TEXT_COLUMNS as text, every other
    one as integers or floats (a bool, decimal or timestamp would reach the report's arithmetic as one)."""
    import pyarrow as pa
    for field in meta.schema.to_arrow_schema():
        text, kind = field.name in TEXT_COLUMNS, field.type
        # float16: a score beyond its 65,504 overflowed in pandas' arithmetic (a warning); the sweep writes float64
        fits = pa.types.is_null(kind) or (pa.types.is_string(kind) or pa.types.is_large_string(kind) if text
                                          else pa.types.is_integer(kind) or (pa.types.is_floating(kind)
                                                                             and not pa.types.is_float16(kind)))
        if not fits:
            raise ReportError(f"{path}: column {str(field.name)[:40]!r} is stored as {str(kind)[:40]}, not "
                              f"{'text' if text else 'numbers'}; not a pe_fast results folder")


PANDAS_INDEX = re.compile(r"__index_level_\d+__")


def parquet_columns(file) -> pd.DataFrame:
    """An open parquet file's columns alone: pandas' metadata in the file (an index named after a column: a
    traceback in a figure) is the writer's word, and the unnamed index pandas writes beside the columns
    (__index_level_0__) is no column of the table."""
    import pyarrow.parquet
    table = pyarrow.parquet.read_table(file).to_pandas(ignore_metadata=True)
    return table.drop(columns=[c for c in table.columns if PANDAS_INDEX.fullmatch(str(c))])


def _read_parquet(path: Path) -> pd.DataFrame:
    regular_file(path)
    with open(path, "rb") as file:  # a file, not a path's text: see run_folder.write_parquet
        try:
            meta = check_parquet_size(path, file)
        except ReportError:
            raise
        except Exception as error:  # pyarrow raises several types for a truncated or foreign file
            raise ReportError(f"{path} is not a readable parquet file ({type(error).__name__}); rerun the sweep")
        check_parquet_schema(path, meta)
        try:
            file.seek(0)
            return parquet_columns(file)
        except Exception as error:  # pyarrow raises several types for a truncated or foreign file
            raise ReportError(f"{path} is not a readable parquet file ({type(error).__name__}); rerun the sweep")


def read_npz(path: Path) -> dict[str, np.ndarray]:
    import zipfile
    regular_file(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            declared = sum(declared_size.npz_member_read_bytes(archive, m) for m in members)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise ReportError(f"{path} is not a readable .npz file ({type(error).__name__})")
    check_expansion(path, declared, path.stat().st_size)
    names = [m.filename for m in members]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:  # np.load would keep one of the two, silently
        raise ReportError(f"{path} holds the entry {twice[:40]!r} twice; not a file pe_fast writes")
    try:
        with np.load(path) as data:
            return {key: data[key] for key in data.files}
    except Exception as error:
        raise ReportError(f"{path} is not a readable .npz file ({type(error).__name__})")


FLOAT32_SMALLEST = float(np.finfo(np.float32).smallest_subnormal)

# pe_tables.npz's entries (keys: run_folder.py): a model's PE tables [N, D] or [L, N, D], its mean attention maps
# [L, N, N]
def read_pe_tables(path: Path) -> dict[str, np.ndarray]:
    """pe_tables.npz, every entry a real-valued table of 2 or 3 axes under a key the sweep writes, or one
    ReportError naming the entry (a folder may come from anyone); a table of 2 axes, one block's, is read as
    [1, tokens, width], the form every reader indexes."""
    tables = read_npz(path)
    tokens = None  # every entry's, the first entry's: the figures and RSA compare tables token by token
    for key, table in tables.items():
        if not run_folder.is_table_key(key):
            raise ReportError(f"{path}: entry {key[:40]!r} is not {run_folder.PE_TABLE}<id> or "
                              f"{run_folder.ATTENTION_MAP}<id>; not a pe_fast results folder")
        # float16 and long double: numbers, but numpy's linear algebra (RSA, the spectrum) takes neither
        native = table.dtype.newbyteorder("=")  # a big-endian table: the same numbers
        if native not in (np.float32, np.float64) or table.ndim not in (2, 3) or 0 in table.shape:
            raise ReportError(f"{path}: entry {key} is a {table.ndim}-axis {table.dtype} array of shape "
                              f"{list(table.shape)}, not a float table [tokens, width] or [blocks, tokens, "
                              f"width]; not a pe_fast results folder")
        square = key.startswith(run_folder.ATTENTION_MAP)
        # read in float64: the figures' and metrics' SVDs and squares of a float32 table near its largest values
        # overflowed (an SVD that does not converge, numpy's warnings); attention maps stay as written
        written = list(table.shape)
        table = table.astype(native if square else np.float64, copy=False)
        tables[key] = table = table[None] if table.ndim == 2 else table
        finite = table[np.isfinite(table)]
        # a sweep writes float32, and attention maps are probabilities: anything else was not trained (a value
        # below float32's smallest, not 0, made the metrics' norms 0 / 0)
        magnitude = np.abs(finite)
        if (magnitude > FLOAT32_MAX).any() or ((magnitude > 0) & (magnitude < FLOAT32_SMALLEST)).any() or (
                square and ((finite < 0) | (finite > 1 + 1e-3)).any()):
            raise ReportError(f"{path}: entry {key} holds numbers beyond any "
                              f"{'probability' if square else 'float32'} a sweep computes; not a pe_fast results "
                              f"folder")
        tokens = table.shape[-2] if tokens is None else tokens
        if table.shape[-2] != tokens or (square and table.shape[-1] != tokens):
            wanted = f"[blocks, {tokens}, {tokens}]" if square else f"[{tokens}, width] or [blocks, {tokens}, width]"
            raise ReportError(f"{path}: entry {key} has shape {written}, not {wanted} as the first "
                              f"entry's {tokens} tokens; not a pe_fast results folder")
        sums = table.sum(-1, dtype=np.float64) if square else None  # a mean of softmax rows: each sums to 1
        if square and (np.abs(sums[np.isfinite(sums)] - 1) > 1e-3).any():
            raise ReportError(f"{path}: entry {key} has rows that do not sum to 1, as no mean attention map's do; "
                              f"not a pe_fast results folder")
    return tables


# ground_truth.npz (the region tasks': Task.ground_truth): each array's axes, the first the tokens'. "tokens": the
# tokens again (a matrix between regions), None: any size
GROUND_TRUTH_AXES = {"fc": ("tokens",), "coupling": ("tokens",), "centroids": (None,), "gradients": (None,),
                     "networks": (), "labels": ()}


def read_ground_truth(path: Path, num_tokens: int | None = None) -> dict[str, np.ndarray]:
    """ground_truth.npz, every entry one the sweep writes, over the same tokens (num_tokens where known: the PE
    tables'), or one ReportError naming the entry: the figures index them by token."""
    truth = read_npz(path)
    tokens = num_tokens
    for name, array in truth.items():
        if name not in GROUND_TRUTH_AXES:
            raise ReportError(f"{path}: entry {name[:40]!r} is not one of {', '.join(GROUND_TRUTH_AXES)}; not a "
                              f"pe_fast results folder")
        tokens = array.shape[0] if tokens is None and array.ndim else tokens
        wanted = tuple(tokens if axis == "tokens" else axis for axis in (tokens, *GROUND_TRUTH_AXES[name]))
        real = array.dtype.kind in "iuf"  # not complex: the RDMs and figures compare and plot real numbers
        numeric = real or (name == "labels" and array.dtype.kind == "U")
        if not numeric or array.ndim != len(wanted) or any(w is not None and w != n
                                                           for w, n in zip(wanted, array.shape)):
            shape = "[" + ", ".join("k" if w is None else str(w) for w in wanted) + "]"
            raise ReportError(f"{path}: entry {name} is a {array.dtype} array of shape {list(array.shape)}, not "
                              f"{shape} of real numbers over the {tokens} tokens; not a pe_fast results folder")
        if real and not np.isfinite(array).all():  # the task's data were checked finite before the sweep wrote it
            raise ReportError(f"{path}: entry {name} holds NaN or inf; not a pe_fast results folder")
        # beyond float32, squares and products in the figures' correlations overflow (float16 compared as float64:
        # float32's largest is inf in float16, with numpy's warning)
        if real and array.size and np.abs(array.astype(np.float64)).max() > FLOAT32_MAX:
            raise ReportError(f"{path}: entry {name} holds values beyond float32's range; not a pe_fast results "
                              f"folder")
        if name == "centroids" and (problem := centroids_problem(array.astype(np.float64))) is not None:
            raise ReportError(f"{path}: its centroids {problem}, which no task's regions do; not a pe_fast results "
                              f"folder")
        # a connectivity gradient is an axis across the regions: a constant one correlates with nothing (NaN), and
        # one varying by less than 1e-150, as a data file's region, has squares that underflow (numpy's warnings)
        if name == "gradients" and array.size and (np.ptp(array.astype(np.float64), axis=0) < MIN_SPREAD).any():
            raise ReportError(f"{path}: entry gradients holds a column that is (almost) the same for every region, "
                              f"not a gradient; not a pe_fast results folder")
        # the figures and alignments read each gradient column as an axis across the regions
        if name == "gradients" and array.shape[1] == 0:
            raise ReportError(f"{path}: entry gradients of shape {list(array.shape)} holds no gradient; not a "
                              f"pe_fast results folder")
    return truth


def check_tables_are_the_models(directory: Path, pe_tables: dict[str, np.ndarray], results: pd.DataFrame,
                                settings: dict):
    """Each pe_tables.npz entry belongs to a model the results hold, a PE table is as wide as the settings' models,
    and one that holds NaN or inf (a diverged model's) has NaN PE scores in the results, as a diverged model's
    are; a table and a mean attention map cover the blocks the settings' models have, and tables, where there are
    any, are there for every model whose PE the results score; else one ReportError naming the entry: the figures
    and run.pe_table(i) read a table by its model id."""
    trained = results[~is_baseline(results["pe"])]
    ids = {int(i): row for i, (_, row) in zip(trained["model_id"], trained.iterrows()) if pd.notna(i)}
    width, depth = settings.get("width"), settings.get("depth")
    task = _task_kind(settings)
    scores = [c for c in (task.view.similarity if task else ()) if c in results]
    # the blocks each entry covers: a mean attention map per block; a PE table per block it is added at
    pe_blocks = {"every": depth, "input": 1}.get(settings.get("pe_at"))
    for key, table in pe_tables.items():
        model_id = int(key.rsplit("_", 1)[1])
        if model_id not in ids:
            raise ReportError(f"{directory}: {run_folder.PE_TABLES} entry {key} is for model {model_id}, which the "
                              f"results do not hold: not this run's tables")
        blocks = pe_blocks if key.startswith(run_folder.PE_TABLE) else depth
        if type(blocks) is int and table.shape[0] != blocks:
            raise ReportError(f"{directory}: {run_folder.PE_TABLES} entry {key} holds tables for {table.shape[0]} "
                              f"blocks, where the settings' models have {blocks} (--depth, --pe-at): not this run's "
                              f"table")
        pe = ids[model_id].get("pe")
        if key.startswith(run_folder.PE_TABLE) and pe not in ADDITIVE_PES:
            raise ReportError(f"{directory}: {run_folder.PE_TABLES} entry {key} is a PE table of model {model_id}, "
                              f"whose PE {brief(pe)} adds none: not this run's table")
        if not key.startswith(run_folder.PE_TABLE):
            loss = pd.to_numeric(pd.Series([ids[model_id].get("train_loss", np.nan)]), errors="coerce").iloc[0]
            if np.isfinite(loss) and not np.isfinite(table).all():
                raise ReportError(f"{directory}: {run_folder.PE_TABLES} entry {key} holds NaN or inf, where model "
                                  f"{model_id}'s train_loss in the results is {loss:.3g}, as no diverged model's: not "
                                  f"the map its sweep wrote")
            continue
        if type(width) is int and table.shape[-1] != width:
            raise ReportError(f"{directory}: {run_folder.PE_TABLES} entry {key} is {table.shape[-1]} wide, where "
                              f"the settings' models are {width} (--width): not this run's table")
        scored = next((c for c in scores if np.isfinite(pd.to_numeric(ids[model_id][c], errors="coerce"))), None)
        if scored is not None and not np.isfinite(table).all():
            raise ReportError(f"{directory}: {run_folder.PE_TABLES} entry {key} holds NaN or inf, where the results "
                              f"score model {model_id}'s PE ({scored} {float(ids[model_id][scored]):.3g}), as no "
                              f"diverged model's: not the table its sweep wrote")
    # a PE scored in the results was scored on its table, which a pe_tables.npz holds (docs/results keeps none)
    for model_id, row in ids.items() if pe_tables else ():
        scored = next((c for c in scores if np.isfinite(pd.to_numeric(row[c], errors="coerce"))), None)
        if scored is not None and run_folder.pe_table_key(model_id) not in pe_tables:
            raise ReportError(f"{directory}: {run_folder.PE_TABLES} holds no PE table for model {model_id}, where the "
                              f"results score its PE ({scored} {float(row[scored]):.3g}): a table was removed")


def _task_kind(settings: dict):
    """The TaskKind the settings name, or None (no task recorded, or one this pe_fast does not know)."""
    return KINDS.get(settings.get("task")) if isinstance(settings.get("task"), str) else None


def _prediction_site(readout_token: int | None) -> str:
    return "at every token" if readout_token is None else f"at token {readout_token}"


def read_pack(folder: Path, task: str) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray]]:
    """A finished pack of a sweep of `task`: its results, curves and PE tables (DIR/packs/<index>/), each checked as
    the report checks a folder's (one ReportError naming the file): the sweep joins them into its results, and
    --resume checks them before any pack trains."""
    results, curves = _read_parquet(folder / run_folder.RESULTS), _read_parquet(folder / run_folder.CURVES)
    pe_tables = read_pe_tables(folder / run_folder.PE_TABLES)
    if "pe" not in results or "sigma" not in results:
        raise ReportError(f"{folder}: results lack the columns pe and sigma; not a pe_fast pack")
    check_columns(folder, results, curves, task)
    check_results_are_last_evaluations(folder, results, curves)
    return results, curves, pe_tables


def _pack_count(config: dict) -> int | None:
    """How many packs the sweep planned: config["packs"] (a count or a list), else the models' "pack" field."""
    packs = config.get("packs")
    if isinstance(packs, int):
        return packs
    if isinstance(packs, (list, dict)):
        return len(packs)
    models = config.get("models") or []
    if models and all(isinstance(m, dict) and "pack" in m for m in models):
        return len({m["pack"] for m in models})
    return None


def _last_evaluation(curves: pd.DataFrame) -> pd.DataFrame:
    """Each model's final row of curves.parquet: the same columns as results.parquet (bar train_seconds)."""
    last = curves.groupby("model_id")["step"].transform("max")
    return curves[curves["step"] == last].drop(columns="step").reset_index(drop=True)


def load_run(directory: str | os.PathLike) -> Run:
    """A results folder, finished or still running, as a Run; see read_run for the rules. A folder that cannot
    be read raises ReportError naming the file."""
    # Path() would say only "expected str, bytes or os.PathLike"
    return read_run(named_folder(run_folder.path_text(directory, "load_run: directory")))


def named_folder(directory: str | os.PathLike) -> Path:
    """The results folder a caller or a command line names: Path("") is ".", so an empty name would read (and the
    report write into) the working folder; it is a ReportError instead."""
    if isinstance(directory, str) and not directory.strip():
        raise ReportError(f"{directory!r} names no folder; pass a sweep's results folder (--out of pe_fast.sweep)")
    return Path(directory)


def check_named_once(directories: list[Path]):
    """Several folders read as one run (pooled, compared) must be different folders: ReportError naming the one
    named twice (under two names, perhaps: a link, a relative path)."""
    first: dict[Path, Path] = {}
    for directory in directories:
        same = first.setdefault(directory.resolve(), directory)
        if same is not directory:
            also = "" if str(same) == str(directory) else f" (as {same} and as {directory})"
            raise ReportError(f"{directory.resolve()} is named twice{also}; name each folder once")


def read_run(directory: Path) -> Run:
    """Top-level files when the sweep has finished; otherwise the finished packs (DIR/packs/<index>/).
    Without results.parquet but with curves.parquet, each model's last evaluation stands in for its results."""
    try:
        return _read_run(directory)
    except OSError as error:  # a file or folder this user may not read (mode 000, another owner's)
        raise ReportError(f"{error.filename or directory}: {error.strerror or error}; the results folder cannot be "
                          f"read") from None


def _read_run(directory: Path) -> Run:
    try:
        folder = directory.is_dir()
    except OSError as error:  # a name longer than the file system takes: is_dir raises rather than answers
        raise ReportError(f"{directory}: {error.strerror or error}; pass a sweep's results folder") from None
    if not folder:
        raise ReportError(f"{directory} is not a folder; pass a sweep's results folder (--out of pe_fast.sweep)")
    if not any(_present(directory / name) for name in (run_folder.CONFIG, run_folder.RESULTS, run_folder.CURVES,
                                                       "packs")):  # nothing of a sweep's: its tree is not walked
        check_not_a_pack(directory)  # DIR/packs or one pack: named as the sweep's
        raise ReportError(f"{directory} is not a results folder (no {run_folder.CONFIG}, {run_folder.RESULTS}, "
                          f"{run_folder.CURVES} or packs/); pass a sweep's results folder (--out of pe_fast.sweep)")
    try:  # what is read comes from inside DIR, and what the report writes goes there
        run_folder.check_inside(directory)
    except run_folder.LeavesFolder as error:
        raise ReportError(str(error)) from None
    check_not_a_pack(directory)
    config, settings = {}, {}
    if _present(directory / run_folder.CONFIG):
        regular_file(directory / run_folder.CONFIG)  # a FIFO would be taken as no config.json at all
        try:
            config = run_folder.read_config(directory)
        except (ValueError, UnicodeDecodeError) as error:
            raise ReportError(f"{directory / run_folder.CONFIG} is not a sweep's config ({error})")
        if not isinstance(config, dict) or not isinstance(config.get("settings"), dict):
            raise ReportError(f"{directory / run_folder.CONFIG} is not a sweep's config (a JSON object with "
                              f"settings, models and packs)")
        if run_folder.POOLED_FROM in config:
            check_pooled_from(directory, config[run_folder.POOLED_FROM])
            if _present(directory / "packs"):  # the report pools finished sweeps into a folder of no packs
                raise ReportError(f"{directory / run_folder.CONFIG} names the sweeps it pools (pooled_from), and the "
                                  f"folder holds packs of its own: not a pooled folder the report writes")
        if config["settings"]:  # each of the type the sweep wrote: the report formats and computes with them
            try:
                settings = dict(migrate.settings(config["settings"]))
                check_types(settings, complete=False)
                check_ranges(settings)  # the flags' rules: what --resume would refuse, the report refuses too
                check_text(settings)
                if "task" in settings:
                    check_choices(settings)
                    check_task_rules(settings)  # task_inputs would load (or simulate) the task they describe
                if "executor" in settings:
                    check_executor_flags(settings)
                if settings.get("device") in ("cpu", "cuda") and settings.get("compile") in COMPILE_MODES:
                    # a sweep records the mode it ran: one its device cannot run is not a sweep's record
                    if (why := compile_problem(settings["compile"], torch.device(settings["device"]))) is not None:
                        raise ValueError(f"--compile {settings['compile']}: {why}")
                if isinstance(config.get("packs"), list):
                    check_packs(config["packs"])
            except (KeyError, TypeError, ValueError) as error:
                raise ReportError(f"{directory / run_folder.CONFIG} has settings this pe_fast cannot read "
                                  f"({error})") from None
        described = (config.get("task") or {}).get("task")  # the task's description names its task, as settings do
        if described is not None and "task" in settings and described != settings["task"]:
            raise ReportError(f"{directory / run_folder.CONFIG} describes the data of task {brief(described)} in "
                              f"its task, where its settings name --task {settings['task']}: not one sweep's record")
    packs_listed = config.get("packs")
    if (problem := run_folder.packs_problem(directory, len(packs_listed) if isinstance(packs_listed, list)
                                            else None)) is not None:
        raise ReportError(problem)
    notes: list[str] = []
    top = {name: directory / name for name in (run_folder.RESULTS, run_folder.CURVES, run_folder.PE_TABLES)}
    for path in top.values():  # a FIFO or a folder in its place: refused, not taken as absent (the packs read instead)
        if _present(path):
            regular_file(path)
    if top[run_folder.RESULTS].is_file() or top[run_folder.CURVES].is_file():
        curves = _read_parquet(top[run_folder.CURVES]) if _present(top[run_folder.CURVES]) else pd.DataFrame()
        if top[run_folder.RESULTS].is_file():
            results = _read_parquet(top[run_folder.RESULTS])
            top_results, top_curves = results.copy(), curves.copy()  # as written: compared with the packs' below
        elif {"model_id", "step"} <= set(curves.columns):
            results = _last_evaluation(curves)
            notes.append("no results.parquet: each model's results are its last evaluation in curves.parquet.")
        else:
            raise ReportError(f"{directory}: no results.parquet, and curves.parquet lacks model_id / step")
        pe_tables = read_pe_tables(top[run_folder.PE_TABLES]) if _present(top[run_folder.PE_TABLES]) else {}
    else:
        packs = [run_folder.pack_folder(directory, index) for index in sorted(run_folder.finished_packs(directory))]
        if not packs:
            raise ReportError(f"{directory} holds no results yet (no results.parquet, curves.parquet or finished "
                              f"packs/<index>/results.parquet)")
        results = pd.concat([_read_parquet(p / run_folder.RESULTS) for p in packs], ignore_index=True)
        curve_parts = [_read_parquet(p / run_folder.CURVES) for p in packs if _present(p / run_folder.CURVES)]
        curves = pd.concat(curve_parts, ignore_index=True) if curve_parts else pd.DataFrame()
        pe_tables = {}
        for p in packs:
            if _present(p / run_folder.PE_TABLES):
                pe_tables.update(read_pe_tables(p / run_folder.PE_TABLES))
        planned, models = _pack_count(config), len(config.get("models") or [])
        of_packs = f"{len(packs)} of {planned} packs" if planned else f"{len(packs)} packs"
        of_models = f"{len(results)} of {models} models" if models else f"{len(results)} models"
        notes.append(f"partial: {of_packs} ({of_models}) finished; the sweep is still running or was stopped.")
    results, curves = migrate.table(results), migrate.table(curves)
    missing = [c for c in ("pe", "sigma") if c not in results]
    if missing or results.empty:
        raise ReportError(f"{directory}: the results have no rows or lack the columns {missing}; not a pe_fast "
                          f"results folder")
    if "model_id" not in results:
        results = results.assign(model_id=np.arange(len(results)))
    check_columns(directory, results, curves, (config.get("settings") or {}).get("task"))
    # σ is NaN for PEs without one; a writer may have stored None (object column), which plotting cannot use.
    results["sigma"] = pd.to_numeric(results["sigma"], errors="coerce")
    check_models_listed(directory, results, config.get("models"), config.get("settings") or {},
                        required=isinstance(config.get("packs"), list), packs=config.get("packs"))
    check_values(directory, results, curves, config.get("settings") or {}, config.get("packs"))
    check_results_are_last_evaluations(directory, results, curves)
    if "sigma" in curves:
        curves["sigma"] = pd.to_numeric(curves["sigma"], errors="coerce")
    read_tables = pe_tables  # as read, diverged ones too: compared with the packs' below
    diverged = sorted(key for key, table in pe_tables.items() if not np.isfinite(table).all())
    if diverged:  # NaN / inf weights (too large a learning rate): no figure or RSA can use them
        notes.append(f"{len(diverged)} PE table(s) or attention map(s) hold NaN or inf (diverged models: "
                     f"{', '.join(diverged[:4])}{' …' if len(diverged) > 4 else ''}); left out of the figures and RSA.")
        pe_tables = {key: table for key, table in pe_tables.items() if key not in diverged}
    packs = config.get("packs")
    finished = sorted(run_folder.finished_packs(directory))
    trained_steps = dict(zip(results["model_id"], results["steps"])) if {"model_id", "steps"} <= set(results) else {}
    for index in finished:  # the models load_run(DIR).model(i) would build
        check_pack_weights(directory, index, list(packs[index]) if isinstance(packs, list) and index < len(packs)
                           else None, config.get("settings"), trained_steps=trained_steps,
                           models=config.get("models") if isinstance(config.get("models"), list) else None)
    check_tables_are_the_models(directory, read_tables, results, config.get("settings") or {})
    if (directory / run_folder.GROUND_TRUTH).exists():  # checked once here: the report's figures index it by token
        read_ground_truth(directory / run_folder.GROUND_TRUTH,
                          next((t.shape[-2] for k, t in pe_tables.items() if k.startswith(run_folder.PE_TABLE)), None))
    if top[run_folder.RESULTS].is_file() and finished:  # a finished sweep's tables: its packs'
        check_made_of_packs(directory, top_results, top_curves,
                            [run_folder.pack_folder(directory, index) for index in finished], read_tables)
    # last, after the checks that name what is wrong: each file the one its writer wrote (an edited number passes
    # every check of its kind)
    packs_folder = directory / "packs"  # every pack's folder, its results readable or not (Run.pack opens either)
    pack_folders = [pack for pack in sorted(packs_folder.iterdir()) if run_folder.PACK_NAME.fullmatch(pack.name)] \
        if packs_folder.is_dir() else []  # packs_problem: each a folder, none a link
    # a pe_fast that records digests records them for every pack: one without was stripped of its check
    digested = _present(directory / run_folder.DIGESTS) or any(_present(p / run_folder.DIGESTS) for p in pack_folders)
    recorded = trained_with(settings) if settings else None
    for pack in pack_folders:
        if not check_digests(pack) and (digested or _present(pack / run_folder.TRAINED_WITH)):
            raise ReportError(f"{pack / run_folder.DIGESTS} is missing, where the sweep that wrote {pack} records one "
                              f"for every pack: its files cannot be checked (delete the pack and --resume retrains it)")
        check_pack_files(pack)
        if recorded is not None:
            check_trained_with(directory / run_folder.CONFIG, recorded, pack)
    if recorded is not None and run_folder.POOLED_FROM in config:  # a pooled folder's record is its own
        check_trained_with(directory / run_folder.CONFIG, recorded, directory)
    if not check_digests(directory) and _present(directory / run_folder.RESULTS):
        notes.append(f"no {run_folder.DIGESTS} (a folder of a pe_fast before 2026-12-07, or a sweep stopped as it "
                     f"finished): its files could not be checked against what the sweep wrote.")
    run = Run(config, results, curves, pe_tables, notes, path=directory, diverged=tuple(diverged))
    for index in finished:  # each opened as run.pack(i) opens it, so that every reader refuses what it refuses
        if _present(run_folder.pack_folder(directory, index) / run_folder.WEIGHTS) and isinstance(packs, list):
            run.pack(index)
    return run


def check_not_a_pack(directory: Path):
    """A finished pack's folder (DIR/packs/<i>, or a copy of one) is part of its sweep, not a results folder: the
    report wrote its figures into one, and the sweep's own readers then refused the sweep."""
    # first: a config.json copied into a pack does not make it a run
    if (sweep := run_folder.sweep_of_packs(directory)) is not None:
        name = directory.resolve().name
        held = "holds the packs" if name == "packs" else f"is pack {name}"
        raise ReportError(f"{directory} {held} of the sweep {sweep}; pass that folder")
    if _present(directory / run_folder.CONFIG):
        return
    if _present(directory / run_folder.TRAINED_WITH) or _present(directory / run_folder.WEIGHTS):
        raise ReportError(f"{directory} is a sweep's pack (it holds {run_folder.TRAINED_WITH} or "
                          f"{run_folder.WEIGHTS}, and no {run_folder.CONFIG}); pass the sweep's folder")


def is_trained_with(recorded, settings: dict) -> bool:
    """Whether a record of what a pack trained with (TRAINED_WITH, a checkpoint's) is one a pe_fast writes: settings
    by name, each one of these or a setting pe_fast has (one missing from config.json's settings is theirs to
    answer for: trained_with_problem names it)."""
    known = {*settings, *FLAGS, *(setting.name for kind in KINDS.values() for setting in kind.settings)}
    return isinstance(recorded, dict) and all(isinstance(name, str) for name in recorded) and set(recorded) <= known


def trained_with_problem(recorded: dict, settings: dict) -> str | None:
    """The first setting whose value config.json's settings (trained_with(), by name) give otherwise than the
    record of what a pack trained with (a finished pack's TRAINED_WITH, a checkpoint's), as "--name X, not Y";
    None where they agree."""
    # as JSON text: Python's == takes False for 0 and 0.0 for 0, which config.json's rules tell apart
    name = next((key for key in sorted(set(recorded) | set(settings))
                 if json.dumps(recorded.get(key), sort_keys=True) != json.dumps(settings.get(key), sort_keys=True)),
                None)
    if name is None:
        return None
    flag = f"--{name.replace('_', '-')}"
    if name not in settings:
        return f"no {flag}, not {str(recorded.get(name))[:60]}"
    return f"{flag} {str(settings.get(name))[:60]}, not {str(recorded.get(name))[:60]}"


def check_trained_with(config_path: Path, settings: dict, folder: Path):
    """A finished pack (or a pooled folder) trained with config.json's settings (ReportError naming the first that
    differs: config.json edited since, which a --resume would follow and the report describe); a pack of an older
    pe_fast has no record."""
    path = folder / run_folder.TRAINED_WITH
    if not _present(path):
        return
    regular_file(path)
    if path.stat().st_size > 64 * 1024:  # the settings of one pack: a few KB
        raise ReportError(f"{path} is not a record of settings a pe_fast writes")
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ReportError(f"{path} is not a record of settings a pe_fast writes") from None
    if not is_trained_with(recorded, settings):
        raise ReportError(f"{path} is not a record of settings a pe_fast writes")
    if (problem := trained_with_problem(recorded, settings)) is not None:
        raise ReportError(f"{config_path} says {problem} as {path} records: its models trained with other settings "
                          f"(config.json edited since)")


def check_made_of_packs(directory: Path, results: pd.DataFrame, curves: pd.DataFrame, packs: list[Path],
                        pe_tables: dict[str, np.ndarray]):
    """The top-level results, curves and PE tables of a finished sweep are its packs' (the sweep writes them from
    the packs; the record of their digests is no signature: a top-level table edited under a rewritten digests.json
    passed). ReportError naming the first model or table that differs from its pack's."""
    for pack in packs:
        if not _present(pack / run_folder.PE_TABLES):
            continue
        for key, table in read_pe_tables(pack / run_folder.PE_TABLES).items():
            if key not in pe_tables or not np.array_equal(pe_tables[key], table, equal_nan=True):
                raise ReportError(f"{directory / run_folder.PE_TABLES}: its {key} differs from "
                                  f"{pack / run_folder.PE_TABLES}'s, of which the sweep made it: one of the two was "
                                  f"edited")
    for name, top in ((run_folder.RESULTS, results), (run_folder.CURVES, curves)):
        parts = [_read_parquet(pack / name) for pack in packs if _present(pack / name)]
        if not parts or "model_id" not in top:
            continue
        ours = pd.concat(parts, ignore_index=True)
        if "model_id" not in ours:
            continue
        trained = top[top["model_id"].isin(ours["model_id"])]
        keys = ["model_id", "step"] if "step" in ours and "step" in trained else ["model_id"]
        columns = [c for c in ours.columns if c in trained.columns]
        a = trained[columns].sort_values(keys, kind="stable").reset_index(drop=True)
        b = ours[columns].sort_values(keys, kind="stable").reset_index(drop=True)
        differs = "rows" if len(a) != len(b) else next(
            (c for c in columns if not (a[c].isna() & b[c].isna() | (a[c] == b[c])).all()), None)
        if differs is not None:
            raise ReportError(f"{directory / name}: its {differs} is not its packs' (packs/<i>/{name}); the top-level "
                              f"tables are made of the packs")


def check_digests(folder: Path) -> bool:
    """run_folder.check_digests, its ChangedFile a ReportError."""
    try:
        return run_folder.check_digests(folder)
    except run_folder.ChangedFile as error:
        raise ReportError(str(error)) from None


def check_pack_files(folder: Path):
    """run_folder.check_pack_files, its ChangedFile a ReportError."""
    try:
        run_folder.check_pack_files(folder)
    except run_folder.ChangedFile as error:
        raise ReportError(str(error)) from None


def check_pooled_from(directory: Path, folders):
    """A pooled folder's sources, as the report wrote them: absolute folder names (a relative one would be read
    against wherever the reader runs), none of them the folder itself."""
    if not (isinstance(folders, list) and folders and all(
            isinstance(f, str) and f and "\0" not in f and os.path.isabs(f) for f in folders)):
        raise ReportError(f"{directory / run_folder.CONFIG}: pooled_from is not a list of absolute folder names")
    if any(Path(f).resolve() == directory.resolve() for f in folders):
        raise ReportError(f"{directory / run_folder.CONFIG}: pooled_from names the folder itself, a loop")


def check_pack_weights(directory: Path, index: int, model_ids: list[int] | None, settings: dict | None = None,
                       pe_tables: dict[str, np.ndarray] | None = None, trained_steps: dict | None = None,
                       models: list | None = None):
    """Pack `index`'s weights.safetensors, where it has one: tensors and text only, as its header declares
    (weights.check_pack_weights), of the shape and PE placement and dropout config.json's settings give (settings:
    None, not known), and holding the models config.json gives the pack (model_ids; None: not known) with the PE
    and σ it lists for each (models: config.json's), taken at the step the results say its models trained to
    (trained_steps: model id -> steps), or one ReportError naming it. With the pack's pe_tables, each model's table
    there is the one its weights hold (the file is loaded whole)."""
    path = run_folder.pack_folder(directory, index) / run_folder.WEIGHTS
    if not _present(path):
        return
    try:
        meta, config = weights.check_pack_weights(regular_file(path))
    except weights.UnreadableWeights as error:
        raise ReportError(str(error)) from None
    held, step = list(meta["model_ids"]), meta["step"]
    # what the model computes besides its shape: an edited header (digests rewritten) opened another model
    listed = {m.get("model_id"): m for m in models or () if isinstance(m, dict)}
    for model_id, sigma in zip(held, meta["sigmas"]):
        entry = listed.get(model_id)
        if entry is not None and (entry.get("pe") != config.pe or (entry.get("sigma") is None) != (sigma is None) or (
                sigma is not None and not math.isclose(sigma, entry["sigma"], rel_tol=1e-6))):
            raise ReportError(f"{path}: holds model {model_id} with PE {config.pe} σ {sigma}, where config.json lists "
                              f"PE {entry.get('pe')!r:.20} σ {entry.get('sigma')!r:.20}: not this run's pack, or a "
                              f"file was edited")
    if settings and settings.get("pe_at") is not None and config.pe_at != settings["pe_at"]:
        raise ReportError(f"{path}: its models add the PE at {config.pe_at!r}, where config.json's settings say "
                          f"{settings['pe_at']!r:.20}: not this run's pack, or a file was edited")
    if settings and "pe_dropout" in settings and "pe_dropout_on" in settings and isinstance(
            settings["pe_dropout_on"], (list, tuple)) and config.pe_dropout != pe_dropout_of(settings, config.pe):
        raise ReportError(f"{path}: its models train with PE dropout {config.pe_dropout}, where config.json's "
                          f"settings give {config.pe} {pe_dropout_of(settings, config.pe)}: not this run's pack, or a "
                          f"file was edited")
    task = _task_kind(settings or {})
    if task is not None and config.readout_token != task.readout_token:
        raise ReportError(f"{path}: its models predict {_prediction_site(config.readout_token)}, where task "
                          f"{task.name}'s predict {_prediction_site(task.readout_token)}: not this run's pack, or a "
                          f"file was edited")
    try:  # what its settings recorded (checked before any pack is read) make the task's tokens
        dims = task.model_dims(settings) if task is not None else None
    except (KeyError, TypeError):
        dims = None
    if dims is not None and (config.token_dim, config.out_dim) != dims:
        raise ReportError(f"{path}: its models take {config.token_dim} values a token and predict {config.out_dim}, "
                          f"where task {task.name}'s take {dims[0]} and predict {dims[1]} with its settings: not "
                          f"this run's pack, or a file was edited")
    if settings and "backend" in settings and config.backend != settings["backend"]:
        raise ReportError(f"{path}: its models were built for backend {config.backend!r:.20}, where config.json's "
                          f"settings say {settings['backend']!r:.20}: not this run's pack, or a file was edited")
    recorded = {trained_steps[i] for i in held if i in trained_steps} if trained_steps else set()
    if recorded and recorded != {step}:  # run.pack(i).step read 10**30 from an edited header
        raise ReportError(f"{path}: its weights were taken at step {step}, where the results say its models trained "
                          f"{sorted(recorded)[0]} steps: not this run's pack, or a file was edited")
    for name in MODEL_SHAPE:  # the settings' shape, which the report shows: an edited width passed it
        if settings and settings.get(name) is not None and getattr(config, name) != settings[name]:
            raise ReportError(f"{path}: its models have {name} {getattr(config, name)}, where config.json's settings "
                              f"say {settings[name]!r:.20}; not this run's pack, or the settings were edited")
    if model_ids is not None and held != model_ids:
        raise ReportError(f"{path}: holds models {held[:6]}, config.json's pack {index} {model_ids[:6]}: not this "
                          f"run's pack")
    if pe_tables is not None:
        try:
            loaded = weights.load_pack_weights(path)
        except weights.UnreadableWeights as error:
            raise ReportError(str(error)) from None
        if (problem := pe_tables_problem(loaded, pe_tables)) is not None:
            raise ReportError(f"{path}: its models have {problem}: models swapped in one of the two files")


def pe_tables_problem(loaded: weights.PackWeights, pe_tables: dict[str, np.ndarray]) -> str | None:
    """The first model whose PE in pe_tables (a pack's float32 or a folder's float64 copy) is not the one its
    weights hold, or None: both are written from the same state, and models swapped inside either file, under a
    digests.json rewritten to match, would be read under each other's ids."""
    tables = [table.detach().cpu().numpy() for table in loaded.model.pe_tables()]
    for m, model_id in enumerate(loaded.model_ids):
        table = pe_tables.get(run_folder.pe_table_key(model_id))
        if tables and table is not None and not np.array_equal(
                np.stack([t[m] for t in tables]).astype(table.dtype), table, equal_nan=True):
            return f"for model {model_id} a PE other than the one {run_folder.PE_TABLES} holds for it"
    return None


# a results row's pe: a PE kind, or a task's non-transformer reference ("baseline:mean"); a name of any length
# reached the figures' legends (a 200,000-character one held the report for minutes)
PE_NAME = re.compile(rf"(?:{'|'.join(PE_KINDS)}|baseline:[a-z0-9_-]{{1,40}})")


def _numbers(column: pd.Series) -> pd.Series | None:
    """The column as numbers (None and NaN kept as NaN), or None where a value is not a number."""
    numbers = pd.to_numeric(column, errors="coerce")
    return None if (numbers.isna() & column.notna()).any() or column.map(lambda v: isinstance(v, bool)).any() \
        else numbers


# the columns of text a sweep writes (executors.train_and_store_pack, the task's data_kind); every other one holds
# numbers, which the report averages and plots
TEXT_COLUMNS = frozenset({"task", "data_kind", "pe", "optimizer", "stopped", "precision"})
# the text columns a sweep fills from a list of choices (empty where a row has none: a baseline's optimizer)
CHOICE_COLUMNS = {"optimizer": OPTIMIZERS, "stopped": UNTIL, "precision": PRECISIONS}


def check_columns(directory: Path, results: pd.DataFrame, curves: pd.DataFrame, task: str | None):
    """The columns the report and load_run's users read, of the kind a sweep writes, or one ReportError naming the
    column: a folder someone else made (or a tampered one) is refused as a whole, before anything reads it. task:
    the one config.json records (None where it records none), which every row's task column names."""
    def refuse(table: str, what: str):
        raise ReportError(f"{directory}: {table} {what}; not a pe_fast results folder")

    for table, frame in (("results", results), ("curves", curves)):
        # a name, as every column a sweep writes (a probe column '$x^{$' reached matplotlib's mathtext)
        if (odd := next((n for n in frame.columns if not (isinstance(n, str) and run_folder.CURVES_KEY.fullmatch(n))),
                        None)) is not None:
            refuse(table, f"has a column named {_shown(odd)}, not a name a sweep writes")
        if task is not None and "task" in frame and (other := frame["task"][frame["task"] != task]).size:
            refuse(table, f"column task holds {str(other.iloc[0])[:40]!r}, where config.json records --task {task}")
        # a sweep computes in float32 at most: a larger finite number was not trained, and its squares and
        # differences overflow the report's statistics and axes
        for name in frame.columns.difference(TEXT_COLUMNS):
            numbers = pd.to_numeric(frame[name], errors="coerce")
            beyond = np.isfinite(numbers) & (numbers.abs() > FLOAT32_MAX)
            if beyond.any():
                refuse(table, f"column {name} holds {numbers[beyond].iloc[0]:g}, beyond any float32 a sweep computes")

    # text the report prints: only the names a sweep writes (a PE name '<script>…' reached report.md)
    for table, frame in (("results", results), ("curves", curves)):
        if "pe" in frame or table == "results":
            bad_pe = next((v for v in frame["pe"].unique() if not (isinstance(v, str) and PE_NAME.fullmatch(v))),
                          None)
            if bad_pe is not None:
                refuse(table, f"column pe holds {_shown(bad_pe)}, not a PE kind ({', '.join(PE_KINDS)}) or a "
                              f"baseline:NAME")
            kind = _task_kind({"task": task})
            stranger = next((v for v in frame["pe"][is_baseline(frame["pe"])].unique()
                             if kind is not None and v not in kind.baselines), None)
            if stranger is not None:
                refuse(table, f"column pe holds {_shown(stranger)}, not a baseline task {task} writes ("
                              f"{', '.join(kind.baselines) or 'it writes none'})")
        for name, choices in CHOICE_COLUMNS.items():
            bad = [v for v in frame[name].dropna().unique() if v not in choices] if name in frame else []
            if bad:
                refuse(table, f"column {name} holds {_shown(bad[0])}, not one of {', '.join(choices)}")
    # a baseline is one row, fitted once: no σ, no seed, trained in no pack (-1)
    baselines = results[is_baseline(results["pe"])]
    if (twice := baselines["pe"][baselines["pe"].duplicated()]).size:
        refuse("results", f"column pe names {_shown(twice.iloc[0])} twice, where a sweep writes each baseline once")
    for name, value in (("sigma", None), ("seed", None), ("pack", -1)):
        if name in baselines:
            held = pd.to_numeric(baselines[name], errors="coerce")
            wrong = held.notna() & (True if value is None else held != value)  # empty: not recorded
            if wrong.any():
                refuse("results", f"column {name} holds {_shown(baselines[name][wrong].iloc[0])} for "
                                  f"{_shown(baselines['pe'][wrong].iloc[0])}, where a baseline's is "
                                  f"{'empty' if value is None else value}")
    sigma = _numbers(results["sigma"])  # every column but the text ones is stored as numbers (check_parquet_schema)
    if ((sigma <= 0) | np.isinf(sigma)).any():
        refuse("results", f"column sigma holds {sigma[(sigma <= 0) | np.isinf(sigma)].iloc[0]:g}; σ is finite and "
                          f"> 0 (or empty for PEs without one)")
    for name in (axis for axis in GRID_AXES if axis in results and FLAGS[axis].range):  # in their flags' ranges
        values = _numbers(results[name])
        if values is None:
            refuse("results", f"column {name} holds a value that is not a number")
        try:
            for value in values.dropna():
                check_range(name, float(value), *FLAGS[name].range)
        except SettingError as error:
            refuse("results", f"column {name}: {error}")
    unset = sigma.isna() & results["pe"].isin(SIGMA_PES)
    if unset.any():
        refuse("results", f"column sigma is empty for pe {results['pe'][unset].iloc[0]}, whose PE is drawn with a σ")
    baseline = is_baseline(results["pe"])
    for name, may_be_empty in (("seed", baseline), ("model_id", False)):  # baselines have no seed
        if name in results and (problem := _not_counts(_numbers(results[name]), may_be_empty)):
            refuse("results", f"column {name} holds {problem}")
    if "model_id" in results and results["model_id"].duplicated().any():
        refuse("results", f"column model_id holds {results['model_id'][results['model_id'].duplicated()].iloc[0]} "
                          f"twice; each model has one row")
    if "steps" in results and (problem := _not_counts(_numbers(results["steps"]), baseline)):
        refuse("results", f"column steps holds {problem}")
    if not curves.empty:
        for name in ("model_id", "step"):
            if name not in curves or curves[name].isna().any():
                refuse("curves", f"column {name} is missing or empty")
            if problem := _not_counts(_numbers(curves[name]), False):
                refuse("curves", f"column {name} holds {problem}")
        if "model_id" in results and not (stray := set(curves["model_id"]) - set(results["model_id"])) <= set():
            refuse("curves", f"column model_id holds {min(stray)}, a model the results do not hold")
        if curves.duplicated(["model_id", "step"]).any():
            twice = curves[curves.duplicated(["model_id", "step"])].iloc[0]
            refuse("curves", f"model {twice['model_id']} has two rows at step {twice['step']}; one evaluation a step")


# the settings that give a model's shape, which its weights file records too
MODEL_SHAPE = ("width", "depth", "heads", "mlp_width")
# what makes a model the one config.json lists (its pack and pooled_from say where it trained, which pooling renumbers)
MODEL_IDENTITY = frozenset({"pe", "sigma", "seed", *GRID_AXES})
# the keys of config.json's models: those every pe_fast wrote, and those some did (the grid axes came later)
MODEL_REQUIRED = frozenset({"model_id", "pe", "sigma", "seed"})
MODEL_KEYS = MODEL_REQUIRED | MODEL_IDENTITY | {"pack", run_folder.POOLED_FROM}


# and every mean squared error, drift, distance, entropy and Procrustes residual (check_values: by their names)
NON_NEGATIVE = frozenset({"lr_last", "train_seconds", "train_loss"})
ROUNDING = 1e-6  # a bound's float rounding (a correlation of 1.0000000000000002)


def check_values(directory: Path, results: pd.DataFrame, curves: pd.DataFrame, settings: dict, packs):
    """Numbers no sweep of these settings writes, each a ReportError naming its column: an accuracy beyond 0…1, a
    negative error, rate, loss or time, a step beyond --steps, a pack beyond config.json's packs (the record of the
    files' digests is no signature: whoever edits a number can rewrite it). NaN passes: a diverged model's."""
    steps = settings.get("steps")
    for table, frame in (("results", results), ("curves", curves)):
        for name in frame.columns.difference(TEXT_COLUMNS):
            numbers = pd.to_numeric(frame[name], errors="coerce")
            if name.endswith("_acc") or "_acc_" in name:
                bad, what = (numbers < 0) | (numbers > 1), "an accuracy beyond 0…1"
            elif name.endswith(("_share", "_prob")):
                bad, what = (numbers < -ROUNDING) | (numbers > 1 + ROUNDING), "a fraction beyond 0…1"
            elif name.endswith("_corr"):
                bad, what = numbers.abs() > 1 + ROUNDING, "a correlation beyond −1…1"
            elif name.endswith("_r2"):
                bad, what = numbers > 1 + ROUNDING, "an R² above 1"
            elif name.endswith(("_mse", "_drift", "_distance", "_entropy", "_procrustes")) or name in NON_NEGATIVE:
                bad, what = numbers < -ROUNDING, "a negative value"
            elif name in ("step", "steps") and type(steps) is int:
                bad, what = numbers > steps, f"a step beyond the settings' --steps {steps}"
                every = settings.get("eval_every")
                if name == "step" and type(every) is int and every > 0 and not bad.any():
                    # evaluations come every --eval-every steps, and at the last
                    bad, what = (numbers % every != 0) & (numbers != steps), f"no evaluation's (every {every})"
            elif name == "pack" and isinstance(packs, list) and packs:
                trained = ~is_baseline(frame["pe"]) if "pe" in frame else True
                bad = (numbers >= len(packs)) | ((numbers < 0) & trained)  # -1: the baselines' own
                what = f"not one of config.json's {len(packs)} packs"
            else:
                continue
            if bad.any():
                raise ReportError(f"{directory}: {table} column {name} holds {_shown(numbers[bad].iloc[0])}, "
                                  f"{what}; not a pe_fast results folder")


def check_models_listed(directory: Path, results: pd.DataFrame, models, settings: dict, required: bool,
                        packs=None):
    """Each trained model of the results is one config.json lists, as it lists it (MODEL_IDENTITY: a relabelled PE,
    σ or learning rate passed every reader but --resume); ReportError naming the first that is not. Baselines are
    listed nowhere. required: config.json is a sweep's (or a pooling's), which lists its models; a hand-made one
    need not (a sweep's with its list emptied or removed passed every reader). packs: config.json's, where each
    listed model's pack must be the one that holds it (the readers open a model by its packs)."""
    if not isinstance(models, list):
        if not required:
            return
        models = []
    pack_of = {i: index for index, pack in enumerate(packs) if isinstance(pack, list) for i in pack
               if type(i) is int} if isinstance(packs, list) else {}
    for entry in models:  # as a sweep (grid.expand_grid, with its pack) or pooling (with pooled_from) lists it
        keys = set(entry) if isinstance(entry, dict) else set()
        if not (MODEL_REQUIRED <= keys <= MODEL_KEYS):
            odd = sorted(MODEL_REQUIRED - keys) or sorted(keys - MODEL_KEYS)
            raise ReportError(f"{directory / run_folder.CONFIG}: models lists an entry "
                              f"{'without' if MODEL_REQUIRED - keys else 'with'} {_shown(odd[0]) if odd else 'keys'}; "
                              f"not a pe_fast config")
        if "pack" in entry and entry.get("model_id") in pack_of and entry["pack"] != pack_of[entry["model_id"]]:
            raise ReportError(f"{directory / run_folder.CONFIG}: models lists model {entry['model_id']} in pack "
                              f"{_shown(entry['pack'])}, where its packs hold it in pack {pack_of[entry['model_id']]}; "
                              f"the two records of one sweep disagree")
        # and of the grid the settings describe: each listed value among the settings' (an edited lr passed)
        for key in ("pe", "sigma", *GRID_AXES):
            allowed = settings.get({"sigma": "sigmas"}.get(key, key))
            value = entry.get(key)
            if (value is None or allowed is None or (key == "sigma" and entry.get("pe") not in SIGMA_PES)
                    or not isinstance(allowed, list)):
                continue
            if all(differing_key({key: value}, {key: a}) is not None for a in allowed):
                flag = "--sigmas" if key == "sigma" else f"--{key.replace('_', '-')}"
                raise ReportError(f"{directory / run_folder.CONFIG}: models lists model "
                                  f"{_shown(entry.get('model_id'))} with {key} {_shown(value)}, which its settings' "
                                  f"{flag} do not hold")
    listed = {m["model_id"]: m for m in models if isinstance(m, dict) and type(m.get("model_id")) is int}
    trained = results[~is_baseline(results["pe"])]
    for row in trained.to_dict("records"):
        entry = listed.get(int(row["model_id"]))
        if entry is None:
            raise ReportError(f"{directory}: the results hold model {int(row['model_id'])}, which config.json does "
                              f"not list; not this run's results")
        if (key := differing_key({k: v for k, v in entry.items() if k in MODEL_IDENTITY}, row)) is not None:
            raise ReportError(f"{directory}: the results give model {int(row['model_id'])} {key} "
                              f"{_shown(row.get(key))}, config.json {_shown(entry.get(key))}; not this run's results")


def check_results_are_last_evaluations(directory: Path, results: pd.DataFrame, curves: pd.DataFrame):
    """Each trained model's results row is its last evaluation in the curves (the sweep writes it from that row,
    with its training time), and its curve starts at step 0: a results or curves file edited alone, its digest
    rewritten, passed every check of its kind (a test_r2 of 0.5 in the curves beside -1.24 in the results, a steps
    of 3 beside a curve to step 4, the step-0 evaluation dropped). ReportError naming the first model that is not."""
    if curves.empty or not {"model_id", "step"} <= set(curves):
        return
    ordered = curves.sort_values(["model_id", "step"], kind="stable")
    first = ordered.groupby("model_id").head(1).set_index("model_id")["step"]
    last = ordered.groupby("model_id").tail(1).set_index("model_id")
    trained = results[~is_baseline(results["pe"])]
    for row in trained.to_dict("records"):
        model_id = int(row["model_id"])
        if model_id not in last.index:
            raise ReportError(f"{directory}: curves.parquet holds no evaluation of model {model_id}, which "
                              f"results.parquet holds; not the results of those curves")
        if first[model_id] != 0:
            raise ReportError(f"{directory}: curves.parquet's evaluations of model {model_id} start at step "
                              f"{_shown(first[model_id])}, not 0 (the sweep evaluates every model before training)")
        final = last.loc[model_id]
        pairs = [("steps", row.get("steps"), final["step"])] if "steps" in row else []
        pairs += [(column, value, final[column]) for column, value in row.items()
                  if column in final.index and column not in ("train_seconds", "model_id")]
        for column, ours, theirs in pairs:
            if not (ours == theirs or (pd.isna(ours) and pd.isna(theirs))):
                raise ReportError(f"{directory}: results.parquet gives model {model_id} {column} {_shown(ours)}, "
                                  f"its last evaluation in curves.parquet {_shown(theirs)}; not the results of "
                                  f"those curves")


def differing_key(entry: dict, row: dict) -> str | None:
    """The first of a model's listed keys (config.json's models: PE, σ, seed, grid axes) whose value a results row
    does not hold, or None: None and NaN alike, whole numbers exactly, others to float32's rounding (σ was stored
    as float32 once)."""
    for key, value in entry.items():
        recorded = row.get(key)
        if value is None or recorded is None or (isinstance(recorded, float) and np.isnan(recorded)):
            same = (value is None or (isinstance(value, float) and np.isnan(value))) and (
                recorded is None or (isinstance(recorded, float) and np.isnan(recorded)))
        elif isinstance(value, bool) or isinstance(recorded, (bool, np.bool_)):
            same = False  # no listed key is a bool; True == 1 must not pass as a seed or a pack
        elif isinstance(value, int) and isinstance(recorded, (int, float, np.integer, np.floating)):
            same = recorded == value  # a seed or a pack: exactly
        elif isinstance(value, float) and isinstance(recorded, (int, float, np.integer, np.floating)):
            same = bool(np.isclose(recorded, value, rtol=1e-6, atol=0))
        else:
            same = recorded == value
        if not same:
            return key
    return None


def _shown(value) -> str:
    """A cell's value for a message: its repr, cut short."""
    return repr(value if isinstance(value, str) else getattr(value, "item", lambda: value)())[:40]


def _not_counts(numbers: pd.Series, may_be_empty) -> str | None:
    """What in a column of ids, seeds or steps is not a whole number in [0, 2**63) (the reader indexes and formats
    them as integers), or None; NaN only where may_be_empty."""
    bad = ~(numbers.isna() & may_be_empty) & ~((numbers >= 0) & (numbers < 2**63) & (numbers % 1 == 0))
    return f"{numbers[bad].iloc[0]:g}, not a whole number in [0, 2**63)" if bad.any() else None


def task_name(run: Run) -> str:
    name = (run.config.get("settings") or {}).get("task")
    if name is None and "task" in run.results:
        name = str(run.results["task"].iloc[0])
    if name not in KINDS:
        raise ReportError(f"unknown task {name!r} in the results; the report knows {', '.join(KINDS)}")
    return name


# What may differ between folders pooled as one run (Flag.may_differ and .runtime): which models they trained (seeds,
# PEs, σ, and the PE dropout, which is checked per PE kind), how often they evaluated, the preset's name (its values
# are compared), and where and how they ran.
MAY_DIFFER = frozenset({"packs", *(name for name, flag in FLAGS.items() if flag.may_differ or flag.runtime)})


def recorded_settings(directory: Path, run: Run) -> Settings:
    """The Settings a folder's config.json records, of any pe_fast version (migrate.settings); files from before a
    setting get its default, as --resume gives them."""
    try:
        return Settings.from_json(migrate.settings(run.config["settings"]), packs=())
    except (KeyError, TypeError, ValueError) as error:
        raise ReportError(f"{directory}/config.json has settings this pe_fast cannot read ({error})")


def check_alike(settings: dict[Path, Settings], may_differ: frozenset[str] = MAY_DIFFER):
    """Every folder trained like the first but in what may_differ names; ReportError names the first difference."""
    (first_dir, first), *others = settings.items()
    for directory, setting in others:
        theirs, ours = setting.flat(), first.flat()
        for name, value in theirs.items():
            if name not in may_differ and value != ours.get(name):
                raise ReportError(f"{directory} trained with {name} = {value!r}, {first_dir} with "
                                  f"{ours.get(name)!r}: not one run's models")
