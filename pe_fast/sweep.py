"""`python -m pe_fast.sweep`: train a grid of PE types × σ × seeds as stacked packs and write a results folder.

    python -m pe_fast.sweep --task lst --pe learned,sin2d,none --sigmas 0.1,0.2,2.0 --seeds 3 --steps 2000 --out DIR

DIR gets config.json at the start, packs/<index>/ as each pack finishes, and at the end results.parquet (one row
per model), curves.parquet (one row per model and evaluation), pe_tables.npz (each model's final PE tables),
summary.txt and report.md (pe_fast.run_folder describes the layout). Each pack checkpoints its training state, so
a killed sweep continues with `--resume --out DIR` and ends with the results an uninterrupted run would have.
`--executor ray` trains the packs as Ray tasks, on this machine or a cluster. A user mistake stops with one line
and exit code 2, before anything is written.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pe_fast import memory, precision, run_folder
from pe_fast.models import PE_KINDS, ModelConfig
from pe_fast.train import OPTIMIZERS, SCHEDULES, PackTrainer, TrainConfig

# The authors' 15 LST seeds (notes/paper.md §2.6); --seeds N takes the first N, further ones count on from 1.
AUTHOR_SEEDS = (2235, 6312, 6068, 9742, 8880, 2197, 669, 6256, 3309, 2541, 8643, 7785, 195, 6914, 29)
SIGMA_PES = ("learned", "random")  # the PE kinds that are drawn from N(0, σ²)
TASKS = ("fmri", "lst", "netsim")
REGION_TASKS = ("fmri", "netsim")
# sin2d and rope2d need a 2D grid, which brain regions and network nodes do not have.
REGION_PES = tuple(k for k in PE_KINDS if k not in ("sin2d", "rope2d"))
ATLASES = ("schaefer100", "glasser360")
# --task netsim's network, passed to pe_fast.data.simulate_network (its docstring explains each one).
NETSIM_FLAGS = {"nodes": int, "modules": int, "p_within": float, "p_between": float, "coupling": float,
                "inhibition": float, "noise": float, "timepoints": int, "runs": int, "netsim_seed": int}

# Per task: what `python -m pe_fast.sweep --task T` runs with no other flag.
TASK_DEFAULTS = {
    "lst": dict(pe="learned,sin2d,none", sigmas="0.1,0.2,2.0", seeds=3, steps=2000, width=64, depth=4, heads=1,
                batch_size=128, lr=1e-3, optimizer="adamw", schedule="constant", warmup=0, eval_every=250),
    # Real HCP BOLD, Schaefer-100; sized to finish in about 10 minutes on 2 CPU cores (docs/reproduction.md).
    "fmri": dict(pe="learned", sigmas="0.01,0.1,0.2,0.5,1,2", seeds=3, steps=800, width=32, depth=2,
                 heads=1, mlp_width=64, batch_size=32, lr=3e-3, optimizer="adam", schedule="cosine", warmup=50,
                 eval_every=200, eval_items=512),
    "netsim": dict(pe="learned", sigmas="0.01,0.1,0.2,0.5,1,2", seeds=3, steps=800, width=32, depth=2,
                   heads=1, mlp_width=64, batch_size=32, lr=3e-3, optimizer="adam", schedule="cosine",
                   warmup=50, eval_every=200, eval_items=512),
}
PRESETS = {
    "lst": {
        # Fits 2 CPU cores in about 10 minutes and shows the paper's effect (docs/reproduction.md).
        "cpu": dict(pe="learned,sin2d", sigmas="0.2,2.0", seeds=3, steps=6000, width=32, depth=4, heads=1,
                    mlp_width=128, batch_size=64, lr=2e-3, schedule="cosine", warmup=200, eval_every=1000),
        # The authors' configuration (notes/paper.md §2.4–2.6): 4000 epochs of 63 steps; meant for a GPU.
        "paper": dict(pe="learned,sin2d,sin1d,rope,relative,none,random",
                      sigmas=",".join(f"{s / 10:g}" for s in range(1, 21)), seeds=15, steps=252_000, width=160,
                      depth=4, heads=1, mlp_width=640, batch_size=128, lr=1e-4, optimizer="adamw",
                      schedule="constant", warmup=0, eval_every=12_600),
    },
    "fmri": {
        # Every PE family of the paper's fMRI comparison (notes/paper.md §4), not only the σ grid.
        "all-pes": dict(pe="learned,none,sin1d,random,sinnd"),
    },
    "netsim": {
        "all-pes": dict(pe="learned,none,sin1d,random"),
    },
}
DEFAULTS = dict(task="fmri", mlp_width=None, weight_decay=0.0, momentum=0.0, pe_at="every", device="auto",
                threads=None, backend=None, max_pack=None, eval_items=2048, atlas="schaefer100", data=None,
                regions=None, parcellation=None, mask_fraction=0.2, window=1, split="subject", checkpoint_every=None,
                executor="local", ray_address=None, precision=None, compile="auto")
EXECUTORS = ("local", "ray")
# What --resume lets differ from the interrupted run: where and how it runs, never what it trains.
RESUME_FLAGS = ("out", "resume", "device", "threads", "executor", "ray_address", "checkpoint_every", "no_report",
                "compile")
COMPILE_CHOICES = ("auto", "on", "off")


class UsageError(Exception):
    """A mistake in the user's flags or files: reported as one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage before its error; a user mistake here gets the one error line only."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m pe_fast.sweep", description=__doc__.split("\n\n")[0])
    # Every default is None so that a preset can fill what the user did not set.
    p.add_argument("--task", choices=TASKS, help="fmri (default), lst or netsim")
    presets = sorted({name for per_task in PRESETS.values() for name in per_task})
    p.add_argument("--preset", choices=presets, help="a named configuration of the task; explicit flags win")
    p.add_argument("--pe", help=f"comma-separated PE kinds: {', '.join(PE_KINDS)}")
    p.add_argument("--sigmas", help="comma-separated σ of the learned and random PEs' N(0, σ²) initialisation")
    p.add_argument("--seeds", type=int, help="number of seeds per (PE, σ)")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--optimizer", choices=OPTIMIZERS)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--momentum", type=float, help="SGD momentum")
    p.add_argument("--schedule", choices=SCHEDULES)
    p.add_argument("--warmup", type=int, help="linear warm-up steps")
    p.add_argument("--width", type=int, help="model width d")
    p.add_argument("--depth", type=int, help="number of blocks")
    p.add_argument("--heads", type=int)
    p.add_argument("--mlp-width", type=int, help="MLP hidden width (default 4·width)")
    p.add_argument("--pe-at", choices=("every", "input"), help="add the PE at every block or at the input only")
    p.add_argument("--eval-every", type=int, help="evaluate every this many steps")
    p.add_argument("--eval-items", type=int,
                   help="intermediate evaluations score at most this many items per split; the last scores all")
    p.add_argument("--lst-train", help="LST training puzzles: a CSV file or a folder of them")
    p.add_argument("--lst-ood", help="LST generalisation puzzles (CSV); default: generated, unlike the training set")
    p.add_argument("--atlas", choices=ATLASES,
                   help="fmri: schaefer100 = real HCP BOLD (default); glasser360 = simulated from real HCP FC")
    p.add_argument("--data", help="fmri: your parcellated time series (.npy/.npz/.h5: subjects × time × regions) "
                                  "or a CIFTI .dtseries.nii")
    p.add_argument("--regions", help="fmri: regions table for --data (CSV: label,x,y,z,network)")
    p.add_argument("--parcellation", help="fmri: the .dlabel.nii that parcellates a CIFTI --data")
    p.add_argument("--mask-fraction", type=float, help="fmri/netsim: fraction of tokens masked (default 0.2)")
    p.add_argument("--window", type=int, help="fmri/netsim: time points per token (default 1)")
    p.add_argument("--split", choices=("subject", "run"), help="fmri/netsim: train/test split (default subject)")
    for name, kind in NETSIM_FLAGS.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help="netsim: see pe_fast.data.simulate_network")
    p.add_argument("--out", help="results folder (must not hold results yet); default runs/<task>-<time>")
    p.add_argument("--device", help="cpu, cuda or auto")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: all cores)")
    p.add_argument("--precision", choices=precision.PRECISIONS,
                   help="fp32, tf32 (CUDA) or bf16 (autocast, float32 weights); default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--compile", choices=COMPILE_CHOICES,
                   help="torch.compile the training step (about 20 s per pack on a GPU); auto (default): on CUDA")
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
    p.add_argument("--no-report", action="store_true",
                   help="skip report.md and the figures at the end (python -m pe_fast.report DIR writes them)")
    return p


def parse_list(text: str, convert, flag: str) -> list:
    try:
        values = [convert(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag}: cannot parse {text!r} as a comma-separated list")
    if not values:
        raise UsageError(f"{flag}: empty list")
    return list(dict.fromkeys(values))  # a value given twice would train the same models twice


def resolve_settings(args: argparse.Namespace) -> dict:
    """Flags override the preset, which overrides the task's defaults. Validated here, before anything runs."""
    task = args.task or DEFAULTS["task"]
    settings = {**DEFAULTS, **TASK_DEFAULTS[task]}
    if args.preset:
        if args.preset not in PRESETS.get(task, {}):
            raise UsageError(f"--preset {args.preset} is not defined for --task {task}; "
                             f"choose from {', '.join(PRESETS.get(task, {})) or 'none'}")
        settings.update(PRESETS[task][args.preset])
    settings.update({k: v for k, v in vars(args).items() if v is not None})
    s = settings
    s["pe"] = parse_list(s["pe"], str.strip, "--pe")
    allowed = REGION_PES if task in REGION_TASKS else PE_KINDS
    for kind in s["pe"]:
        if kind not in allowed:
            raise UsageError(f"--pe: {kind!r} is not a PE of --task {task}; choose from {', '.join(allowed)}")
    s["sigmas"] = parse_list(str(s["sigmas"]), float, "--sigmas")
    if any(not (math.isfinite(v) and v > 0) for v in s["sigmas"]):
        raise UsageError(f"--sigmas: every σ must be a positive number, got {s['sigmas']}")
    positive = ["seeds", "steps", "batch_size", "width", "depth", "heads", "eval_every", "eval_items", "max_pack",
                "checkpoint_every"]
    for name in positive:
        if s[name] is not None and s[name] <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {s[name]}")
    if not (s["lr"] > 0 and math.isfinite(s["lr"])):
        raise UsageError(f"--lr must be positive, got {s['lr']}")
    if s["warmup"] < 0 or s["weight_decay"] < 0:
        raise UsageError("--warmup and --weight-decay must not be negative")
    if s["width"] % s["heads"]:
        raise UsageError(f"--width {s['width']} must be divisible by --heads {s['heads']}")
    if s["mlp_width"] is None:
        s["mlp_width"] = 4 * s["width"]
    if s["threads"] is not None and s["threads"] <= 0:
        raise UsageError(f"--threads must be positive, got {s['threads']}")
    check_runtime(s)
    if s["precision"] is None:
        s["precision"] = precision.default(torch.device(s["device"]))
    if (why := precision.problem(s["precision"], torch.device(s["device"]))) is not None:
        raise UsageError(f"--precision {s['precision']}: {why}")
    if not 0 < s["mask_fraction"] < 1:
        raise UsageError(f"--mask-fraction must be between 0 and 1, got {s['mask_fraction']}")
    if s["window"] < 1:
        raise UsageError(f"--window must be at least 1, got {s['window']}")
    task_flags = {"lst": ("lst_train", "lst_ood"), "fmri": ("atlas", "data", "regions", "parcellation"),
                  "netsim": tuple(NETSIM_FLAGS)}
    for other, flags in task_flags.items():
        for flag in flags:
            if other != task and getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} applies to --task {other} only")
    if task == "lst":
        for flag in ("mask_fraction", "window", "split"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} applies to --task fmri and netsim only")
    if task == "fmri" and (s["regions"] or s["parcellation"]) and not s["data"]:
        raise UsageError("--regions and --parcellation describe --data; give --data too")
    for path_flag in ("lst_train", "lst_ood", "data", "regions", "parcellation"):
        if s.get(path_flag) and not Path(s[path_flag]).exists():
            raise UsageError(f"--{path_flag.replace('_', '-')}: {s[path_flag]} does not exist")
    if s["backend"] is not None:
        from pe_fast.ops.pe_attention import BACKENDS
        if s["backend"] not in BACKENDS:
            raise UsageError(f"--backend: unknown {s['backend']!r}; available: {', '.join(BACKENDS)}")
    if s["ray_address"] and s["executor"] != "ray":
        raise UsageError("--ray-address applies to --executor ray only")
    for path_flag in ("lst_train", "lst_ood", "data", "regions", "parcellation"):
        if s.get(path_flag):  # absolute, so that a resume from elsewhere or a Ray worker finds them
            s[path_flag] = str(Path(s[path_flag]).resolve())
    return s


def check_runtime(s: dict):
    """The settings that may differ on --resume: device, executor, compilation."""
    if s["device"] == "auto":
        s["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    if s.get("compile", "auto") == "auto":  # measured: bench/results/h100-20261126-sweep (1.1-1.3× on an H100)
        s["compile"] = "on" if s["device"] == "cuda" else "off"
    on_ray = s["executor"] == "ray"
    if s["device"] not in ("cpu", "cuda") or (s["device"] == "cuda" and not torch.cuda.is_available()
                                              and not on_ray):  # a Ray cluster's workers may have the GPUs
        raise UsageError(f"--device {s['device']!r} is not available here (cpu{', cuda' if torch.cuda.is_available() else ''})")
    if on_ray and importlib.util.find_spec("ray") is None:
        raise UsageError("--executor ray needs Ray, which is not installed: pip install 'pe_fast[ray]' "
                         "(or pip install 'ray>=2.9')")


def resume_settings(args: argparse.Namespace) -> dict:
    """--resume: the settings of DIR/config.json; only the flags of RESUME_FLAGS may be given."""
    if not args.out:
        raise UsageError("--resume needs --out DIR, the folder of the sweep to continue")
    changed = [name for name, value in vars(args).items()
               if name not in RESUME_FLAGS and value is not None and value is not False]
    if changed:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in changed)
        raise UsageError(f"--resume takes the experiment's settings from {args.out}/config.json; {flags} cannot "
                         f"change (allowed: --threads, --device, --executor, --ray-address, --checkpoint-every, --compile)")
    path = Path(args.out) / "config.json"
    try:
        config = json.loads(path.read_text())
        s = dict(config["settings"])
        s["packs"] = config["packs"]
    except FileNotFoundError:
        raise UsageError(f"--resume: {path} does not exist; not a sweep folder (start one without --resume)")
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise UsageError(f"--resume: {path} is not a sweep's config ({type(error).__name__}: {error})")
    s["compile"] = "auto"  # how it runs, chosen anew for the machine it resumes on unless --compile says
    for name in ("device", "threads", "executor", "ray_address", "checkpoint_every", "no_report", "compile"):
        if getattr(args, name) not in (None, False):
            s[name] = getattr(args, name)
    s.setdefault("executor", "local")
    s.setdefault("ray_address", None)
    s.setdefault("checkpoint_every", None)
    s.setdefault("precision", "fp32")  # sweeps from before --precision trained in float32
    if s["threads"] is not None and s["threads"] <= 0:
        raise UsageError(f"--threads must be positive, got {s['threads']}")
    if s["checkpoint_every"] is not None and s["checkpoint_every"] <= 0:
        raise UsageError(f"--checkpoint-every must be positive, got {s['checkpoint_every']}")
    if s["ray_address"] and s["executor"] != "ray":
        raise UsageError("--ray-address applies to --executor ray only")
    s["out"] = args.out
    check_runtime(s)
    if (why := precision.problem(s["precision"], torch.device(s["device"]))) is not None:
        raise UsageError(f"--resume: this sweep trains in {s['precision']}, and {why}")
    return s


def apply_runtime(s: dict):
    """Process-wide settings, in the sweep's process and in every Ray worker: threads, backend, malloc."""
    memory.keep_freed_memory()
    precision.apply(s["precision"])
    if s["threads"]:
        torch.set_num_threads(s["threads"])
    if s["backend"] is not None:
        os.environ["PE_FAST_BACKEND"] = s["backend"]


def model_seeds(count: int) -> list[int]:
    return list(AUTHOR_SEEDS[:count]) + list(range(1, count - len(AUTHOR_SEEDS) + 1))


def expand_grid(s: dict) -> list[dict]:
    """One entry per model: its PE kind, σ (NaN where the PE has none) and seed, in a stable order."""
    models = []
    for kind in s["pe"]:
        for sigma in (s["sigmas"] if kind in SIGMA_PES else [math.nan]):
            for seed in model_seeds(s["seeds"]):
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


def load_task(s: dict):
    """The task object train_pack needs; a problem with the user's files or a missing data package becomes a
    UsageError (one line, exit 2)."""
    if s["task"] == "lst":
        from pe_fast.tasks.lst import LSTTask, PuzzleFileError
        try:
            return LSTTask(train_path=s.get("lst_train"), ood_path=s.get("lst_ood"))
        except PuzzleFileError as error:
            raise UsageError(str(error))
    from pe_fast.data import DataError
    from pe_fast.tasks.masked_regions import MaskedRegionTask
    try:
        data = load_region_data(s)
        return MaskedRegionTask(data, s["task"], mask_fraction=s["mask_fraction"], window=s["window"],
                                split=s["split"])
    except (DataError, ValueError) as error:
        raise UsageError(str(error))


def load_region_data(s: dict):
    if s["task"] == "netsim":
        from pe_fast.data.netsim import simulate_network
        network = {k: s[k] for k in NETSIM_FLAGS if s.get(k) is not None and k != "netsim_seed"}
        return simulate_network(**network, seed=s.get("netsim_seed") or 0)
    if s["data"]:
        from pe_fast.data.user_data import load_user_data
        return load_user_data(s["data"], regions=s["regions"], parcellation=s["parcellation"])
    from pe_fast.data import brain_atlas
    if s["atlas"] == "glasser360":
        return brain_atlas.load_glasser360_surrogate()
    return brain_atlas.load_schaefer100_hcp()


def choose_pack_size(s: dict, task) -> int:
    """--max-pack if given, else as many models as fit in half the device's free memory (pe_fast.memory)."""
    if s["max_pack"]:
        return s["max_pack"]
    device = torch.device(s["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        return 64  # a Ray cluster's GPU, not visible from here: a pack size that fits any current GPU
    from pe_fast.ops.pe_attention import resolve_backend
    config = model_config(s, task, s["pe"][0])
    per_model = memory.bytes_per_model(config, s["batch_size"], s["optimizer"],
                                       resolve_backend(s["backend"], device), task.coordinates)
    return memory.pack_size(per_model, memory.free_bytes(device))


class Progress:
    """One line on stderr: packs and models done, model-steps per second, ETA. Redrawn at most once a second
    (every 30 s when stderr is not a terminal). The rate counts the steps trained by this process only (not the
    packs a resumed sweep found finished or checkpointed), so the ETA holds for resumes and for Ray."""

    def __init__(self, packs: list[list[dict]], steps: int, finished: set[int]):
        self.num_packs, self.num_models, self.steps = len(packs), sum(len(p) for p in packs), steps
        self.total = self.num_models * steps
        self.packs_done = len(finished)
        self.models_done = sum(len(packs[i]) for i in finished)
        self.trained = 0  # model-steps trained by this process in finished packs
        self.pack, self.size, self.first_step, self.step = None, 0, None, 0  # the pack training here, if any
        self.start = self.last_draw = time.perf_counter()  # no rate before a second of work
        self.tty = sys.stderr.isatty()

    def start_pack(self, index: int, size: int):
        self.pack, self.size, self.first_step, self.step = index, size, None, 0

    def update(self, step: int, force: bool = False):
        """The running pack has done `step` steps (the first call after a resume tells where it started)."""
        if self.first_step is None:
            self.first_step = step - 1
        self.step = step
        self.draw(force)

    def finish_pack(self, size: int, trained_steps: int):
        self.packs_done += 1
        self.models_done += size
        self.trained += size * trained_steps
        self.pack = None
        self.draw(force=True)

    def draw(self, force: bool = False):
        now = time.perf_counter()
        if not force and now - self.last_draw < (1.0 if self.tty else 30.0):
            return
        self.last_draw = now
        running = self.size * (self.step - self.first_step) if self.pack is not None and self.first_step is not None \
            else 0
        rate = (self.trained + running) / max(now - self.start, 1e-9)
        done = self.models_done * self.steps + (self.size * self.step if self.pack is not None else 0)
        eta = f"{(self.total - done) / rate / 60:.1f} min" if rate > 0 else "?"
        line = (f"packs {self.packs_done}/{self.num_packs}  models {self.models_done}/{self.num_models}  "
                f"{rate:,.0f} model-steps/s  ETA {eta}")
        if self.pack is not None:
            line += f"  (pack {self.pack}: step {self.step}/{self.steps})"
        print(("\r" + line + "\033[K") if self.tty else line, end="" if self.tty else "\n", file=sys.stderr,
              flush=True)

    def close(self):
        if self.tty:
            print(file=sys.stderr)


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean ± sd over seeds for each (PE, σ)."""
    metrics = [c for c in ("train_acc", "test_acc", "ood_acc", "ood_acc_binary", "ood_acc_ternary",
                           "ood_acc_quaternary", "pe_rsa", "train_mse", "test_mse", "test_r2", "pe_fc_corr",
                           "pe_coupling_corr", "pe_modularity", "pe_segregation", "pe_dist_spearman")
               if c in results]
    rows = []
    for (pe, sigma), group in results.groupby(["pe", "sigma"], dropna=False, sort=False):
        row = {"pe": pe, "sigma": "" if math.isnan(sigma) else f"{sigma:g}", "seeds": len(group)}
        for metric in metrics:
            values = group[metric].to_numpy(dtype=float)
            scale = 100.0 if metric.endswith("acc") or "_acc_" in metric else 1.0
            digits = 1 if scale == 100.0 else 3
            row[metric] = f"{np.nanmean(values) * scale:.{digits}f} ± {np.nanstd(values) * scale:.{digits}f}" \
                if np.isfinite(values).any() else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def model_config(s: dict, task, kind: str) -> ModelConfig:
    return ModelConfig(num_tokens=task.num_tokens, token_dim=task.token_dim, out_dim=task.num_classes,
                       width=s["width"], depth=s["depth"], heads=s["heads"], mlp_width=s["mlp_width"], pe=kind,
                       pe_at=s["pe_at"], readout_token=task.readout_token)


def train_config(s: dict) -> TrainConfig:
    return TrainConfig(steps=s["steps"], batch_size=s["batch_size"], lr=s["lr"], optimizer=s["optimizer"],
                       weight_decay=s["weight_decay"], momentum=s["momentum"], schedule=s["schedule"],
                       warmup=s["warmup"], eval_every=s["eval_every"], eval_items=s["eval_items"],
                       precision=s["precision"], compile=s["compile"] == "on")


def train_and_store_pack(s: dict, index: int, pack: list[dict], out: Path, task,
                         on_step=None) -> dict:
    """Train pack `index` (from its checkpoint, if it has one), checkpointing as it goes, and write
    DIR/packs/<index>/. The unit of work of both executors. Returns {index, models, trained_steps}."""
    trainer = PackTrainer(task, model_config(s, task, pack[0]["pe"]), train_config(s), [m["seed"] for m in pack],
                          [1.0 if math.isnan(m["sigma"]) else m["sigma"] for m in pack], torch.device(s["device"]))
    state = run_folder.load_checkpoint(out, index)
    if state is not None:
        trainer.load_state_dict(state)
    first_step = trainer.step
    result = trainer.run(on_step, checkpoint=lambda: run_folder.save_checkpoint(out, index, trainer.state_dict()),
                         checkpoint_every=s["checkpoint_every"])
    final_rows, curve_rows, pe_tables = [], [], {}
    for local, model in enumerate(pack):
        identity = dict(task=s["task"], **model, steps=s["steps"], precision=s["precision"], pack=index)
        final_rows.append({**identity, **{k: v for k, v in result.final[local].items() if k not in ("model", "step")},
                           "train_seconds": result.seconds / len(pack)})
        curve_rows.extend({**identity, **{k: v for k, v in row.items() if k != "model"}}
                          for row in result.curves if row["model"] == local)
        if local in result.pe_tables:
            pe_tables[f"model_{model['model_id']}"] = result.pe_tables[local]
    run_folder.write_pack(out, index, pd.DataFrame(final_rows), pd.DataFrame(curve_rows), pe_tables)
    return {"index": index, "models": len(pack), "trained_steps": s["steps"] - first_step}


@functools.lru_cache(maxsize=2)
def _cached_task(settings_json: str):
    return load_task(json.loads(settings_json))


def ray_pack_task(s: dict, index: int, pack: list[dict], out: str) -> dict:
    """The body of one Ray task: a worker loads the task (once per worker process) and trains one pack."""
    apply_runtime(s)
    task = _cached_task(json.dumps(s, sort_keys=True, default=str))
    return train_and_store_pack(s, index, pack, Path(out), task)


def run_local(s: dict, todo: list[int], packs: list[list[dict]], out: Path, task, progress: Progress):
    for index in todo:
        progress.start_pack(index, len(packs[index]))
        done = train_and_store_pack(s, index, packs[index], out, task, on_step=progress.update)
        progress.finish_pack(done["models"], done["trained_steps"])


def run_ray(s: dict, todo: list[int], packs: list[list[dict]], out: Path, progress: Progress):
    """Each pack is one Ray task with its CPUs (--threads, default 1) or one GPU; the workers write the pack
    folders themselves (on a cluster, --out must be a folder every node sees). Tasks are gathered as they end."""
    import ray
    if not ray.is_initialized():
        ray.init(address=s["ray_address"], include_dashboard=False, log_to_driver=False)
    gpus = 1 if s["device"] == "cuda" else 0
    remote = ray.remote(num_cpus=s["threads"] or 1, num_gpus=gpus, max_retries=0)(ray_pack_task)
    settings = {**s, "threads": s["threads"] or 1}
    pending = [remote.remote(settings, index, packs[index], str(out.resolve())) for index in todo]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        done = ray.get(ready[0])
        progress.finish_pack(done["models"], done["trained_steps"])


def pack_models(s: dict, models: list[dict]) -> list[list[dict]]:
    """The packs as config.json lists them (by model_id), or a new split for a new sweep."""
    if "packs" in s:
        return [[models[i] for i in ids] for ids in s["packs"]]
    return split_into_packs(models, s["max_pack"])


def start_folder(s: dict, out: Path, task, models: list[dict], packs: list[list[dict]]):
    """config.json (and the ground truth of region tasks) at the start, so that the report can read a sweep
    while it runs and --resume can continue it."""
    pack_of = {m["model_id"]: index for index, pack in enumerate(packs) for m in pack}
    settings = {k: v for k, v in s.items() if k != "packs"}
    config = {"settings": settings, "task": task.description, "torch": torch.__version__,
              "models": [{**m, "pack": pack_of[m["model_id"]]} for m in models],
              "packs": [[m["model_id"] for m in pack] for pack in packs],
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    run_folder.write_json(out / "config.json", config)
    if hasattr(task, "baselines"):
        data = task.data
        ground_truth = {"fc": data.fc, "labels": np.asarray(data.labels, dtype=str)}
        for name in ("networks", "centroids", "coupling"):
            if getattr(data, name) is not None:
                ground_truth[name] = getattr(data, name)
        run_folder.write_atomic(out / "ground_truth.npz", lambda tmp: save_npz(tmp, ground_truth))


def save_npz(path: Path, arrays: dict):
    with open(path, "wb") as file:  # a file object: np.savez would add ".npz" to the temporary name
        np.savez_compressed(file, **arrays)


def finish_folder(s: dict, out: Path, task, models: list[dict], num_packs: int) -> pd.DataFrame:
    """Every pack together in the top-level files; results.parquet last (its presence means finished)."""
    results, curves, pe_tables = run_folder.read_packs(out, num_packs)
    if hasattr(task, "baselines"):
        rows = [dict(task=s["task"], model_id=len(models) + i, seed=math.nan, steps=0, pack=-1, **row)
                for i, row in enumerate(task.baselines())]
        results = pd.concat([results, pd.DataFrame(rows)], ignore_index=True)
        # Whether the series are real fMRI, simulated from real FC, or a simulated network: never mix them up.
        results.insert(1, "data_kind", task.data.kind)
    run_folder.write_atomic(out / "pe_tables.npz", lambda tmp: save_npz(tmp, pe_tables))
    run_folder.write_atomic(out / "curves.parquet", lambda tmp: curves.to_parquet(tmp, index=False))
    table = summary_table(results)
    run_folder.write_atomic(out / "summary.txt", lambda tmp: tmp.write_text(table.to_string(index=False) + "\n"))
    run_folder.write_atomic(out / "results.parquet", lambda tmp: results.to_parquet(tmp, index=False))
    return table


def run(s: dict) -> Path:
    resume = "packs" in s
    out = Path(s["out"]) if s.get("out") else Path("runs") / f"{s['task']}-{time.strftime('%Y%m%d-%H%M%S')}"
    s["out"] = str(out)
    holder = run_folder.lock_holder(out) if out.is_dir() else None
    if holder is not None:
        raise UsageError(f"{out} is being written by another sweep ({run_folder.describe(holder)}); "
                         f"wait for it or stop it")
    if not resume and out.exists() and any(out.iterdir()):
        hint = f"; to continue it: --resume --out {out}" if (out / "config.json").is_file() else ""
        raise UsageError(f"--out {out} already exists and is not empty; choose a new folder{hint}")
    if resume and (out / "results.parquet").is_file():
        print(f"{out} is finished; nothing to resume", file=sys.stderr)
        return out
    apply_runtime(s)
    task = load_task(s)
    models = expand_grid(s)
    if not resume:
        how = "--max-pack" if s["max_pack"] else f"fits half the free memory of {s['device']}"
        s["max_pack"] = choose_pack_size(s, task)
        print(f"pe_fast sweep: pack size {s['max_pack']} ({how})", file=sys.stderr)
    packs = pack_models(s, models)
    s["packs"] = [[m["model_id"] for m in pack] for pack in packs]
    try:
        run_folder.acquire_lock(out, notice=lambda line: print(f"note: {line}", file=sys.stderr))
    except run_folder.FolderLocked as error:
        raise UsageError(str(error))
    try:
        if not resume:
            start_folder(s, out, task, models, packs)
        run_folder.remove_partials(out)
        finished = run_folder.finished_packs(out)
        todo = [i for i in range(len(packs)) if i not in finished]
        if hasattr(task, "data"):
            print(f"data: {task.data.kind}: {task.data.source}", file=sys.stderr)
        print(f"pe_fast sweep: task {s['task']}, {len(models)} models in {len(packs)} packs "
              f"({len(finished)} finished before), {s['steps']} steps each, on {s['device']} "
              f"({s['executor']}, {s['threads'] or torch.get_num_threads()} threads, {s['precision']}"
              f"{', compiled' if s['compile'] == 'on' else ''})",
              file=sys.stderr)
        progress = Progress(packs, s["steps"], finished)
        if s["executor"] == "ray":
            run_ray(s, todo, packs, out, progress)
        else:
            run_local(s, todo, packs, out, task, progress)
        progress.close()
        table = finish_folder(s, out, task, models, len(packs))
    finally:
        run_folder.release_lock(out)
    print(table.to_string(index=False))
    if not s.get("no_report"):
        try:
            from pe_fast.report import write_report
            write_report(out)
        except Exception as error:  # the results are safe; the report can be rerun with python -m pe_fast.report
            print(f"warning: the report failed ({type(error).__name__}: {error}); the results are complete; "
                  f"rerun: python -m pe_fast.report {out}", file=sys.stderr)
    print(f"results written to {out}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with one line on an unknown flag
    settings = {}
    try:
        settings = resume_settings(args) if args.resume else resolve_settings(args)
        run(settings)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        out = settings.get("out") or "DIR"
        print(f"\ninterrupted; the finished packs and checkpoints are kept: continue with "
              f"python -m pe_fast.sweep --resume --out {out}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
