"""The grid: one model per (PE kind, σ, seed), split into packs of one PE kind that train together, and the
model and training configurations of a pack."""
from __future__ import annotations

import math

import torch

from pe_fast import memory
from pe_fast.models import ModelConfig
from pe_fast.models.absolute_pe import SIGMA_PES
from pe_fast.sweep.settings import Settings
from pe_fast.train import TrainConfig

# The authors' 15 LST seeds (notes/paper.md §2.6); --seeds N takes the first N, further ones count on from 1.
AUTHOR_SEEDS = (2235, 6312, 6068, 9742, 8880, 2197, 669, 6256, 3309, 2541, 8643, 7785, 195, 6914, 29)


def model_seeds(count: int) -> list[int]:
    return list(AUTHOR_SEEDS[:count]) + list(range(1, count - len(AUTHOR_SEEDS) + 1))


def expand_grid(s: Settings) -> list[dict]:
    """One entry per model: its PE kind, σ (None where the PE has none) and seed, in a stable order."""
    models = []
    for kind in s.pe:
        for sigma in (s.sigmas if kind in SIGMA_PES else [None]):
            for seed in model_seeds(s.seeds):
                models.append(dict(model_id=len(models), pe=kind, sigma=sigma, seed=seed))
    return models


def split_into_packs(models: list[dict], max_pack: int) -> list[list[dict]]:
    """Models that share an architecture (the PE kind) train together, at most max_pack at a time, in packs of
    near-equal size: 315 models with room for 301 train as 158 + 157, not as 301 + 14, whose small pack would
    run at a small pack's (host-bound) rate on a GPU."""
    packs = []
    for kind in dict.fromkeys(m["pe"] for m in models):
        same = [m for m in models if m["pe"] == kind]
        size = math.ceil(len(same) / math.ceil(len(same) / max_pack))
        packs.extend(same[i:i + size] for i in range(0, len(same), size))
    return packs


def pack_models(s: Settings, models: list[dict]) -> list[list[dict]]:
    """The packs as config.json lists them (by model_id), or a new split for a new sweep."""
    if s.packs is not None:
        return [[models[i] for i in ids] for ids in s.packs]
    return split_into_packs(models, s.max_pack)


def model_config(s: Settings, task, kind: str) -> ModelConfig:
    return ModelConfig(num_tokens=task.num_tokens, token_dim=task.token_dim, out_dim=task.num_classes,
                       width=s.width, depth=s.depth, heads=s.heads, mlp_width=s.mlp_width, pe=kind,
                       pe_at=s.pe_at, readout_token=task.readout_token)


def train_config(s: Settings) -> TrainConfig:
    return TrainConfig(steps=s.steps, batch_size=s.batch_size, lr=s.lr, optimizer=s.optimizer,
                       weight_decay=s.weight_decay, momentum=s.momentum, schedule=s.schedule, warmup=s.warmup,
                       eval_every=s.eval_every, eval_items=s.eval_items, precision=s.precision,
                       compile=s.compile == "on")


def choose_pack_size(s: Settings, task) -> int:
    """--max-pack if given, else as many models as fit in half the device's free memory (pe_fast.memory)."""
    if s.max_pack:
        return s.max_pack
    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return 64  # a Ray cluster's GPU, not visible from here: a pack size that fits any current GPU
    from pe_fast.ops.backends import resolve_backend
    per_model = memory.bytes_per_model(model_config(s, task, s.pe[0]), s.batch_size, s.optimizer,
                                       resolve_backend(s.backend, device), task.coordinates)
    return memory.pack_size(per_model, memory.free_bytes(device))
