"""The sweep's flags, and the one frozen Settings (pe_fast.results.settings) they make: the task's defaults,
overridden by a preset, overridden by the flags, then checked by validation.validate. Nothing downstream re-derives
or re-defaults a value; what changes later (the out folder, the pack size, the packs) is a new object
(dataclasses.replace). resume.py reads the settings back from a results folder."""
from __future__ import annotations

import argparse
import dataclasses

import pe_fast
from pe_fast import precision
from pe_fast.models import PE_KINDS
from pe_fast.models.absolute_pe import ADDITIVE_PES, SINUSOIDAL_PES
from pe_fast.results.settings import LIST_SETTINGS, OPTIONAL_LISTS, Settings
from pe_fast.tasks import KINDS
from pe_fast.train import OPTIMIZERS, SCHEDULES, UNTIL
from pe_fast.sweep import UsageError
from pe_fast.sweep.validation import COMPILE_CHOICES, EXECUTORS, PE_AT, check_task, validate


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
    owners = {}  # each task's own settings (TaskKind.settings), once however many tasks share one
    for kind in KINDS.values():
        for setting in kind.settings:
            owners.setdefault(setting.name, (setting, []))[1].append(kind.name)
    for name, (setting, tasks) in owners.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=setting.type, choices=setting.choices,
                       help=f"{'/'.join(tasks)}: {setting.help}")
    p.add_argument("--out", help="results folder (must not hold results yet); default runs/<task>-<time>")
    p.add_argument("--device", help="cpu, cuda or auto")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: all cores)")
    p.add_argument("--precision", choices=precision.PRECISIONS,
                   help="fp32 (default), tf32 (CUDA), bf16 or fp16 (autocast, float32 weights; fp16 with one "
                        "dynamic loss scale per model)")
    p.add_argument("--compile", choices=COMPILE_CHOICES,
                   help="torch.compile the training step (about 20 s per pack on a GPU); graphs: compiled and "
                        "replayed as CUDA graphs (CUDA only); auto (default): on on CUDA, off elsewhere")
    p.add_argument("--backend", help="the models' compute path: a pe_attention backend (reference, cpp, triton) or fused "
                                     "(Triton sublayers); default: the fastest on the device")
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
                   help="write every evaluation to DIR/tensorboard as it happens "
                        "(tensorboard --logdir DIR/tensorboard)")
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
        if not isinstance(args.preset, str) or args.preset not in kind.presets:  # a Python caller's: any type
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
