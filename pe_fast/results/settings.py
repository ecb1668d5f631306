"""The settings record of a sweep: what config.json's "settings" hold, written by the sweep and read by --resume,
the report and pooling. The sweep builds and validates it (pe_fast.sweep.settings); this module says what it is,
and migrate.py reads every older config.json as today's."""
from __future__ import annotations

import dataclasses
import math
import numbers
import re
import types
import typing
from collections.abc import Callable

import numpy as np

from pe_fast.models import PE_KINDS
from pe_fast.models.transformer import MAX_INIT_GAMMA, MAX_SIGMA, MIN_SIGMA
from pe_fast.models.absolute_pe import ADDITIVE_PES, SIGMA_PES, SINUSOIDAL_PES
from pe_fast.precision import PRECISIONS
from pe_fast.program_exit import brief, control_character
from pe_fast.tasks import KINDS
from pe_fast.train import COMPILE_MODES, OPTIMIZERS, SCHEDULES, UNTIL

# Sizes beyond any model of this study (the paper's d = 160, MLP 640, 4 blocks): a typo is one line, not a failed
# allocation; at MAX_WIDTH one model's QKV weights alone would take 51 GB.
MAX_MODELS = 100_000  # a grid larger than this is a typo, not a sweep
MAX_BATCH_SIZE = 2**24  # items a step per model: more is no training set's (and its memory estimate overflowed)
MAX_STEPS = 10**8     # 400 times the paper's 256k steps: more cannot finish (nor a warm-up, an evaluation
                      # or a checkpoint period longer)
MAX_THREADS = 1024    # per Ray or SLURM worker; a sweep on this machine gets at most its cores
MAX_SLURM_GPUS = 16   # per job, the most a node holds; a pack trains on one
MAX_SLURM_MINUTES = 365 * 24 * 60  # per job: SLURM clusters cap jobs at days, none at a year
MAX_WIDTH = 2**16
MAX_MLP_WIDTH = 4 * MAX_WIDTH  # the default MLP width of the widest model
MAX_DEPTH = 1000
# the tangent kernel's probe items: each costs a forward and 4 backwards per evaluation, and 4 gradients' memory
MAX_NTK_ITEMS = 256
# float32's smallest normal number: the optimizers step in float32, where a smaller rate is 0 (a run that trains
# nothing, silently)
MIN_LR = float(np.finfo(np.float32).tiny)
# the largest finite float32: a sweep computes in float32 at most, and every float setting is stored (results.parquet's
# columns, the models' numbers) as float32, where a larger value is infinite
FLOAT32_MAX = float(np.finfo(np.float32).max)

# the values of the settings that have a fixed set
EXECUTORS = ("local", "ray", "slurm")
COMPILE_CHOICES = ("auto", *COMPILE_MODES)
DEVICES = ("auto", "cpu", "cuda")
PE_AT = ("every", "input")

KEEP = object()  # Flag.new_sweep: a new sweep starts from the field's default


@dataclasses.dataclass(frozen=True)
class Flag:
    """Everything about one setting but its type and default (the Settings field's): its flag --NAME-WITH-DASHES
    and its rules. The sweep's parser, its validation, --resume, config.json and pooling all read them from here;
    a task's own settings have the same shape (tasks.base.TaskSetting). A tuple field is a comma-separated flag, a
    bool one an on/off flag."""
    help: str | None = None
    # the values allowed (None among them where it means "chosen later"), or a function of the task's TaskKind
    choices: tuple | Callable | None = None
    choices_in_parser: bool = True  # argparse refuses other values; False: validation does, in its own words
    range: tuple | None = None      # (lowest, highest or None, which ends belong: "[]", "[)", "()")
    runtime: bool = False           # where and how it runs: --resume may change it, pooled folders may differ in it
    may_differ: bool = False        # folders pooled as one run may differ in it (which models, how often evaluated)
    # the setting it depends on and the values under which it means something (or the setting that lists them)
    applies_only_with: tuple | None = None
    executor: str | None = None     # the executor whose flag it is (--executor NAME only)
    # a grid axis: every model trains with one value of the list. The number is its place in the grid's nesting,
    # outermost first, which orders and numbers the models (model_id, and so config.json's packs): not the row's
    # place among the fields, which only orders config.json and --help. An axis that applies only with values of
    # another (applies_only_with) nests inside that one, and its models elsewhere have None.
    grid_axis: int | None = None
    new_sweep: object = KEEP        # a new sweep's value where no task default, preset or flag gives one
    metavar: str | None = None
    repeatable: bool = False        # given once per value (--slurm-option)


def setting(default=dataclasses.MISSING, **flag) -> dataclasses.Field:
    """A field of Settings and its flag's row."""
    return dataclasses.field(default=default, metadata={"flag": Flag(**flag)})


def backend_choices(kind) -> tuple:
    from pe_fast.models.transformer import compute_paths  # the ops load the compiled kernels: only when asked
    return (None, *compute_paths())


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a sweep needs, resolved and validated: one field per setting, each field one row with its flag
    (setting(): help, choices, range, and what --resume and pooling may change). Written to config.json
    ("settings") in this order and read back by --resume (`from_json`). The task's defaults fill the fields
    without one."""
    task: str = setting(choices=lambda kind: tuple(KINDS),  # as registered
                        help="the task: fmri (the default), lst, netsim, digits or digits_class")
    pe: tuple[str, ...] = setting(choices=lambda kind: kind.pe_kinds, may_differ=True,
                                  help=f"comma-separated PE kinds: {', '.join(PE_KINDS)}")
    sigmas: tuple[float, ...] = setting(
        may_differ=True, applies_only_with=("pe", SIGMA_PES),
        help="comma-separated σ of the learned and random PEs' N(0, σ²) initialisation")
    # how many; which ones: seed_values, else the first of grid.AUTHOR_SEEDS
    seeds: int = setting(range=(1, MAX_MODELS, "[]"), may_differ=True,
                         help="number of seeds per (PE, σ): the first N of the authors' 15 LST seeds, then 1, 2, "
                              "3, ... (theirs skipped)")
    steps: int = setting(range=(1, MAX_STEPS, "[]"), help="training steps")
    width: int = setting(range=(1, MAX_WIDTH, "[]"), help="model width d")
    depth: int = setting(range=(1, MAX_DEPTH, "[]"), help="number of blocks")
    heads: int = setting(range=(1, None, "[)"))
    mlp_width: int = setting(range=(1, MAX_MLP_WIDTH, "[]"), new_sweep=None,  # None: 4·width
                             help="MLP hidden width (default 4·width)")
    batch_size: int = setting(range=(1, MAX_BATCH_SIZE, "[]"))
    # grid axes (grid_axis=N): every model trains with one value of each
    lr: tuple[float, ...] = setting(range=(MIN_LR, None, "[)"), grid_axis=2,
                                    help="learning rate; a comma-separated list is a grid axis")
    optimizer: tuple[str, ...] = setting(
        choices=OPTIMIZERS, grid_axis=1, help=f"{', '.join(OPTIMIZERS)}; a comma-separated list is a grid axis")
    schedule: str = setting(choices=SCHEDULES)
    warmup: int = setting(range=(0, MAX_STEPS, "[]"), help="linear warm-up steps")
    eval_every: int = setting(range=(1, MAX_STEPS, "[]"), may_differ=True,
                              help="evaluate every this many steps")
    eval_items: int = setting(
        2048, range=(1, None, "[)"),
        help="intermediate evaluations score at most this many items of the splits other than the held-out one the "
             "convergence check follows (always in full); the last scores all")
    # 0 in records from before the tangent kernel: their runs did not measure it
    ntk_items: int = setting(
        0, range=(0, MAX_NTK_ITEMS, "[]"), new_sweep=8,
        help="probe items of the empirical tangent kernel measured at every evaluation (kernel distance, velocity, "
             "target alignment); 0: not measured (default 8)")
    # or "converged": a pack ends once its models have levelled off (train.UNTIL)
    until: str = setting(
        "budget", choices=UNTIL,
        help="converged (the fmri and netsim default): end a pack at the first evaluation where every model's score "
             "gained at most 0.01 over the last quarter of its steps (the report's convergence test) and, for the "
             "LST, it fits its training set, or at --steps; budget: train --steps")
    weight_decay: tuple[float, ...] = setting((0.0,), range=(0, None, "[)"), grid_axis=3,
                                              help="weight decay; a comma-separated list is a grid axis")
    # SGD's; the other optimizers' models have none
    momentum: tuple[float, ...] = setting((0.0,), range=(0, 1, "[)"), applies_only_with=("optimizer", ("sgd",)),
                                          grid_axis=4, help="SGD momentum; a comma-separated list is a grid axis")
    # None: the layers' own initialisation (nn.Linear's, Xavier's for QKV); the PE keeps σ; the models of a sweep
    # without it carry no init_gamma
    init_gamma: tuple[float, ...] | None = setting(
        None, range=(0, MAX_INIT_GAMMA, "[]"), metavar="GAMMAS", grid_axis=5,
        help="initialisation scale: the embedding, attention and MLP weights start with std fan_in^-γ (Zhang et al. "
             "2024); a comma-separated list is a grid axis (default: the layers' own initialisation)")
    # the seeds themselves, instead of the first --seeds
    seed_values: tuple[int, ...] | None = setting(
        None, range=(0, 2**32, "[)"), may_differ=True, metavar="SEEDS",  # plus its stream offsets: still a torch seed
        help="comma-separated seeds per (PE, σ) instead of --seeds, e.g. 6068 to add the third seed of an earlier "
             "--seeds 2 run")
    # a rotary PE turns q and k in every block whatever it says
    pe_at: str = setting("every", choices=PE_AT, applies_only_with=("pe", ADDITIVE_PES + ("relative",)),
                         help="add the PE at every block or at the input only")
    # dropout on x + PE while training, for the kinds of pe_dropout_on
    pe_dropout: float = setting(0.0, range=(0, 1, "[)"), may_differ=True, applies_only_with=("pe", "pe_dropout_on"),
                                help="dropout probability on x + PE at each block while training, for the PE kinds "
                                     "of --pe-dropout-on (default 0)")
    # the authors': their sinusoidal modules, not their learned PE
    pe_dropout_on: tuple[str, ...] = setting(
        SINUSOIDAL_PES, may_differ=True, metavar="KINDS",
        help=f"comma-separated PE kinds that --pe-dropout applies to, of {', '.join(ADDITIVE_PES)} "
             f"(default {','.join(SINUSOIDAL_PES)}: the authors' code drops out its sinusoidal PEs only)")
    precision: str = setting(
        "fp32", choices=(None, *PRECISIONS), new_sweep=None,  # None: the device's default (runtime.resolve)
        help="fp32 (default), tf32 (CUDA), bf16 or fp16 (autocast, float32 weights; fp16 with one dynamic loss "
             "scale per model)")
    preset: str | None = setting(None, choices=lambda kind: (None, *kind.presets), may_differ=True,
                                 help="a named configuration of the task; explicit flags win")
    # the task's own settings (its TaskKind.settings: data, network, masking ...) by name; s.NAME reads them too
    task_settings: dict = dataclasses.field(default_factory=dict)
    # where and how it runs
    out: str | None = setting(None, may_differ=True,
                              help="results folder (must not hold results yet); default runs/<task>-<time>")
    device: str = setting("cpu", choices=DEVICES, choices_in_parser=False, runtime=True, new_sweep="auto",
                          help="cpu, cuda or auto")
    threads: int | None = setting(None, range=(1, MAX_THREADS, "[]"), runtime=True,
                                  help="CPU threads for torch (default: all cores)")
    backend: str | None = setting(
        None, choices=backend_choices, choices_in_parser=False, may_differ=True,
        help="the models' compute path: a pe_attention backend (reference, cpp, triton) or fused (Triton "
             "sublayers; experimental, slower than triton on a GPU: docs/kernels.md); default: the fastest on the "
             "device")
    max_pack: int | None = setting(None, range=(1, None, "[)"), may_differ=True,
                                   help="models trained together (default: as many as fit in half the free memory)")
    checkpoint_every: int | None = setting(
        None, range=(1, MAX_STEPS, "[]"), runtime=True,
        help="save each pack's training state every this many steps (default: every evaluation)")
    executor: str = setting("local", choices=EXECUTORS, runtime=True,
                            help="local (default): packs one after the other here; ray: packs as Ray tasks")
    ray_address: str | None = setting(
        None, executor="ray", runtime=True,
        help="--executor ray: the cluster to join (e.g. auto); default: a local Ray instance")
    slurm_partition: str | None = setting(None, executor="slurm", runtime=True,
                                          help="--executor slurm: the partition to submit to")
    # minutes per job; a pack that needs longer is requeued and continues
    slurm_time: int = setting(60, range=(1, MAX_SLURM_MINUTES, "[]"), executor="slurm", runtime=True,
                              help="--executor slurm: minutes per job (default 60); a pack that needs longer is "
                                   "requeued and continues from its checkpoint")
    # per job; None: 1 with --device cuda, else 0
    slurm_gpus: int | None = setting(None, range=(0, MAX_SLURM_GPUS, "[]"), executor="slurm", runtime=True,
                                     help="--executor slurm: GPUs per job (default: 1 with --device cuda)")
    slurm_account: str | None = setting(None, executor="slurm", runtime=True,
                                        help="--executor slurm: the account to charge")
    # extra sbatch options, KEY=VALUE
    slurm_option: tuple[str, ...] = setting(
        (), executor="slurm", runtime=True, repeatable=True, metavar="KEY=VALUE",
        help="--executor slurm: an extra sbatch option, e.g. qos=short or constraint=a100 (repeatable)")
    # submitit's local executor instead of SLURM, to try the path on one machine
    slurm_local: bool = setting(
        False, executor="slurm", runtime=True,
        help="--executor slurm: run the jobs with submitit's local executor instead (no SLURM needed)")
    compile: str = setting(
        "off", choices=COMPILE_CHOICES, runtime=True, new_sweep="auto",
        help="torch.compile the training step (about 20 s per pack on a GPU); graphs: compiled and replayed as CUDA "
             "graphs (CUDA only); auto (default): on on CUDA, off elsewhere")
    no_report: bool = setting(
        False, runtime=True,
        help="skip report.md and the figures at the end (python -m pe_fast.report DIR writes them)")
    no_weights: bool = setting(
        False, runtime=True,
        help="do not keep the trained models (by default each finished pack writes them to "
             "DIR/packs/<i>/weights.safetensors, for pe_fast.load_run(DIR).model(i))")
    tensorboard: bool = setting(
        False, runtime=True,
        help="write every evaluation to DIR/tensorboard as it happens (tensorboard --logdir DIR/tensorboard)")
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

    def trained_with(self) -> dict:
        """What a pack's training depends on (trained_with of the settings as config.json holds them)."""
        return trained_with(self.to_json())

    @classmethod
    def from_json(cls, settings: dict, packs) -> "Settings":
        """config.json's settings as this pe_fast writes them (migrate.settings reads older ones so), unvalidated:
        how the report reads a folder. --resume validates them too."""
        fields = dict(settings)
        for name in LIST_SETTINGS:
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
        return cls.from_flat({**fields, "packs": tuple(tuple(pack) for pack in packs)})


# ---- what the rows say, as the parser, validation, --resume and pooling ask it ----

FLAGS: dict[str, Flag] = {field.name: field.metadata["flag"] for field in dataclasses.fields(Settings)
                          if "flag" in field.metadata}
HINTS = typing.get_type_hints(Settings)
# how and where a sweep runs (--resume may change them), the folder's name, and the preset's (its values are the
# other settings'): no pack's training depends on them
NOT_TRAINING = frozenset({"out", "preset", *(name for name, flag in FLAGS.items() if flag.runtime)})


def trained_with(record: dict) -> dict:
    """What a pack's training depends on, of config.json's settings: every one but NOT_TRAINING. Recorded with each
    checkpoint and finished pack, so that a config.json edited since is found out."""
    return {name: list(value) if isinstance(value, tuple) else value  # lists, as JSON reads them back
            for name, value in record.items() if name not in NOT_TRAINING}


def value_type(name: str) -> type:
    """The type of one value of a setting: of each item of a list, without the None an optional one allows."""
    hint = HINTS[name]
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        hint = next(option for option in typing.get_args(hint) if option is not type(None))
    return typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else hint


def is_list(name: str) -> bool:
    hint = HINTS[name]
    options = typing.get_args(hint) if typing.get_origin(hint) in (types.UnionType, typing.Union) else (hint,)
    return any(typing.get_origin(option) is tuple for option in options)


def default_of(name: str):
    """The field's default (dataclasses.MISSING where the task's defaults give it)."""
    return next(field.default for field in dataclasses.fields(Settings) if field.name == name)


# Comma-separated flags: name -> how one value is read. Each value a point of the grid, except pe_dropout_on's
# (the PE kinds the dropout applies to) and slurm_option's (given once per value).
LIST_SETTINGS = {name: value_type(name) for name, flag in FLAGS.items() if is_list(name) and not flag.repeatable}
OPTIONAL_LISTS = tuple(name for name in LIST_SETTINGS if default_of(name) is None)  # None when not given
# What --resume lets differ from the interrupted run: where and how it runs, never what it trains.
RUNTIME_FLAGS = tuple(name for name, flag in FLAGS.items() if flag.runtime)
# flag -> the executor it belongs to
EXECUTOR_FLAGS = {name: flag.executor for name, flag in FLAGS.items() if flag.executor}
# The grid's axes besides PE, σ and seed, outermost first (grid.expand_grid nests them so; the summaries keep apart
# the models that differ in any of them)
GRID_AXES = tuple(sorted((name for name, flag in FLAGS.items() if flag.grid_axis is not None),
                         key=lambda name: FLAGS[name].grid_axis))


def pe_dropout_of(s: Settings | dict, kind: str) -> float:
    """The dropout on x + PE that the models of this PE kind train with (s: the Settings, or config.json's)."""
    dropout, on = (s["pe_dropout"], s["pe_dropout_on"]) if isinstance(s, dict) else (s.pe_dropout, s.pe_dropout_on)
    return dropout if kind in on else 0.0


class SettingError(ValueError):
    """A setting not of the type Settings declares, or outside its range; the message names it as its flag."""


def check_types(s: dict, complete: bool = True):
    """Each setting of the type Settings declares (a list for a tuple), in place: flags, config.json and Python
    callers can hold anything. complete (the sweep's settings): a setting missing from an older config.json takes
    its default, one without a default is refused; else (a folder the report reads, whose config.json may hold
    some settings only) the settings present are checked."""
    hints = typing.get_type_hints(Settings)
    for field in dataclasses.fields(Settings):
        if field.name in ("packs", "task_settings") or (field.name not in s and not complete):
            continue
        if field.name not in s:
            if field.default is dataclasses.MISSING:
                raise SettingError(f"--{field.name.replace('_', '-')} is missing")
            s[field.name] = field.default
        if not (field.name == "precision" and s[field.name] is None):  # None: the device's default, chosen later
            s[field.name] = conform(field.name, s[field.name], hints[field.name])
    if "task" not in s:
        return
    check_task(s["task"])
    for setting in KINDS[s["task"]].settings:  # the task's own: of their declared type, or None
        if setting.name in s or complete:
            s[setting.name] = conform(setting.name, s.get(setting.name, setting.default), setting.type | None)


def check_task(task):
    if not isinstance(task, str) or task not in KINDS:  # a Python caller's list would not even hash
        raise SettingError(f"--task {brief(task)}: choose from {', '.join(KINDS)}")


def conform(name: str, value, hint):
    """value as the type hint says (ints as floats where floats are asked for, lists as tuples), or
    SettingError."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        if value is None:
            return None
        hint = next(option for option in typing.get_args(hint) if option is not type(None))
    if typing.get_origin(hint) is tuple:
        # a Python caller's range or 1-d numpy array is a list too
        if isinstance(value, np.ndarray) and value.ndim == 1:
            value = value.tolist()
        if not isinstance(value, (list, tuple, range)):
            raise SettingError(f"--{name.replace('_', '-')}: expected a list, got {brief(value)}")
        if not len(value) and name in LIST_SETTINGS:  # a grid axis of no value: a grid of no model
            raise SettingError(f"--{name.replace('_', '-')}: empty list")
        return tuple(conform(name, item, typing.get_args(hint)[0]) for item in value)
    # numpy's scalars are numbers (numbers.Integral, numbers.Real) as Python's are; a bool is not a number here
    boolean = isinstance(value, (bool, np.bool_))
    number = isinstance(value, numbers.Real) and not boolean
    if hint is float and number:
        if not math.isfinite(value):  # JSON's 1e400 reads as inf: no setting takes an infinite or NaN value
            raise SettingError(f"--{name.replace('_', '-')} must be finite, got {value!r}")
        # the results store it as float32, where it would be infinite (compared as a Python float: a float16
        # compared with float32's largest cast that to inf, with numpy's warning)
        if abs(float(value)) > FLOAT32_MAX:
            raise SettingError(f"--{name.replace('_', '-')} {float(value):g} lies beyond float32's range "
                               f"(±{FLOAT32_MAX:.8g}), in which the results store it")
        return float(value)
    if hint is int and number and isinstance(value, numbers.Integral):
        return int(value)
    if (hint is bool and boolean) or (hint is str and isinstance(value, str)):
        return hint(value)
    raise SettingError(f"--{name.replace('_', '-')}: expected {hint.__name__}, got {brief(value)}")


def check_ranges(s: dict):
    """Every numeric setting present finite and in its row's range (Flag.range, a task setting's range), every σ in
    [MIN_SIGMA, MAX_SIGMA]: the sweep's flags, a resumed config.json and a folder the report reads, alike."""
    ranges = {name: flag.range for name, flag in FLAGS.items() if flag.range}
    if s.get("task") in KINDS:
        ranges.update({setting.name: setting.range for setting in KINDS[s["task"]].settings if setting.range})
    for name, (low, high, ends) in ranges.items():
        values = s.get(name)
        for value in values if isinstance(values, (tuple, list)) else (values,):
            if value is not None:
                check_range(name, value, low, high, ends)
    # the optimizers and PE dropout compute in float32: a value that rounds to a refused or neutral one there
    for value in s.get("momentum") or ():
        if math.isfinite(value) and np.float32(value) >= 1:
            raise SettingError(f"--momentum {value!r} is 1 in float32, in which the optimizer steps: give at most "
                               f"{float(np.nextafter(np.float32(1), np.float32(0))):.9g}")
    for value in s.get("weight_decay") or ():
        if 0 < value < MIN_LR:
            raise SettingError(f"--weight-decay {value!r} is 0 in float32, in which the optimizer steps: give 0 or "
                               f"at least {MIN_LR:.3g}")
    dropout = s.get("pe_dropout")
    if isinstance(dropout, float) and 0 < dropout and np.float32(1) - np.float32(dropout) == 1:
        raise SettingError(f"--pe-dropout {dropout!r} keeps every value in float32 (1 − p is 1): give 0 or at least "
                           f"1e-7")
    sigmas = s.get("sigmas") or ()
    if any(not (math.isfinite(v) and MIN_SIGMA <= v <= MAX_SIGMA) for v in sigmas):
        raise SettingError(f"--sigmas: every σ must be a number in [{MIN_SIGMA:g}, {MAX_SIGMA:g}] (the PE is "
                           f"float32), got {list(sigmas)}")


def check_choices(s: dict):
    """Each setting present with a fixed set of values holds one of them, a list names each value once, and the
    width splits into the heads: the sweep's flags, a resumed config.json and a folder the report reads, alike."""
    check_task(s["task"])
    kind = KINDS[s["task"]]
    choices = {**{name: flag.choices(kind) if callable(flag.choices) else flag.choices
                  for name, flag in FLAGS.items() if flag.choices is not None and name != "task"},
               **{setting.name: setting.choices for setting in kind.settings if setting.choices}}
    for name, allowed in choices.items():
        if name not in s:
            continue
        for value in s[name] if isinstance(s[name], (tuple, list)) else (s[name],):
            if value not in allowed:
                what = {"pe": f"a PE of --task {s['task']}", "preset": f"a preset of --task {s['task']}"}
                raise SettingError(f"--{name.replace('_', '-')} {brief(value)} is not {what.get(name, 'one of them')}; "
                                   f"choose from {', '.join(str(a) for a in allowed if a is not None)}")
    for name in LIST_SETTINGS:
        values = s.get(name)
        if values is not None and len(set(values)) < len(values):
            raise SettingError(f"--{name.replace('_', '-')}: {','.join(map(str, values))} names a value twice")
    width, heads = s.get("width"), s.get("heads")
    if isinstance(width, int) and isinstance(heads, int) and heads > 0 and width % heads:
        raise SettingError(f"--width {s['width']} must be divisible by --heads {s['heads']}")


def check_text(s: dict):
    """No setting's text holds a line break or another control character (the values reach job scripts, file
    names, one-line messages and report.md) or bytes that are not UTF-8 text."""
    for name, value in s.items():
        for text in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(text, str) and control_character(text):
                raise SettingError(f"--{name.replace('_', '-')} {text!r}: holds a control character (a line break?)")
            if isinstance(text, str) and not text.isascii():
                try:  # config.json and the parquet files record it as UTF-8
                    text.encode("utf-8")
                except UnicodeEncodeError:  # a file name's bytes that are not UTF-8 text, as os.fsdecode keeps them
                    raise SettingError(f"--{name.replace('_', '-')} {text!r}: holds bytes that are not UTF-8 text; "
                                       f"rename it") from None


def check_task_rules(s: dict, given: frozenset[str] = frozenset()):
    """The task's own rules across its settings (TaskKind.check: netsim's simulation size, fmri's --data with its
    --regions), the task's settings missing from an older record taken at their defaults. given: the flags a user
    gave (none for a record)."""
    kind = KINDS[s["task"]]
    if (problem := kind.check({**{t.name: t.default for t in kind.settings}, **s}, set(given))) is not None:
        raise SettingError(problem)


# what an sbatch directive's value may hold: no spaces, quotes or characters a shell or a new line would read
# ASCII: \w alone matches any Unicode letter (qös), which no sbatch option, partition or account name holds
SLURM_VALUE = re.compile(r"[\w.,:@%+=/|&*\[\]-]+", re.ASCII)
SLURM_KEY = re.compile(r"[A-Za-z][\w-]*", re.ASCII)
# the sbatch options slurm_executor sets (through submitit), with the flag that sets each ("": none, it is fixed)
SLURM_SET_BY_PE_FAST = {"time": "--slurm-time", "partition": "--slurm-partition", "account": "--slurm-account",
                        "cpus-per-task": "--threads", "gpus-per-node": "--slurm-gpus", "gpus": "--slurm-gpus",
                        "gres": "--slurm-gpus", "job-name": "", "signal": "", "output": "", "error": "",
                        "array": "", "open-mode": "", "requeue": "", "nodes": "", "ntasks-per-node": ""}
SLURM_ALLOWED = "letters, digits and .,:@%+=/|&*[]-_ only (it becomes a line of the job script)"


def check_executor_flags(s: dict):
    """An executor's flags belong to it (--ray-address to --executor ray ...), and SLURM's values become lines of
    a job script."""
    for name, executor in EXECUTOR_FLAGS.items():
        if s.get(name) not in (None, False, "", (), [], default_of(name)) and s["executor"] != executor:
            raise SettingError(f"--{name.replace('_', '-')} applies to --executor {executor} only")
    if s["executor"] != "slurm":
        return
    options = s.get("slurm_option") or ()
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key.strip():
            raise SettingError(f"--slurm-option {option!r}: expected KEY=VALUE, e.g. qos=short")
        if not (SLURM_KEY.fullmatch(key) and SLURM_VALUE.fullmatch(value)):
            raise SettingError(f"--slurm-option {option!r}: KEY=VALUE of {SLURM_ALLOWED}")
        if (owner := SLURM_SET_BY_PE_FAST.get(key.lower().replace("_", "-"))) is not None:
            raise SettingError(f"--slurm-option {option!r}: pe_fast sets {key} itself"
                             + (f"; give {owner} instead" if owner else ""))
    for name in ("slurm_partition", "slurm_account"):
        if s.get(name) is not None and not SLURM_VALUE.fullmatch(s[name]):
            raise SettingError(f"--{name.replace('_', '-')} {s[name]!r}: {SLURM_ALLOWED}")
    s["slurm_option"] = tuple(options)


def check_range(name: str, value: float, low: float, high: float | None, ends: str):
    above = value >= low if ends[0] == "[" else value > low
    below = high is None or (value <= high if ends[1] == "]" else value < high)
    # math.isfinite of an int beyond float's range raises OverflowError: an int is finite
    if not ((isinstance(value, int) or math.isfinite(value)) and above and below):
        allowed = f"{'≥' if ends[0] == '[' else '>'} {low:,}"
        allowed += "" if high is None else f" and {'≤' if ends[1] == ']' else '<'} {high:,}"
        raise SettingError(f"--{name.replace('_', '-')} must be finite and {allowed}, got {shown(value)}")


def shown(value) -> str:
    """A value for a message: an int of hundreds of digits by its first ones and its length."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}… ({len(text)} digits)"


def check_packs(packs, models: int | None = None) -> tuple[tuple[int, ...], ...]:
    """config.json's packs: lists of model ids, none empty, each id once (and, given the grid's size, every id of
    the grid)."""
    packs = conform("packs", packs, tuple[tuple[int, ...], ...])
    ids = sorted(i for pack in packs for i in pack)
    distinct = len(set(ids)) == len(ids) and all(i >= 0 for i in ids)
    complete = models is None or ids == list(range(models))
    if not (all(packs) and distinct and complete):
        held = f"the grid's {models} models" if models is not None else "model ids ≥ 0"
        raise SettingError(f"packs: {[list(p) for p in packs][:4]}... do not hold {held} once each, in packs "
                           f"none empty")
    return packs
