"""Every older format of a results folder's files, read as today's: one function per file, each rule naming the
change it undoes. Readers call these and never test for an older format themselves.

* settings(): config.json's "settings" (the report, pooling and --resume read them through it)
* table(): results.parquet and curves.parquet (reading.read_run)
* checkpoint(): a pack's training state, packs/<i>.checkpoint.pt (run_folder.load_checkpoint)
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
import torch

from pe_fast.results.settings import LIST_SETTINGS, SettingError, Settings
from pe_fast.tasks import KINDS

# Every name a config.json's settings held in an earlier pe_fast and this one has not: the flags of the first
# sweeps, whose argparse namespace was written whole (checked against the git history of every settings table,
# argparse flag and task setting, 2026-12). Any other unknown name is not pe_fast's: the file is refused.
REMOVED_SETTINGS = frozenset({"logs", "resume", "version"})

# Block parameters' names from before a block held a PEAttention (2026-11), for checkpoints written then
OLD_BLOCK_NAMES = {"w_qkv": "attention.w_qkv", "b_qkv": "attention.b_qkv", "attn_out.weight": "attention.out.weight",
                   "attn_out.bias": "attention.out.bias"}
OLD_BLOCK_KEY = re.compile(r"^(?P<block>blocks\.\d+\.)(?P<old>" + "|".join(map(re.escape, OLD_BLOCK_NAMES)) + r")$")


def settings(recorded: dict) -> dict:
    """config.json's settings as this pe_fast writes them, from a file of any earlier version. Each rule names the
    change it undoes; a setting this version lacks is dropped, one it adds is left out (the field's default, or
    the sweep's check, fills it). SettingError: a name no pe_fast version wrote."""
    task = recorded.get("task")
    kind = KINDS.get(task) if isinstance(task, str) else None  # any other value: the sweep's check names it
    known = {field.name for field in dataclasses.fields(Settings)} - {"packs", "task_settings"}
    # every task's settings, in files from before a task owned its settings: the task's own are kept
    every_task = {name for other in KINDS.values() for name in other.flags}
    unknown = sorted(set(recorded) - known - every_task - REMOVED_SETTINGS, key=str)
    if unknown:
        raise SettingError(f"unknown setting {unknown[0]!r}: no pe_fast version writes it")
    known |= set(kind.flags if kind else ())
    s = {name: value for name, value in recorded.items() if name in known}
    for name in LIST_SETTINGS:  # a single value in files from before the optimizer axes (lists since)
        if s.get(name) is not None and not isinstance(s[name], (list, tuple)):
            s[name] = [s[name]]
    if "precision" in s and s["precision"] is None:  # files from before --precision resolved it: trained in float32
        s["precision"] = "fp32"
    return s


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """results.parquet or curves.parquet as this pe_fast writes them. Before the optimizer axes, "lr" held the
    learning rate at the evaluation's step, which is lr_last since (lr: each model's value of the --lr axis)."""
    if "lr" in frame and "lr_last" not in frame:
        return frame.rename(columns={"lr": "lr_last"})
    return frame


def renamed(key: str) -> str:
    """A model's state_dict key under today's name."""
    old = OLD_BLOCK_KEY.match(key)
    return f"{old['block']}{OLD_BLOCK_NAMES[old['old']]}" if old else key


def checkpoint(state: dict) -> dict:
    """A pack's training state (train.PackTrainer.state_dict) as this pe_fast writes it. Two older forms still load
    without a rule here, in PackTrainer.load_state_dict: batches None (before every task's batches had a state) and
    no scaler (before fp16, which no earlier pack used). ValueError: what no pe_fast version wrote, where this
    would fail on it (a key that is no name) or make a state of it (a tensor under its old and its new name both,
    the old one taken)."""
    if not isinstance(state, dict):
        raise ValueError(f"it holds a {type(state).__name__}, not a pack's training state")
    if isinstance(state.get("model"), dict):
        model = {}
        for key, value in state["model"].items():
            if not isinstance(key, str):
                raise ValueError(f"its model holds a key {str(key)[:40]!r}, not a tensor's name")
            if (name := renamed(key)) in model:
                raise ValueError(f"its model holds {name} twice, under an older name and today's")
            model[name] = value
        state["model"] = model
    if "initial_pe" in state:  # numpy arrays in checkpoints written before 2026-11-26
        if not isinstance(state["initial_pe"], list):
            raise ValueError(f"its initial_pe is a {type(state['initial_pe']).__name__}, not a list of PE tables")
        state["initial_pe"] = [torch.as_tensor(t) if isinstance(t, np.ndarray) else t for t in state["initial_pe"]]
    return state
