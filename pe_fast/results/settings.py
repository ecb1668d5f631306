"""The settings record of a sweep: what config.json's "settings" hold, written by the sweep and read by --resume,
the report and pooling. The sweep builds and validates it (pe_fast.sweep.settings); this module says what it is,
and migrate.py reads every older config.json as today's."""
from __future__ import annotations

import dataclasses

from pe_fast.models.absolute_pe import SINUSOIDAL_PES
from pe_fast.tasks import KINDS

# Comma-separated flags: name -> how one value is read. Each value a point of the grid, except pe_dropout_on's
# (the PE kinds the dropout applies to).
LIST_SETTINGS = {"pe": str, "sigmas": float, "lr": float, "weight_decay": float, "momentum": float,
                 "optimizer": str, "pe_dropout_on": str, "seed_values": int}
OPTIONAL_LISTS = ("seed_values",)  # None when not given; the others always have a value
# What --resume lets differ from the interrupted run: where and how it runs, never what it trains.
RUNTIME_FLAGS = ("device", "threads", "executor", "ray_address", "slurm_partition", "slurm_time", "slurm_gpus",
                 "slurm_account", "slurm_option", "slurm_local", "checkpoint_every", "no_report", "compile",
                 "tensorboard")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a sweep needs, resolved and validated. Written to config.json ("settings") and read back by
    --resume (`from_json`)."""
    task: str
    pe: tuple[str, ...]
    sigmas: tuple[float, ...]
    seeds: int  # how many; which ones: seed_values, else the first of grid.AUTHOR_SEEDS
    steps: int
    width: int
    depth: int
    heads: int
    mlp_width: int
    batch_size: int
    lr: tuple[float, ...]          # grid axes: every model trains with one value of each
    optimizer: tuple[str, ...]
    schedule: str
    warmup: int
    eval_every: int
    eval_items: int = 2048
    until: str = "budget"  # or "converged": a pack ends once its models have levelled off (train.UNTIL)
    weight_decay: tuple[float, ...] = (0.0,)
    momentum: tuple[float, ...] = (0.0,)  # SGD's; the other optimizers' models have none
    seed_values: tuple[int, ...] | None = None  # the seeds themselves (--seed-values), instead of the first --seeds
    pe_at: str = "every"
    pe_dropout: float = 0.0  # dropout on x + PE while training, for the kinds of pe_dropout_on
    pe_dropout_on: tuple[str, ...] = SINUSOIDAL_PES  # the authors': their sinusoidal modules, not their learned PE
    precision: str = "fp32"
    preset: str | None = None
    # the task's own settings (its TaskKind.settings: data, network, masking ...) by name; s.NAME reads them too
    task_settings: dict = dataclasses.field(default_factory=dict)
    # where and how it runs (RESUME_FLAGS may change these)
    out: str | None = None
    device: str = "cpu"
    threads: int | None = None
    backend: str | None = None
    max_pack: int | None = None
    checkpoint_every: int | None = None
    executor: str = "local"
    ray_address: str | None = None
    slurm_partition: str | None = None
    slurm_time: int = 60  # minutes per job; a pack that needs longer is requeued and continues
    slurm_gpus: int | None = None  # per job; None: 1 with --device cuda, else 0
    slurm_account: str | None = None
    slurm_option: tuple[str, ...] = ()  # extra sbatch options, KEY=VALUE
    slurm_local: bool = False  # submitit's local executor instead of SLURM, to try the path on one machine
    compile: str = "off"
    no_report: bool = False
    tensorboard: bool = False
    # the packs, by model_id: planned at the start of a sweep, read from config.json on --resume
    packs: tuple[tuple[int, ...], ...] | None = None

    def __getattr__(self, name: str):
        """A task's own setting (s.atlas, s.nodes ...); only called where no field has the name."""
        task_settings = self.__dict__.get("task_settings") or {}
        if name in task_settings:
            return task_settings[name]
        raise AttributeError(f"the settings of --task {self.__dict__.get('task')} have no {name!r}")

    def flat(self) -> dict:
        """Every setting by name, the task's own in task_settings' place: as config.json lists them."""
        out = {}
        for field in dataclasses.fields(self):
            if field.name == "task_settings":
                out.update(self.task_settings)
            else:
                out[field.name] = getattr(self, field.name)
        return out

    @classmethod
    def from_flat(cls, s: dict) -> "Settings":
        """The record of a dict of every setting by name (the task's own among them, else their defaults), as
        flat() gives it."""
        own = KINDS[s["task"]].settings
        names = {setting.name for setting in own}
        return cls(**{name: value for name, value in s.items() if name not in names},
                   task_settings={setting.name: s.get(setting.name, setting.default) for setting in own})

    def to_json(self) -> dict:
        """The settings as config.json holds them (the packs are written beside them)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.flat().items() if k != "packs"}

    @classmethod
    def from_json(cls, settings: dict, packs) -> "Settings":
        """config.json's settings as this pe_fast writes them (migrate.settings reads older ones so), unvalidated:
        how the report reads a folder. --resume validates them too."""
        fields = dict(settings)
        for name in LIST_SETTINGS:
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
        return cls.from_flat({**fields, "packs": tuple(tuple(pack) for pack in packs)})


def pe_dropout_of(s: Settings, kind: str) -> float:
    """The dropout on x + PE that the models of this PE kind train with."""
    return s.pe_dropout if kind in s.pe_dropout_on else 0.0
