"""--resume: the settings an interrupted sweep recorded in DIR/config.json, through the same rules as flags (a
folder may come from anyone). Where and how it runs may change (RESUME_FLAGS); what it trains may not."""
from __future__ import annotations

import argparse
from pathlib import Path

from pe_fast.results import migrate, reading, run_folder
from pe_fast.results.settings import (EXECUTOR_FLAGS, HINTS, LIST_SETTINGS, RUNTIME_FLAGS, SettingError, Settings,
                                     check_choices, check_ranges, check_text, check_types, default_of)
from pe_fast.sweep.settings import parse_list
from pe_fast.sweep import UsageError, grid
from pe_fast.sweep.validation import another_tasks, conform, validate
from pe_fast.tasks import KINDS

RESUME_FLAGS = ("out", "resume", *RUNTIME_FLAGS)
# the runtime rows in words, the executors' own flags as one item
MAY_CHANGE = ", ".join([*(f"--{name.replace('_', '-')}" for name in RUNTIME_FLAGS if name not in EXECUTOR_FLAGS),
                        "the executor's own flags"])


def known_task(task) -> bool:
    """Whether config.json's task is one of pe_fast's (a record may hold anything there; validate() says what)."""
    return isinstance(task, str) and task in KINDS


def as_recorded(name: str, value, task):
    """A flag's value as config.json records it, to compare a flag given with --resume; of its setting's type, as
    without --resume (a Python caller's steps=3000.0 is refused, not taken as 3000)."""
    if name in LIST_SETTINGS:
        return list(parse_list(value, LIST_SETTINGS[name], f"--{name.replace('_', '-')}"))
    own = {setting.name: setting for setting in KINDS[task].settings} if known_task(task) else {}
    if name in own and own[name].files:
        return ",".join(str(Path(path).resolve()) for path in own[name].paths(value))
    if name not in own and name not in HINTS:
        raise another_tasks(name)
    return conform(name, value, own[name].type if name in own else HINTS[name])


def check_runtime_flags(given: dict, task):
    """The runtime flags given with --resume, checked alone before they join the recorded settings: a bad one is
    the flag's fault, not config.json's."""
    flags = {"task": task, **given} if known_task(task) else dict(given)
    try:
        check_types(flags, complete=False)
        check_text(flags)
        check_ranges(flags)
        if known_task(task):
            check_choices(flags)
    except SettingError as error:
        raise UsageError(str(error)) from None


def from_resume(args: argparse.Namespace) -> Settings:
    """--resume: the settings of DIR/config.json, validated as flags are (a folder may come from anyone). The
    flags of RESUME_FLAGS may change; any other flag may be repeated with its recorded value (rerunning the same
    command with --resume works) but not changed."""
    if not args.out:
        raise UsageError("--resume needs --out DIR, the folder of the sweep to continue")
    conform("out", args.out, str)  # a Python caller's out= may be anything
    path = Path(args.out) / run_folder.CONFIG
    try:
        config = run_folder.read_config(Path(args.out))
    except FileNotFoundError:
        if (sweep := run_folder.sweep_of_packs(Path(args.out))) is not None:  # DIR/packs or DIR/packs/0
            raise UsageError(f"--resume: {args.out} holds packs of the sweep {sweep}; resume that folder")
        raise UsageError(f"--resume: {path} does not exist; not a sweep folder (start one without --resume)")
    except (OSError, ValueError) as error:
        raise UsageError(f"--resume: {path} cannot be read as a sweep's config "
                         f"({type(error).__name__}: {getattr(error, 'strerror', None) or error})")
    if isinstance(config, dict) and run_folder.POOLED_FROM in config:
        raise UsageError(f"--resume: {args.out} pools finished sweeps (python -m pe_fast.report DIR ... --out); "
                         f"it has nothing to continue")
    if not (isinstance(config, dict) and isinstance(config.get("settings"), dict)
            and isinstance(config.get("packs"), list)):
        raise UsageError(f"--resume: {path} is not a sweep's config (it lacks its settings or packs)")
    try:
        s = migrate.settings(config["settings"])
    except SettingError as error:
        raise UsageError(f"--resume: {path}: {error}")
    given = {name: value for name, value in vars(args).items()
             if name not in RESUME_FLAGS and value is not None and value is not False}
    for name, value in given.items():
        if as_recorded(name, value, s.get("task")) != s.get(name):
            raise UsageError(f"--resume continues the sweep recorded in {path}: --{name.replace('_', '-')} {value} "
                             f"differs from its {s.get(name)!r} (may change: {MAY_CHANGE})")
    s["compile"] = "auto"  # how it runs, chosen anew for the machine it resumes on unless --compile says
    recorded = dict(s, out=args.out)
    if args.executor not in (None, s.get("executor")):  # the recorded executor's own flags go with it
        for name in EXECUTOR_FLAGS:
            s[name] = default_of(name)
    # 0 == False: --threads 0 is given
    runtime = {name: getattr(args, name) for name in RUNTIME_FLAGS
               if getattr(args, name) is not None and getattr(args, name) is not False}
    check_runtime_flags(runtime, s.get("task"))
    s.update(runtime)
    s["out"] = args.out
    try:
        settings = validate(s, packs=config["packs"])
    except UsageError as error:
        raise blamed(error, recorded, runtime, config["packs"], path) from None
    check_models_recorded(config.get("models"), settings, path)
    return settings


def blamed(error: UsageError, recorded: dict, runtime: dict, packs, path: Path) -> UsageError:
    """A broken rule's error, blamed on the runtime flags given with --resume where the recorded settings keep
    every rule without them or break another (--executor slurm where no cluster answers is the flag's fault), else
    on config.json."""
    if runtime:
        try:
            validate(dict(recorded), packs=packs)
        except UsageError as own:
            if str(own) == str(error):
                return UsageError(f"--resume: {path}: {error}")
        return UsageError(str(error))
    return UsageError(f"--resume: {path}: {error}")


def check_models_recorded(recorded, s: Settings, path: Path):
    """config.json's models are the grid its settings make, each in the pack its packs give it: the sweep trains
    the grid, and the readers then check its results against this list (a tampered lr there once trained, and left
    a folder no reader opens)."""
    grid_models = grid.expand_grid(s)
    pack_of = {model_id: index for index, pack in enumerate(s.packs) for model_id in pack}
    if not (isinstance(recorded, list) and len(recorded) == len(grid_models)):
        raise UsageError(f"--resume: {path}: models do not list the {len(grid_models)} models of its settings' grid")
    for entry, model in zip(recorded, grid_models):
        wanted = {**model, "pack": pack_of[model["model_id"]]}
        if not isinstance(entry, dict):
            key = "its kind"
        elif set(entry) != set(wanted):
            key = sorted(set(entry) ^ set(wanted))[0]  # a key missing or one no sweep writes
        else:
            key = reading.differing_key(wanted, entry)
        if key is not None:
            raise UsageError(f"--resume: {path}: models lists model {model['model_id']} with {key} "
                             f"{entry.get(key) if isinstance(entry, dict) else entry!r:.40}, where its settings' grid "
                             f"has {wanted.get(key)!r:.40}")
