"""The grid: one model per (PE kind, point of the grid axes, σ, seed), split into packs of one PE kind and one
optimizer kind that train together, and the model and training configurations of a pack."""
from __future__ import annotations

import dataclasses
import itertools

import torch

from pe_fast import memory
from pe_fast.columns import lower_is_better
from pe_fast.models import ModelConfig
from pe_fast.models.transformer import FUSED
from pe_fast.models.absolute_pe import SIGMA_PES
from pe_fast.results.settings import FLAGS, GRID_AXES, Settings, pe_dropout_of
from pe_fast.sweep import UsageError
from pe_fast.tasks import KINDS
from pe_fast.train import PackTrainer, TrainConfig

# The authors' 15 LST seeds (their code and training logs); --seeds N takes the first N, further ones count on from 1.
AUTHOR_SEEDS = (2235, 6312, 6068, 9742, 8880, 2197, 669, 6256, 3309, 2541, 8643, 7785, 195, 6914, 29)


def model_seeds(s: Settings) -> list[int]:
    """The seeds every (PE, σ, optimizer point) trains with: --seed-values, else the first --seeds."""
    if s.seed_values is not None:
        return list(s.seed_values)
    # beyond them 1, 2, 3, ..., skipping the authors' own (29 and 195 among them: a seed trained twice)
    beyond = (seed for seed in itertools.count(1) if seed not in AUTHOR_SEEDS)
    return list(AUTHOR_SEEDS[:s.seeds]) + list(itertools.islice(beyond, max(0, s.seeds - len(AUTHOR_SEEDS))))


def axis_values(s, axis: str, point: dict) -> tuple | list:
    """One grid axis's values at a point of the axes outside it (s: the Settings, or validation's dict of them):
    its list, [None] where the setting is not given (an optional axis) or where its row applies only with values of
    an outer axis that the point does not hold (SGD's momentum at an Adam point)."""
    def setting(name):
        return s[name] if isinstance(s, dict) else getattr(s, name)
    if setting(axis) is None:
        return [None]
    if FLAGS[axis].applies_only_with is not None:
        outer, allowed = FLAGS[axis].applies_only_with  # outer: a grid axis outside this one (test_setting_rows)
        if point[outer] not in (setting(allowed) if isinstance(allowed, str) else allowed):
            return [None]
    return setting(axis)


def grid_points(s: Settings) -> list[dict]:
    """Every point of the grid's axes (GRID_AXES: the rows marked grid_axis), the outermost axis varying slowest.
    An optional axis not given (--init-gamma) is no key of the points."""
    points = [{}]
    for axis in GRID_AXES:
        points = [{**point, axis: value} for point in points for value in axis_values(s, axis, point)]
    return [{axis: value for axis, value in point.items() if getattr(s, axis) is not None} for point in points]


def count_points(s: dict, axes: tuple[str, ...] = GRID_AXES, point: dict | None = None) -> int:
    """len(grid_points(s)), from validation's dict of the settings, without listing the points: only the values of
    an axis that an inner one applies with (the optimizers, for SGD's momentum) are gone through one by one."""
    if not axes:
        return 1
    axis, inner, point = axes[0], axes[1:], point or {}
    values = axis_values(s, axis, point)
    if any((FLAGS[other].applies_only_with or (None,))[0] == axis for other in inner):
        return sum(count_points(s, inner, {**point, axis: value}) for value in values)
    return len(values) * count_points(s, inner, point)


def expand_grid(s: Settings) -> list[dict]:
    """One entry per model: its PE kind, σ (None where the PE has none), seed and its point of the grid's axes
    (grid_points), in a stable order: PE, the axes outermost first, σ, seed (a grid whose axes hold one value each
    numbers its models as one without them)."""
    models = []
    points = grid_points(s)
    for kind in s.pe:
        for point in points:
            for sigma in (s.sigmas if kind in SIGMA_PES else [None]):
                for seed in model_seeds(s):
                    models.append(dict(model_id=len(models), pe=kind, sigma=sigma, seed=seed, **point))
    return models


def split_into_packs(models: list[dict], max_pack: int) -> list[list[dict]]:
    """Models that share an architecture (the PE kind) and an optimizer kind train together, at most max_pack at
    a time, in packs of near-equal size: 315 models with room for 301 train as 158 + 157, not as 301 + 14, whose
    small pack would run at a small pack's (host-bound) rate on a GPU. Learning rates, weight decays and momenta
    vary within a pack (pe_fast.stacked_optim)."""
    packs = []
    for kind in dict.fromkeys((m["pe"], m.get("optimizer")) for m in models):
        same = [m for m in models if (m["pe"], m.get("optimizer")) == kind]
        count = -(-len(same) // max_pack)  # integer ceilings: a max_pack of 400 digits divided to 0.0 in floats
        size = -(-len(same) // count)
        packs.extend(same[i:i + size] for i in range(0, len(same), size))
    return packs


def pack_models(s: Settings, models: list[dict]) -> list[list[dict]]:
    """The packs as config.json lists them (by model_id), or a new split for a new sweep."""
    if s.packs is not None:
        packs = [[models[i] for i in ids] for ids in s.packs]
        for index, pack in enumerate(packs):  # a pack trains one architecture with one optimizer kind
            if len({(m["pe"], m["optimizer"]) for m in pack}) > 1:
                raise UsageError(f"config.json's pack {index} mixes PE or optimizer kinds "
                                 f"({', '.join(sorted({m['pe'] for m in pack}))}); it cannot train as one pack")
        return packs
    return split_into_packs(models, s.max_pack)


def same_named(s: Settings, config_class) -> dict:
    """The settings a model's or training's configuration takes as they are: its fields named like a Settings
    field (a new flag of the same name reaches it with no line here)."""
    return {field.name: getattr(s, field.name) for field in dataclasses.fields(config_class) if field.name in FLAGS}


def model_config(s: Settings, task, kind: str) -> ModelConfig:
    return ModelConfig(**{**same_named(s, ModelConfig), "pe": kind, "pe_dropout": pe_dropout_of(s, kind)},
                       num_tokens=task.num_tokens, token_dim=task.token_dim, out_dim=task.num_classes,
                       readout_token=task.readout_token)


def train_config(s: Settings, pack: list[dict]) -> TrainConfig:
    """The pack's training: one optimizer kind, each model's own lr, weight decay and momentum; --until converged
    follows the score and fit the report's convergence test reads."""
    view = KINDS[s.task].view
    def per_model(name, default):
        return tuple(default if m.get(name) is None else m[name] for m in pack)
    return TrainConfig(**{**same_named(s, TrainConfig), "optimizer": pack[0].get("optimizer", s.optimizer[0]),
                          "lr": per_model("lr", s.lr[0]), "weight_decay": per_model("weight_decay", s.weight_decay[0]),
                          "momentum": per_model("momentum", 0.0)},
                       plateau_score=view.score, lower_is_better=lower_is_better(view.score), fit_score=view.fit)


def pack_trainer(s: Settings, task, pack: list[dict]) -> PackTrainer:
    """The trainer of one pack of models, as the sweep builds it (on --device)."""
    gammas = None if s.init_gamma is None else [m["init_gamma"] for m in pack]
    return PackTrainer(task, model_config(s, task, pack[0]["pe"]), train_config(s, pack), [m["seed"] for m in pack],
                       [m["sigma"] for m in pack], torch.device(s.device), gammas)


def _memory_terms(s: Settings, task) -> tuple[dict, int]:
    """bytes_per_model's arguments for the grid's largest model (the largest optimizer state: Adam's two moments,
    else SGD's one buffer), and the device's free bytes."""
    from pe_fast.ops.backends import resolve_backend
    device = torch.device(s.device)
    largest = next((name for name in s.optimizer if name != "sgd"), "sgd")
    attention = "triton" if s.backend == FUSED else resolve_backend(s.backend, device)
    return dict(model_config=model_config(s, task, s.pe[0]), batch_size=s.batch_size, optimizer=largest,
                backend=attention), memory.free_bytes(device)


def check_one_model_fits(s: Settings, task):
    """One UsageError naming the sizes where a single model would not fit in the device's free memory, before any
    is built (building one to count its parameters would itself fail, in a traceback)."""
    if s.device == "cuda" and not torch.cuda.is_available():
        return  # a cluster's GPU, not visible from here
    terms, free = _memory_terms(s, task)
    need = memory.bytes_per_model(**terms, params=memory.matrix_parameter_count(terms["model_config"]))
    if need > free:
        raise UsageError(f"one model needs at least {need / 2**30:,.1f} GiB in training (--width {s.width}, "
                         f"--mlp-width {s.mlp_width}, --depth {s.depth}, --batch-size {s.batch_size}), more than the "
                         f"{free / 2**30:,.1f} GiB free on {s.device}: make it smaller")


def choose_pack_size(s: Settings, task) -> int:
    """--max-pack if given, else as many models as fit in half the device's free memory (pe_fast.memory)."""
    if s.max_pack:
        return s.max_pack
    if s.device == "cuda" and not torch.cuda.is_available():
        return 64  # a Ray cluster's GPU, not visible from here: a pack size that fits any current GPU
    terms, free = _memory_terms(s, task)
    return memory.pack_size(memory.bytes_per_model(**terms, coordinates=task.coordinates), free)
