"""The sweep from Python: the command line's flags as keyword arguments, through the same validation and into the
same results folder.

    import pe_fast.sweep
    run = pe_fast.sweep.run(task="lst", preset="cpu", sigmas=[0.2, 2.0], seeds=2, out="runs/lst")
    run.results          # one row per model (pandas), as results.parquet holds it

A keyword is a flag's name with underscores (--seed-values: seed_values); a comma-separated flag takes a list; an
on/off flag (--no-report, --resume) takes True; a path may be a str or a pathlib.Path. A bad argument raises
UsageError (a ValueError) with the message the command line prints, naming the argument by its flag, before anything
is written.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from pe_fast.program_exit import brief
from pe_fast.results import run_folder
from pe_fast.results.reading import Run
from pe_fast.results.settings import FLAGS, MAX_MODELS
from pe_fast.sweep import UsageError, program, resume, settings
from pe_fast.tasks import KINDS


# the task settings that name several files, comma-separated (--data): a list of paths from Python
SEVERAL_FILES = {setting.name for kind in KINDS.values() for setting in kind.settings if setting.files == "several"}


def path_text(value, flag: str) -> str:
    """run_folder.path_text, its TypeError a UsageError as every bad argument is."""
    try:
        return run_folder.path_text(value, flag)
    except TypeError as error:
        raise UsageError(str(error)) from None


def plain(value, flag: str):
    """A caller's int, float or str as the value it holds, not as its subclass says it (steps=LyingInt(4), whose
    __index__ gave 999, trained 999 steps; a str whose __str__ raised gave a traceback); a list or tuple item by
    item, as it holds them (not as a subclass's __iter__ gives them); no more items than a sweep has models (a
    range(10**12) was walked whole, a broadcast array of 10**9 made 32 GB)."""
    if isinstance(value, (list, tuple, range, np.ndarray)):
        size = _plain_size(value)
        if size > MAX_MODELS:
            raise UsageError(f"{flag}: {size:,} items, more than a sweep's {MAX_MODELS:,} models")
        if isinstance(value, list):
            return [plain(item, flag) for item in list.__iter__(value)]
        if isinstance(value, tuple):
            return tuple(plain(item, flag) for item in tuple.__iter__(value))
        return value
    for base in (int, float, str):
        if isinstance(value, base) and type(value) is not base and not isinstance(value, (bool, np.generic)):
            return {int: int.__int__, float: float.__float__, str: str.__str__}[base](value)
    return value


def _plain_size(value) -> int:
    """How many items a list, tuple, range or array holds, as its base type counts them (a subclass's __len__ may
    say anything)."""
    for base in (list, tuple):
        if isinstance(value, base):
            return base.__len__(value)
    return value.size if isinstance(value, np.ndarray) else len(value)


def arguments(keywords: dict) -> argparse.Namespace:
    """The parser's namespace with these keywords set, as if given on the command line."""
    parser = settings.build_parser()
    namespace = parser.parse_args([])
    on_off = {action.dest for action in parser._actions if isinstance(action, argparse._StoreTrueAction)}
    for name, value in keywords.items():
        if name not in vars(namespace):
            raise UsageError(f"unknown argument {brief(name)}; the arguments are the flags of python -m pe_fast.sweep "
                             f"with underscores: {', '.join(sorted(vars(namespace)))}")
        if name in on_off:
            if not isinstance(value, (bool, np.bool_)):
                raise UsageError(f"--{name.replace('_', '-')}: expected True or False, got {brief(value)}")
            value = None if not value else True  # an on/off flag left off is not given
        if name in FLAGS and FLAGS[name].repeatable and isinstance(value, str):  # repeatable flag: a list here
            value = [value]
        flag = f"--{name.replace('_', '-')}"
        value = plain(value, flag)
        if isinstance(value, os.PathLike):  # a path (out=, data=) as Python code holds one: its text, as typed
            value = path_text(value, flag)
        if name in SEVERAL_FILES and isinstance(value, (list, tuple)):  # comma-separated on the command line
            value = ",".join(path_text(v, flag) for v in value) \
                if all(isinstance(v, (str, os.PathLike)) for v in value) else value
        setattr(namespace, name, value)
    return namespace


def run(**keywords) -> Run:
    """Train the sweep these arguments describe (or continue one: resume=True, out=DIR) and return its results
    folder as a Run (pe_fast.load_run). Progress goes to stderr as on the command line."""
    namespace = arguments(keywords)
    s = resume.from_resume(namespace) if namespace.resume else settings.from_flags(namespace)
    return program.run(s)
