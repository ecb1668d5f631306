"""The rules every sweep setting must satisfy, in one place, whatever the settings' source: the flags
(settings.from_flags), a resumed config.json (resume.from_resume) or a Python caller. A broken rule is a
UsageError naming the setting as its flag, before anything is read or written; what the machine offers is checked
last, by runtime.resolve."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from pe_fast.models.absolute_pe import ADDITIVE_PES, SIGMA_PES
from pe_fast.results import settings as results_settings
from pe_fast.results.settings import FLAGS, MAX_MODELS, Settings
from pe_fast.sweep import UsageError, grid, runtime
from pe_fast.tasks import KINDS
from pe_fast.tasks.base import TaskSetting


def validate(s: dict, args: argparse.Namespace | None = None, packs=None) -> Settings:
    """Every rule of a sweep's settings, the same whatever their source: the flags (args, to tell what the user
    gave), a resumed config.json (with its packs) or a Python caller. Nothing has been read or written yet; a
    broken rule is a UsageError naming the setting as its flag."""
    check_types(s)
    check_backend_loaded(s.get("backend"))
    check_choices(s)
    check_text(s)
    check_ranges(s, args)
    models = check_grid(s)
    kind = KINDS[s["task"]]
    given = {name for name, value in vars(args).items() if value is not None and value is not False} if args else set()
    for flag in dict.fromkeys(f for other in KINDS.values() for f in other.flags):
        if flag not in kind.flags and flag in given:
            raise another_tasks(flag)
    as_usage_error(results_settings.check_task_rules, s, given)
    check_executor_flags(s)
    for setting in kind.settings:
        if setting.files and s.get(setting.name) is not None:
            # absolute, so that a resume from elsewhere or a Ray worker finds them
            s[setting.name] = resolve_paths(s[setting.name], setting)
    if packs is not None:
        s["packs"] = check_packs(packs, models)
    runtime.resolve(s)  # last: it probes the machine (and makes and removes a folder in $TORCHINDUCTOR_CACHE_DIR)
    return Settings.from_flat(s)


def another_tasks(flag: str) -> UsageError:
    """The error for a task's own flag given with another task."""
    owners = " and ".join(name for name, other in KINDS.items() if flag in other.flags)
    return UsageError(f"--{flag.replace('_', '-')} applies to --task {owners} only")


# ---- each setting of its type, choices, text and range ----


def check_types(s: dict):
    """Each setting of its declared type (results.settings.check_types), or UsageError."""
    as_usage_error(results_settings.check_types, s)


def conform(name: str, value, hint):
    """value as the type hint says (results.settings.conform), or UsageError."""
    return as_usage_error(results_settings.conform, name, value, hint)


def as_usage_error(rule, *args):
    """rule(*args), its SettingError (the results layer's, which knows no UsageError) a UsageError."""
    try:
        return rule(*args)
    except results_settings.SettingError as error:
        raise UsageError(str(error)) from None


def check_backend_loaded(backend: str | None):
    """A backend of pe_fast's whose kernels did not load is named with why (it was "not one of them")."""
    from pe_fast.ops.backends import UNAVAILABLE  # the ops load the compiled kernels: only when asked
    if backend in UNAVAILABLE:
        runtime.check_kernels()  # $PE_FAST_KERNELS named a build that did not load: that variable is the cause
        raise UsageError(f"--backend {backend} is not available here: {UNAVAILABLE[backend][1]}")


def check_task(task):
    as_usage_error(results_settings.check_task, task)


def check_choices(s: dict):
    """Each setting with a fixed set of values holds one of them (the task first: the others depend on it), and
    the width splits into the heads (results.settings.check_choices), or UsageError."""
    as_usage_error(results_settings.check_choices, s)


def check_text(s: dict):
    """No setting's text holds a control character or bytes that are not UTF-8 (results.settings.check_text), or
    UsageError."""
    as_usage_error(results_settings.check_text, s)


def check_grid(s: dict) -> int:
    """The grid's size, within MAX_MODELS; --seeds counts --seed-values where those are given."""
    if s["seed_values"] is not None and s["seeds"] != len(s["seed_values"]):
        raise UsageError(f"--seeds {s['seeds']} does not count --seed-values {','.join(map(str, s['seed_values']))}")
    optimizers, decays = tuple(s.get("optimizer") or ()), s.get("weight_decay")
    if {"adam", "adamw"} <= set(optimizers) and (decays is None or 0 in decays):
        # AdamW decays decoupled, Adam through the gradient: without decay both are Adam, bit for bit
        raise UsageError(f"--optimizer {','.join(optimizers)} with a --weight-decay of 0: AdamW without decay is "
                         f"Adam, so each such model would train twice; drop one of them or give only non-zero "
                         f"decays")
    # expand_grid's models: PE (σ where it has one) × the points of the grid's axes × seeds
    models = (s["seeds"] * sum(len(s["sigmas"]) if pe in SIGMA_PES else 1 for pe in s["pe"])
              * grid.count_points(s))
    if models > MAX_MODELS:
        raise UsageError(f"--seeds {s['seeds']}: the grid would hold {models:,} models; at most {MAX_MODELS:,}")
    return models


def check_packs(packs, models: int) -> tuple[tuple[int, ...], ...]:
    """config.json's packs hold every model id of the grid exactly once."""
    return as_usage_error(results_settings.check_packs, packs, models)


def check_ranges(s: dict, args: argparse.Namespace | None = None):
    """Every numeric setting finite and in its range; a flag given for a setting that ignores it is refused."""
    as_usage_error(results_settings.check_ranges, s)
    if args is not None and args.warmup is not None and s["warmup"] >= s["steps"]:  # a task's or preset's: kept
        raise UsageError(f"--warmup {s['warmup']} is not below --steps {s['steps']}: the learning rate would never "
                         f"reach --lr; give a --warmup below --steps")
    check_pe_dropout_on(s, args)
    for flag, (setting, values) in ((name, row.applies_only_with) for name, row in FLAGS.items()
                                    if row.applies_only_with):
        values = s[values] if isinstance(values, str) else values
        chosen = s[setting] if isinstance(s[setting], (tuple, list)) else (s[setting],)
        if args is not None:
            given = getattr(args, flag, None) is not None
        else:  # a record (config.json) holds every setting: one other than its row's default (if any) was given
            default, value = results_settings.default_of(flag), s.get(flag)
            given = default is not dataclasses.MISSING and \
                (tuple(value) if isinstance(value, list) else value) not in (default, None)
        if given and not set(chosen) & set(values):
            raise UsageError(f"--{flag.replace('_', '-')} applies to --{setting} {' or '.join(values)} only "
                             f"(here --{setting} {','.join(chosen)}), where it would be ignored")


def check_pe_dropout_on(s: dict, args: argparse.Namespace | None):
    """--pe-dropout-on names PEs added to x, and means something only with a dropout above 0."""
    for kind in s["pe_dropout_on"]:
        if kind not in ADDITIVE_PES:
            raise UsageError(f"--pe-dropout-on: {kind!r} is not a PE added to x; choose from "
                             f"{', '.join(ADDITIVE_PES)}")
    if args is not None and args.pe_dropout_on is not None and not s["pe_dropout"]:
        raise UsageError("--pe-dropout-on applies with a --pe-dropout above 0 only")


def check_executor_flags(s: dict):
    """An executor's flags belong to it, and SLURM's values become lines of a job script
    (results.settings.check_executor_flags), or UsageError."""
    as_usage_error(results_settings.check_executor_flags, s)


def resolve_paths(value: str, setting: TaskSetting) -> str:
    """The files a setting names, checked and made absolute, as config.json records them."""
    flag = f"--{setting.name.replace('_', '-')}"
    paths = setting.paths(value)
    for path in paths:
        if not path:
            raise UsageError(f"{flag} {value!r}: names no file")
        if not Path(path).exists():
            raise UsageError(f"{flag}: {path} does not exist")
        if len(paths) > 1 and "," in str(Path(path).resolve()):  # the record could not be split back
            raise UsageError(f"{flag}: {Path(path).resolve()} holds a comma: name it alone, or rename it")
    return ",".join(str(Path(path).resolve()) for path in paths)

