"""The sweep's flags, and the one frozen Settings (pe_fast.results.settings) they make: the task's defaults,
overridden by a preset, overridden by the flags, then checked by validation.validate. Nothing downstream re-derives
or re-defaults a value; what changes later (the out folder, the pack size, the packs) is a new object
(dataclasses.replace). resume.py reads the settings back from a results folder."""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys

import numpy as np

import pe_fast
from pe_fast.number_text import check_ascii_number
from pe_fast.program_exit import brief
from pe_fast.results.settings import (FLAGS, FLOAT32_MAX, KEEP, LIST_SETTINGS, OPTIONAL_LISTS, Flag, Settings,
                                      default_of, is_list, value_type)
from pe_fast.tasks import KINDS
from pe_fast.sweep import UsageError
from pe_fast.sweep.validation import check_task, validate


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage before its error; a user mistake here gets the one error line only. A flag is
    taken only as spelled in full: argparse's abbreviations (--step for --steps) would set a flag silently, and
    a flag added later could change what an abbreviation meant."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # a value that starts with a minus and a digit is a value (no flag does): argparse's own test takes
        # "-0.1,0.2" or "-1e3" for a flag and says "expected one argument", not what is wrong with the number
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self.refuse_repeated_flags(args)
        return super().parse_known_args(args, namespace)

    def refuse_repeated_flags(self, args: list[str]):
        """A flag that takes one value, given twice: argparse keeps the last and drops the first without a word
        (--sigmas 0.1 --sigmas 0.3 trained σ = 0.3 alone). Only the flags that collect (--slurm-option) repeat."""
        given = {}
        for i, token in enumerate(args):
            if token == "--":
                break
            flag, equals, value = token.partition("=")
            action = self._option_string_actions.get(flag)
            if action is None or action.nargs == 0 or isinstance(action, argparse._AppendAction):
                continue
            value = value if equals else (args[i + 1] if i + 1 < len(args) else "")
            if action.dest in given:
                self.error(f"{flag} is given twice ({brief(given[action.dest])}, then {brief(value)}): give it once")
            given[action.dest] = value

    def _get_value(self, action: argparse.Action, arg_string: str):
        """A numeric flag's text through ascii_number, its type (int, float) left as the flag's for --help."""
        if action.type in (int, float):
            try:
                check_ascii_number(arg_string)
            except ValueError as error:
                raise argparse.ArgumentError(action, f"invalid {action.type.__name__} value: {error}") from None
        return super()._get_value(action, arg_string)

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The flags, one per row of Settings (results.settings.FLAGS) and of the tasks' own settings, in that order."""
    p = OneLineParser(prog="python -m pe_fast.sweep",
                      description="train a grid of PE types × σ × seeds as stacked packs and write a results folder")
    p.add_argument("--version", action="version", version=f"pe-fast {pe_fast.__version__}")
    for name, flag in FLAGS.items():
        add_flag(p, name, flag)
        if name == "preset":  # the tasks' own settings where Settings holds them
            add_task_flags(p)
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted sweep in --out with its own settings")
    return p


def ascii_number(convert, text):
    """convert (int, float ...) of a list item's text, a number's ASCII only."""
    if convert in (int, float):
        check_ascii_number(text)
    return convert(text)


def add_flag(p: argparse.ArgumentParser, name: str, flag: Flag):
    """One row's flag. Every default is None (False for an on/off flag) so that a preset can fill what the user
    did not set."""
    options = dict(help=flag.help, metavar=flag.metavar)
    if value_type(name) is bool:
        options["action"] = "store_true"
    elif flag.repeatable:
        options["action"] = "append"
    elif not is_list(name):  # a list is read from its text by parse_list
        options["type"] = None if value_type(name) is str else value_type(name)
        if flag.choices is not None and flag.choices_in_parser:
            options["choices"] = parser_choices(flag.choices)
    p.add_argument(f"--{name.replace('_', '-')}", **{k: v for k, v in options.items() if v is not None})


def parser_choices(choices) -> tuple:
    """The values argparse accepts: a task-dependent set's values for any task (validation checks the task's)."""
    if callable(choices):
        return tuple(sorted({value for kind in KINDS.values() for value in choices(kind)} - {None}))
    return tuple(value for value in choices if value is not None)


def add_task_flags(p: argparse.ArgumentParser):
    owners = {}  # each task's own settings (TaskKind.settings), once however many tasks share one
    for kind in KINDS.values():
        for setting in kind.settings:
            owners.setdefault(setting.name, ([], []))
            owners[setting.name][0].append(setting)
            owners[setting.name][1].append(kind.name)
    for name, (shared, tasks) in owners.items():
        # the values any task takes (netsim's --split is "subject" only): validation checks the task's own
        choices = None if shared[0].choices is None else tuple(dict.fromkeys(c for s in shared for c in s.choices))
        p.add_argument(f"--{name.replace('_', '-')}", type=shared[0].type, choices=choices,
                       help=f"{'/'.join(tasks)}: {shared[0].help}")


# what a list flag's text or a Python caller's list item may be (numpy's scalars included)
LIST_ITEM_TYPES = (str, int, float, np.generic)


def parse_list(text, convert, flag: str) -> tuple:
    """A comma-separated flag (or a preset's or config.json's value) as a tuple; a value given twice would
    train the same models twice, so it is refused."""
    if isinstance(text, np.ndarray) and text.ndim == 1:  # a Python caller's array, range or list: the same
        text = list(text)  # numpy scalars, read as np.float32(0.2) alone is (tolist() widened it to 0.2000000029…)
    if isinstance(text, (list, tuple, range)):  # one value per item, as config.json records them
        if odd := [item for item in text if not isinstance(item, LIST_ITEM_TYPES)]:
            raise UsageError(f"{flag}: the item {brief(odd[0])} is a {type(odd[0]).__name__}, not text or a number")
        items = [str(item) for item in text]
        if (joined := next((item for item in items if "," in item), None)) is not None:
            raise UsageError(f"{flag}: the item {brief(joined)} holds a comma; give one value per item")
    elif isinstance(text, LIST_ITEM_TYPES):
        items = str(text).split(",")
    else:  # a set, dict, generator or bytes: str() of one reads as garbled items
        raise UsageError(f"{flag}: expected a list or comma-separated text, got {brief(text)} (a list keeps the "
                         f"order the models are numbered in)")
    if not any(item.strip() for item in items):
        raise UsageError(f"{flag}: empty list")
    if not all(item.strip() for item in items):  # two commas in a row, or one at an end: a value left out?
        raise UsageError(f"{flag}: {brief(text)} holds an empty item")
    try:
        values = [ascii_number(convert, item.strip()) for item in items]
    except ValueError:
        raise UsageError(f"{flag}: cannot parse {brief(text)} as a comma-separated list")
    if len(set(values)) < len(values):
        raise UsageError(f"{flag}: {brief(text)} names a value twice")
    # σ and the optimizer's numbers are float32 in the models and the results: two values that round to one there
    # would train the same models twice, listed as two settings
    stored: dict = {}
    for value in values:
        key = float(np.float32(value)) if type(value) is float and abs(value) <= FLOAT32_MAX else value
        if key in stored:
            raise UsageError(f"{flag}: {brief(text)} names one value twice: {stored[key]!r} and {value!r} are the "
                             f"same float32, as the models and the results store it")
        stored[key] = value
    return tuple(values)


def from_flags(args: argparse.Namespace) -> Settings:
    """Flags override the preset, which overrides the task's defaults; then validate() checks the whole."""
    task = args.task or "fmri"
    check_task(task)  # the parser's choices; a Python caller's value comes here unchecked
    kind = KINDS[task]
    s = {**kind.defaults, "task": task}
    if args.preset:
        if not isinstance(args.preset, str) or args.preset not in kind.presets:  # a Python caller's: any type
            raise UsageError(f"--preset {args.preset} is not defined for --task {task}; "
                             f"choose from {', '.join(kind.presets) or 'none'}")
        s.update(kind.presets[args.preset])
    s.update({k: v for k, v in vars(args).items() if v is not None and k != "resume"})
    s = {**{name: default_of(name) for name in FLAGS if default_of(name) is not dataclasses.MISSING},
         **{name: flag.new_sweep for name, flag in FLAGS.items() if flag.new_sweep is not KEEP}, **s}
    for name, convert in LIST_SETTINGS.items():
        if not (name in OPTIONAL_LISTS and s[name] is None):
            s[name] = parse_list(s[name], convert, f"--{name.replace('_', '-')}")
    if s["seed_values"] is not None:
        if args.seeds is not None:
            raise UsageError("--seeds and --seed-values both say which seeds to train; give one of them")
        s["seeds"] = len(s["seed_values"])
    if s["mlp_width"] is None and isinstance(s["width"], int):
        s["mlp_width"] = 4 * s["width"]
    return validate(s, args)
