"""The sweep's settings: one frozen, typed object built from the flags, the task's defaults and a preset, and
validated here, in one place, before anything runs or is written. Nothing downstream re-derives or re-defaults a
value; what changes later (the out folder, the pack size, the packs) is a new object (dataclasses.replace)."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import re
import shutil
import socket
import types
import typing
from pathlib import Path

import torch

import pe_fast
from pe_fast import precision
from pe_fast.results import run_folder
from pe_fast.results import migrate
from pe_fast.results.settings import LIST_SETTINGS, OPTIONAL_LISTS, RUNTIME_FLAGS, Settings
from pe_fast.models import PE_KINDS
from pe_fast.models.absolute_pe import ADDITIVE_PES, SIGMA_PES, SINUSOIDAL_PES
from pe_fast.tasks import KINDS
from pe_fast.tasks.fmri import ATLASES
from pe_fast.tasks.netsim import NETWORK_SETTINGS
from pe_fast.train import COMPILE_MODES, OPTIMIZERS, SCHEDULES, UNTIL, compile_problem

EXECUTORS = ("local", "ray", "slurm")
COMPILE_CHOICES = ("auto", *COMPILE_MODES)
DEVICES = ("auto", "cpu", "cuda")
PE_AT = ("every", "input")
SPLITS = ("subject", "run")

PATH_FLAGS = ("lst_train", "lst_ood", "data", "regions", "parcellation")  # files the user names
RESUME_FLAGS = ("out", "resume", *RUNTIME_FLAGS)
SLURM_FLAGS = ("slurm_partition", "slurm_time", "slurm_gpus", "slurm_account", "slurm_option", "slurm_local")


class UsageError(Exception):
    """A mistake in the user's flags or files: reported as one line, exit code 2."""




class OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage before its error; a user mistake here gets the one error line only."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m pe_fast.sweep",
                      description="train a grid of PE types × σ × seeds as stacked packs and write a results folder")
    p.add_argument("--version", action="version", version=f"pe-fast {pe_fast.__version__}")
    # Every default is None so that a preset can fill what the user did not set.
    p.add_argument("--task", choices=tuple(KINDS), help="fmri (default), lst or netsim")
    presets = sorted({name for kind in KINDS.values() for name in kind.presets})
    p.add_argument("--preset", choices=presets, help="a named configuration of the task; explicit flags win")
    p.add_argument("--pe", help=f"comma-separated PE kinds: {', '.join(PE_KINDS)}")
    p.add_argument("--sigmas", help="comma-separated σ of the learned and random PEs' N(0, σ²) initialisation")
    p.add_argument("--seeds", type=int, help="number of seeds per (PE, σ): the first N of the authors' 15 LST seeds")
    p.add_argument("--seed-values", metavar="SEEDS",
                   help="comma-separated seeds per (PE, σ) instead of --seeds, e.g. 6068 to add the third seed "
                        "of an earlier --seeds 2 run")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", help="learning rate; a comma-separated list is a grid axis")
    p.add_argument("--optimizer", help=f"{', '.join(OPTIMIZERS)}; a comma-separated list is a grid axis")
    p.add_argument("--weight-decay", help="weight decay; a comma-separated list is a grid axis")
    p.add_argument("--momentum", help="SGD momentum; a comma-separated list is a grid axis")
    p.add_argument("--schedule", choices=SCHEDULES)
    p.add_argument("--warmup", type=int, help="linear warm-up steps")
    p.add_argument("--width", type=int, help="model width d")
    p.add_argument("--depth", type=int, help="number of blocks")
    p.add_argument("--heads", type=int)
    p.add_argument("--mlp-width", type=int, help="MLP hidden width (default 4·width)")
    p.add_argument("--pe-at", choices=PE_AT, help="add the PE at every block or at the input only")
    p.add_argument("--pe-dropout", type=float,
                   help="dropout probability on x + PE at each block while training, for the PE kinds of "
                        "--pe-dropout-on (default 0)")
    p.add_argument("--pe-dropout-on", metavar="KINDS",
                   help=f"comma-separated PE kinds that --pe-dropout applies to, of {', '.join(ADDITIVE_PES)} "
                        f"(default {','.join(SINUSOIDAL_PES)}: the authors' code drops out its sinusoidal PEs only)")
    p.add_argument("--eval-every", type=int, help="evaluate every this many steps")
    p.add_argument("--until", choices=UNTIL,
                   help="converged (the fmri and netsim default): end a pack at the first evaluation where every "
                        "model's score gained at most 0.01 over the last quarter of its steps (the report's "
                        "convergence test) and, for the LST, it fits its training set, or at --steps; budget: train "
                        "--steps")
    p.add_argument("--eval-items", type=int,
                   help="intermediate evaluations score at most this many items of the splits other than the "
                        "held-out one the convergence check follows (always in full); the last scores all")
    p.add_argument("--lst-train", help="LST training puzzles: a CSV file or a folder of them")
    p.add_argument("--lst-ood", help="LST generalisation puzzles (CSV); default: generated, unlike the training set")
    p.add_argument("--atlas", choices=ATLASES,
                   help="fmri: schaefer100 = real HCP BOLD (default); glasser360 = simulated from real HCP FC")
    p.add_argument("--data", help="fmri: your parcellated time series (.npy/.npz/.h5: subjects × time × regions) "
                                  "or CIFTI .dtseries.nii runs, comma-separated, one subject each")
    p.add_argument("--regions", help="fmri: regions table for --data (CSV: label,x,y,z,network)")
    p.add_argument("--parcellation", help="fmri: the .dlabel.nii that parcellates a CIFTI --data")
    p.add_argument("--mask-fraction", type=float, help="fmri/netsim: fraction of tokens masked (default 0.2)")
    p.add_argument("--window", type=int, help="fmri/netsim: time points per token (default 1)")
    p.add_argument("--split", choices=SPLITS, help="fmri/netsim: train/test split (default subject)")
    for name, kind in NETWORK_SETTINGS.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help="netsim: see pe_fast.data.simulate_network")
    p.add_argument("--out", help="results folder (must not hold results yet); default runs/<task>-<time>")
    p.add_argument("--device", help="cpu, cuda or auto")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: all cores)")
    p.add_argument("--precision", choices=precision.PRECISIONS,
                   help="fp32 (default), tf32 (CUDA), bf16 or fp16 (autocast, float32 weights; fp16 with one "
                        "dynamic loss scale per model)")
    p.add_argument("--compile", choices=COMPILE_CHOICES,
                   help="torch.compile the training step (about 20 s per pack on a GPU); graphs: compiled and "
                        "replayed as CUDA graphs (CUDA only); auto (default): on on CUDA, off elsewhere")
    p.add_argument("--backend", help="pe_attention backend (default: the fastest available)")
    p.add_argument("--max-pack", type=int,
                   help="models trained together (default: as many as fit in half the free memory)")
    p.add_argument("--checkpoint-every", type=int,
                   help="save each pack's training state every this many steps (default: every evaluation)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted sweep in --out with its own settings")
    p.add_argument("--executor", choices=EXECUTORS,
                   help="local (default): packs one after the other here; ray: packs as Ray tasks")
    p.add_argument("--ray-address",
                   help="--executor ray: the cluster to join (e.g. auto); default: a local Ray instance")
    p.add_argument("--slurm-partition", help="--executor slurm: the partition to submit to")
    p.add_argument("--slurm-time", type=int,
                   help="--executor slurm: minutes per job (default 60); a pack that needs longer is requeued "
                        "and continues from its checkpoint")
    p.add_argument("--slurm-gpus", type=int, help="--executor slurm: GPUs per job (default: 1 with --device cuda)")
    p.add_argument("--slurm-account", help="--executor slurm: the account to charge")
    p.add_argument("--slurm-option", action="append", metavar="KEY=VALUE",
                   help="--executor slurm: an extra sbatch option, e.g. qos=short or constraint=a100 (repeatable)")
    p.add_argument("--slurm-local", action="store_true",
                   help="--executor slurm: run the jobs with submitit's local executor instead (no SLURM needed)")
    p.add_argument("--tensorboard", action="store_true",
                   help="write every evaluation to DIR/tensorboard as it happens (tensorboard --logdir DIR/tensorboard)")
    p.add_argument("--no-report", action="store_true",
                   help="skip report.md and the figures at the end (python -m pe_fast.report DIR writes them)")
    return p


def parse_list(text, convert, flag: str) -> tuple:
    """A comma-separated flag (or a preset's or config.json's value) as a tuple; a value given twice would
    train the same models twice, so it is refused."""
    if isinstance(text, (list, tuple)):
        text = ",".join(map(str, text))
    try:
        values = [convert(v.strip()) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag}: cannot parse {text!r} as a comma-separated list")
    if not values:
        raise UsageError(f"{flag}: empty list")
    if len(set(values)) < len(values):
        raise UsageError(f"{flag}: {text!r} names a value twice")
    return tuple(values)


def from_flags(args: argparse.Namespace) -> Settings:
    """Flags override the preset, which overrides the task's defaults; then validate() checks the whole."""
    task = args.task or "fmri"
    check_task(task)  # the parser's choices; a Python caller's value comes here unchecked
    kind = KINDS[task]
    s = {**kind.defaults, "task": task}
    if args.preset:
        if args.preset not in kind.presets:
            raise UsageError(f"--preset {args.preset} is not defined for --task {task}; "
                             f"choose from {', '.join(kind.presets) or 'none'}")
        s.update(kind.presets[args.preset])
    s.update({k: v for k, v in vars(args).items() if v is not None and k != "resume"})
    s = {**{f.name: f.default for f in dataclasses.fields(Settings)
            if f.default is not dataclasses.MISSING}, "mlp_width": None, "compile": "auto", "device": "auto",
         "precision": None, **s}
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


def validate(s: dict, args: argparse.Namespace | None = None, packs=None) -> Settings:
    """Every rule of a sweep's settings, the same whatever their source: the flags (args, to tell what the user
    gave), a resumed config.json (with its packs) or a Python caller. Nothing has been read or written yet; a
    broken rule is a UsageError naming the setting as its flag."""
    check_types(s)
    check_choices(s)
    check_text(s)
    check_ranges(s, args)
    models = check_grid(s)
    if s["width"] % s["heads"]:
        raise UsageError(f"--width {s['width']} must be divisible by --heads {s['heads']}")
    if args is not None:
        for flag in dict.fromkeys(f for other in KINDS.values() for f in other.flags):
            if flag not in KINDS[s["task"]].flags and getattr(args, flag) is not None:
                owners = " and ".join(name for name, other in KINDS.items() if flag in other.flags)
                raise UsageError(f"--{flag.replace('_', '-')} applies to --task {owners} only")
        if s["data"] is not None and args.atlas is not None:
            raise UsageError("--atlas chooses the built-in data; with --data, your --regions table describes "
                             "the regions instead")
    if s["task"] == "fmri" and (s["regions"] or s["parcellation"]) and not s["data"]:
        raise UsageError("--regions and --parcellation describe --data; give --data too")
    for path_flag in PATH_FLAGS:
        if s.get(path_flag) is not None:
            # absolute, so that a resume from elsewhere or a Ray worker finds them
            s[path_flag] = resolve_paths(s[path_flag], path_flag)
    resolve_runtime(s)
    if packs is not None:
        s["packs"] = check_packs(packs, models)
    return Settings(**s)


# ---- the rules every setting must satisfy (one place; from_flags and from_resume apply them) ----

MAX_SIGMA = 1e6       # σ·N(0,1) stays far inside float32, and its square too
MIN_SIGMA = 1e-15     # σ² well above float32's smallest normal number: the PE's geometry stays measurable
MAX_MODELS = 100_000  # a grid larger than this is a typo, not a sweep
MAX_STEPS = 10**8     # 400 times the paper's 256k steps: more cannot finish
RAY_CONNECT_TIMEOUT_S = 10
MAX_THREADS = 1024    # per Ray or SLURM worker; a local sweep gets at most this machine's cores
# name -> (lowest, highest, which ends belong to the range: "[]", "[)", "()"); None: unbounded on that side
RANGES = {
    "seeds": (1, MAX_MODELS, "[]"), "seed_values": (0, 2**32, "[)"),  # plus its stream offsets, still a torch seed
    "steps": (1, MAX_STEPS, "[]"), "batch_size": (1, None, "[)"), "width": (1, None, "[)"),
    "depth": (1, None, "[)"), "heads": (1, None, "[)"), "mlp_width": (1, None, "[)"), "eval_every": (1, None, "[)"),
    "eval_items": (1, None, "[)"), "max_pack": (1, None, "[)"), "checkpoint_every": (1, None, "[)"),
    "threads": (1, MAX_THREADS, "[]"), "warmup": (0, None, "[)"), "lr": (0, None, "()"),
    "weight_decay": (0, None, "[)"),
    "momentum": (0, 1, "[)"), "pe_dropout": (0, 1, "[)"), "mask_fraction": (0, 1, "()"), "window": (1, None, "[)"),
    "nodes": (2, None, "[)"), "modules": (1, None, "[)"), "timepoints": (2, None, "[)"), "runs": (1, None, "[)"),
    "p_within": (0, 1, "[]"), "p_between": (0, 1, "[]"), "coupling": (0, None, "[)"),
    "inhibition": (0, None, "[)"), "noise": (0, None, "[)"), "netsim_seed": (0, None, "[)"),
    "slurm_time": (1, None, "[)"), "slurm_gpus": (0, None, "[)"),
}
# flag -> (the setting it depends on, the values under which it means something, or the setting that lists them)
APPLIES_ONLY_WITH = {"momentum": ("optimizer", ("sgd",)), "pe_dropout": ("pe", "pe_dropout_on")}


def check_types(s: dict):
    """Each setting of the type Settings declares (a list for a tuple): config.json and Python callers can hold
    anything. A setting missing from an older config.json takes its default; one without a default is refused."""
    hints = typing.get_type_hints(Settings)
    for field in dataclasses.fields(Settings):
        if field.name == "packs":
            continue
        if field.name not in s:
            if field.default is dataclasses.MISSING:
                raise UsageError(f"--{field.name.replace('_', '-')} is missing")
            s[field.name] = field.default
        if not (field.name == "precision" and s[field.name] is None):  # None: the device's default, chosen later
            s[field.name] = conform(field.name, s[field.name], hints[field.name])


def conform(name: str, value, hint):
    """value as the type hint says (ints as floats where floats are asked for, lists as tuples), or UsageError."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        if value is None:
            return None
        hint = next(option for option in typing.get_args(hint) if option is not type(None))
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"--{name.replace('_', '-')}: expected a list, got {value!r}")
        return tuple(conform(name, item, typing.get_args(hint)[0]) for item in value)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is float and number:
        return float(value)
    if (hint is int and number and isinstance(value, int)) or (hint in (str, bool) and type(value) is hint):
        return value
    raise UsageError(f"--{name.replace('_', '-')}: expected {hint.__name__}, got {value!r}")


def check_task(task):
    if task not in KINDS:
        raise UsageError(f"--task {task!r}: choose from {', '.join(KINDS)}")


def check_choices(s: dict):
    """Each setting with a fixed set of values holds one of them (the task first: the others depend on it)."""
    check_task(s["task"])
    kind = KINDS[s["task"]]
    from pe_fast.ops.backends import BACKENDS  # the ops load the compiled kernels: only when asked
    choices = {"pe": kind.pe_kinds, "optimizer": OPTIMIZERS, "schedule": SCHEDULES, "pe_at": PE_AT,
               "precision": (None, *precision.PRECISIONS), "preset": (None, *kind.presets), "atlas": ATLASES,
               "split": SPLITS, "until": UNTIL, "executor": EXECUTORS, "compile": COMPILE_CHOICES, "device": DEVICES,
               "backend": (None, *BACKENDS)}
    for name, allowed in choices.items():
        for value in s[name] if isinstance(s[name], tuple) else (s[name],):
            if value not in allowed:
                what = {"pe": f"a PE of --task {s['task']}", "preset": f"a preset of --task {s['task']}"}
                raise UsageError(f"--{name.replace('_', '-')} {value!r} is not {what.get(name, 'one of them')}; "
                                 f"choose from {', '.join(str(a) for a in allowed if a is not None)}")
    for name in LIST_SETTINGS:
        values = s[name]
        if values is not None and len(set(values)) < len(values):
            raise UsageError(f"--{name.replace('_', '-')}: {','.join(map(str, values))} names a value twice")


CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")
# what an sbatch directive's value may hold: no spaces, quotes or characters a shell or a new line would read
SLURM_VALUE = re.compile(r"[\w.,:@%+=/|&*\[\]-]+")
SLURM_KEY = re.compile(r"[A-Za-z][\w-]*")
SLURM_ALLOWED = "letters, digits and .,:@%+=/|&*[]-_ only (it becomes a line of the job script)"


def check_text(s: dict):
    """No setting's text holds a line break or another control character: the values reach job scripts, file
    names and one-line messages."""
    for name, value in s.items():
        for text in value if isinstance(value, tuple) else (value,):
            if isinstance(text, str) and CONTROL_CHARACTER.search(text):
                raise UsageError(f"--{name.replace('_', '-')} {text!r}: holds a control character (a line break?)")


def check_grid(s: dict) -> int:
    """The grid's size, within MAX_MODELS; --seeds counts --seed-values where those are given."""
    if s["seed_values"] is not None and s["seeds"] != len(s["seed_values"]):
        raise UsageError(f"--seeds {s['seeds']} does not count --seed-values {','.join(map(str, s['seed_values']))}")
    optimizer_points = sum(len(s["momentum"]) if name == "sgd" else 1 for name in s["optimizer"])
    models = (s["seeds"] * sum(len(s["sigmas"]) if pe in SIGMA_PES else 1 for pe in s["pe"])
              * len(s["lr"]) * len(s["weight_decay"]) * optimizer_points)
    if models > MAX_MODELS:
        raise UsageError(f"--seeds {s['seeds']}: the grid would hold {models:,} models; at most {MAX_MODELS:,}")
    return models


def check_packs(packs, models: int) -> tuple[tuple[int, ...], ...]:
    """config.json's packs hold every model id of the grid exactly once."""
    packs = conform("packs", packs, tuple[tuple[int, ...], ...])
    ids = sorted(i for pack in packs for i in pack)
    if ids != list(range(models)) or not all(packs):
        raise UsageError(f"packs: {[list(p) for p in packs][:4]}... do not hold the grid's {models} models "
                         f"once each")
    return packs


def check_ranges(s: dict, args: argparse.Namespace | None = None):
    """Every numeric setting finite and in its range; a flag given for a setting that ignores it is refused."""
    for name, (low, high, ends) in RANGES.items():
        values = s.get(name)
        for value in values if isinstance(values, (tuple, list)) else (values,):
            if value is None:
                continue
            check_range(name, value, low, high, ends)
    if any(not (math.isfinite(v) and MIN_SIGMA <= v <= MAX_SIGMA) for v in s["sigmas"]):
        raise UsageError(f"--sigmas: every σ must be a number in [{MIN_SIGMA:g}, {MAX_SIGMA:g}] (the PE is "
                         f"float32), got {list(s['sigmas'])}")
    cores = len(os.sched_getaffinity(0))
    if s["executor"] == "local" and s["threads"] is not None and s["threads"] > cores:
        raise UsageError(f"--threads {s['threads']}: this machine has {cores} cores")
    check_pe_dropout_on(s, args)
    for flag, (setting, values) in APPLIES_ONLY_WITH.items():
        values = s[values] if isinstance(values, str) else values
        chosen = s[setting] if isinstance(s[setting], (tuple, list)) else (s[setting],)
        if args is not None and getattr(args, flag, None) is not None and not set(chosen) & set(values):
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


def check_range(name: str, value: float, low: float, high: float | None, ends: str):
    above = value >= low if ends[0] == "[" else value > low
    below = high is None or (value <= high if ends[1] == "]" else value < high)
    if not (math.isfinite(value) and above and below):
        allowed = f"{'≥' if ends[0] == '[' else '>'} {low:,}"
        allowed += "" if high is None else f" and {'≤' if ends[1] == ']' else '<'} {high:,}"
        raise UsageError(f"--{name.replace('_', '-')} must be finite and {allowed}, got {value}")


def check_ray_address(address: str | None):
    """A host:port that does not answer is one line within seconds (ray.init would retry it for ever)."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray-address {address!r}: expected auto or HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise UsageError(f"--ray-address {address}: no Ray cluster answers there ({error.strerror or error}); "
                         f"start one with ray start --head, or use --ray-address auto")


def resolve_runtime(s: dict):
    """The settings that may differ on --resume (device, executor, compilation), and what depends on them."""
    if s["device"] == "auto":
        s["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    elsewhere = s["executor"] in ("ray", "slurm")
    if s["device"] == "cuda" and not torch.cuda.is_available() and not elsewhere:  # a cluster may have GPUs
        raise UsageError(f"--device {s['device']!r} is not available here "
                         f"(cpu{', cuda' if torch.cuda.is_available() else ''})")
    if s["compile"] == "auto":  # measured: bench/results/h100-20261126-sweep (1.1-1.3× on an H100)
        s["compile"] = "on" if s["device"] == "cuda" else "off"
    if (why := compile_problem(s["compile"], torch.device(s["device"]))) is not None:
        raise UsageError(f"--compile {s['compile']}: {why}")
    if s.get("precision") is None:
        s["precision"] = precision.default(torch.device(s["device"]))
    if (why := precision.problem(s["precision"], torch.device(s["device"]))) is not None:
        raise UsageError(f"--precision {s['precision']}: {why}")
    if s["ray_address"] and s["executor"] != "ray":
        raise UsageError("--ray-address applies to --executor ray only")
    check_ray_address(s["ray_address"])
    check_slurm(s)
    on_ray = s["executor"] == "ray"
    if s.get("tensorboard") and importlib.util.find_spec("tensorboard") is None:
        raise UsageError("--tensorboard needs TensorBoard, which is not installed: pip install 'pe_fast[tensorboard]' "
                         "(or pip install tensorboard)")
    if s["executor"] == "slurm" and s["device"] == "cuda" and s.get("slurm_gpus") == 0:
        raise UsageError("--slurm-gpus 0 with --device cuda: the jobs would have no GPU")
    if on_ray and importlib.util.find_spec("ray") is None:
        raise UsageError("--executor ray needs Ray, which is not installed: pip install 'pe_fast[ray]' "
                         "(or pip install 'ray>=2.9')")


def check_slurm(s: dict):
    """The SLURM flags belong to --executor slurm, which needs submitit and, unless --slurm-local, sbatch."""
    given = [name for name in SLURM_FLAGS if s.get(name) not in (None, False, (), [])
             and not (name == "slurm_time" and s[name] == Settings.slurm_time)]
    if s["executor"] != "slurm":
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} applies to --executor slurm only")
        return
    options = s.get("slurm_option") or ()
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--slurm-option {option!r}: expected KEY=VALUE, e.g. qos=short")
        if not (SLURM_KEY.fullmatch(key) and SLURM_VALUE.fullmatch(value)):
            raise UsageError(f"--slurm-option {option!r}: KEY=VALUE of {SLURM_ALLOWED}")
    for name in ("slurm_partition", "slurm_account"):
        if s.get(name) is not None and not SLURM_VALUE.fullmatch(s[name]):
            raise UsageError(f"--{name.replace('_', '-')} {s[name]!r}: {SLURM_ALLOWED}")
    s["slurm_option"] = tuple(options)
    if importlib.util.find_spec("submitit") is None:
        raise UsageError("--executor slurm needs submitit, which is not installed: pip install 'pe_fast[slurm]' "
                         "(or pip install submitit)")
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if not s.get("slurm_local") and missing:
        raise UsageError(f"--executor slurm: no SLURM here ({' and '.join(missing)} not on the PATH); run it on the "
                         f"cluster's login node, or add --slurm-local to try the jobs with submitit's local executor")


def split_paths(value: str, flag: str) -> list[str]:
    """The files a path flag names: --data may name several CIFTI runs, comma-separated; the others one file."""
    return value.split(",") if flag == "data" else [value]


def resolve_paths(value: str, flag: str) -> str:
    """The files a path flag names, checked and made absolute, as config.json records them."""
    paths = split_paths(value, flag)
    for path in paths:
        if not path:
            raise UsageError(f"--{flag.replace('_', '-')} {value!r}: names no file")
        if not Path(path).exists():
            raise UsageError(f"--{flag.replace('_', '-')}: {path} does not exist")
    return ",".join(str(Path(path).resolve()) for path in paths)


def as_recorded(name: str, value):
    """A flag's value as config.json records it, to compare a flag given with --resume."""
    if name in LIST_SETTINGS:
        return list(parse_list(value, LIST_SETTINGS[name], f"--{name.replace('_', '-')}"))
    if name in PATH_FLAGS:
        return ",".join(str(Path(path).resolve()) for path in split_paths(value, name))
    return value


def from_resume(args: argparse.Namespace) -> Settings:
    """--resume: the settings of DIR/config.json, validated as flags are (a folder may come from anyone). The
    flags of RESUME_FLAGS may change; any other flag may be repeated with its recorded value (rerunning the same
    command with --resume works) but not changed."""
    if not args.out:
        raise UsageError("--resume needs --out DIR, the folder of the sweep to continue")
    path = Path(args.out) / run_folder.CONFIG
    try:
        config = run_folder.read_config(Path(args.out))
    except FileNotFoundError:
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
    s = migrate.settings(config["settings"])
    given = {name: value for name, value in vars(args).items()
             if name not in RESUME_FLAGS and value is not None and value is not False}
    for name, value in given.items():
        if as_recorded(name, value) != s.get(name):
            raise UsageError(f"--resume continues the sweep recorded in {path}: --{name.replace('_', '-')} {value} "
                             f"differs from its {s.get(name)!r} (may change: --threads, --device, --executor and its "
                             f"flags, --checkpoint-every, --compile, --tensorboard)")
    s["compile"] = "auto"  # how it runs, chosen anew for the machine it resumes on unless --compile says
    if args.executor not in (None, s.get("executor")):  # the recorded executor's own flags go with it
        defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
        for name in ("ray_address", *SLURM_FLAGS):
            s[name] = defaults[name]
    for name in RUNTIME_FLAGS:
        if getattr(args, name) not in (None, False):
            s[name] = getattr(args, name)
    s["out"] = args.out
    try:
        return validate(s, packs=config["packs"])
    except UsageError as error:
        raise UsageError(f"--resume: {path}: {error}")
