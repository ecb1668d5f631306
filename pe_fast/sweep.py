"""`python -m pe_fast.sweep`: train a grid of PE types × σ × seeds as stacked packs and write a results folder.

    python -m pe_fast.sweep --task lst --pe learned,sin2d,none --sigmas 0.1,0.2,2.0 --seeds 3 --steps 2000 --out DIR

DIR gets config.json, results.parquet (one row per model), curves.parquet (one row per model and evaluation),
pe_tables.npz (each model's final PE tables). A user mistake stops with one line and exit code 2, before
anything is written.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pe_fast.models import PE_KINDS, ModelConfig
from pe_fast.train import OPTIMIZERS, SCHEDULES, TrainConfig, train_pack

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
    "fmri": dict(pe="learned", sigmas="0.01,0.1,0.2,0.5,1,2", seeds=3, steps=1500, width=32, depth=2,
                 heads=1, batch_size=64, lr=3e-3, optimizer="adam", schedule="cosine", warmup=50,
                 eval_every=150, eval_items=512),
    "netsim": dict(pe="learned", sigmas="0.01,0.1,0.2,0.5,1,2", seeds=3, steps=1500, width=32, depth=2,
                   heads=1, batch_size=64, lr=3e-3, optimizer="adam", schedule="cosine", warmup=50,
                   eval_every=150, eval_items=512),
}
PRESETS = {
    "lst": {
        # Fits 2 CPU cores in about 15 minutes and shows the paper's effect (docs/reproduction.md).
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
                threads=None, backend=None, max_pack=64, eval_items=2048, atlas="schaefer100", data=None, regions=None,
                parcellation=None, mask_fraction=0.2, window=1, split="subject")


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
    p.add_argument("--backend", help="pe_attention backend (default: the fastest available)")
    p.add_argument("--max-pack", type=int, help="at most this many models trained together")
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
    positive = ["seeds", "steps", "batch_size", "width", "depth", "heads", "eval_every", "eval_items", "max_pack"]
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
    if s["device"] == "auto":
        s["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    if s["device"] not in ("cpu", "cuda") or (s["device"] == "cuda" and not torch.cuda.is_available()):
        raise UsageError(f"--device {s['device']!r} is not available here (cpu{', cuda' if torch.cuda.is_available() else ''})")
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
        os.environ["PE_FAST_BACKEND"] = s["backend"]
    return s


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
    """Models that share an architecture (the PE kind) train together, at most max_pack at a time."""
    packs = []
    for kind in dict.fromkeys(m["pe"] for m in models):
        same = [m for m in models if m["pe"] == kind]
        packs.extend(same[i:i + max_pack] for i in range(0, len(same), max_pack))
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


class Progress:
    """One line on stderr: packs and models done, model-steps per second, ETA. Redrawn at most once a second."""

    def __init__(self, packs: list[list[dict]], steps: int):
        self.total = sum(len(p) for p in packs) * steps
        self.num_packs, self.num_models, self.steps = len(packs), sum(len(p) for p in packs), steps
        self.done_before, self.models_done, self.pack = 0, 0, 0
        self.start, self.last_draw = time.perf_counter(), 0.0  # started once the task's data is loaded
        self.tty = sys.stderr.isatty()

    def start_pack(self, index: int, size: int):
        self.pack, self.size = index, size

    def update(self, step: int, force: bool = False):
        now = time.perf_counter()
        if not force and now - self.last_draw < (1.0 if self.tty else 30.0):
            return
        self.last_draw = now
        done = self.done_before + step * self.size
        rate = done / max(now - self.start, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        line = (f"pack {self.pack + 1}/{self.num_packs}  models done {self.models_done}/{self.num_models}  "
                f"step {step}/{self.steps}  {rate:,.0f} model-steps/s  ETA {eta / 60:.1f} min")
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def finish_pack(self):
        self.models_done += self.size
        self.update(self.steps, force=True)
        self.done_before += self.steps * self.size
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


def run(s: dict) -> Path:
    out = Path(s["out"]) if s.get("out") else Path("runs") / f"{s['task']}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} already exists and is not empty; choose a new folder")
    if s["threads"]:
        torch.set_num_threads(s["threads"])
    task = load_task(s)
    models = expand_grid(s)
    packs = split_into_packs(models, s["max_pack"])
    device = torch.device(s["device"])
    train_config = TrainConfig(steps=s["steps"], batch_size=s["batch_size"], lr=s["lr"], optimizer=s["optimizer"],
                               weight_decay=s["weight_decay"], momentum=s["momentum"], schedule=s["schedule"],
                               warmup=s["warmup"], eval_every=s["eval_every"], eval_items=s["eval_items"])
    print(f"pe_fast sweep: task {s['task']}, {len(models)} models in {len(packs)} packs, {s['steps']} steps each, "
          f"on {device} ({torch.get_num_threads()} threads)", file=sys.stderr)

    # Results are assembled in a temporary folder beside the target and renamed into place at the end, so a
    # failed or killed run never leaves a half-written results folder.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        final_rows, curve_rows, pe_tables = [], [], {}
        progress = Progress(packs, s["steps"])
        for index, pack in enumerate(packs):
            progress.start_pack(index, len(pack))
            kind = pack[0]["pe"]
            config = ModelConfig(num_tokens=task.num_tokens, token_dim=task.token_dim, out_dim=task.num_classes,
                                 width=s["width"], depth=s["depth"], heads=s["heads"], mlp_width=s["mlp_width"],
                                 pe=kind, pe_at=s["pe_at"], readout_token=task.readout_token)
            result = train_pack(task, config, train_config, [m["seed"] for m in pack],
                                [1.0 if math.isnan(m["sigma"]) else m["sigma"] for m in pack], device,
                                on_step=progress.update)
            progress.finish_pack()
            for local, model in enumerate(pack):
                identity = dict(task=s["task"], **model, steps=s["steps"], pack=index)
                final_rows.append({**identity, **{k: v for k, v in result.final[local].items()
                                                   if k not in ("model", "step")},
                                   "train_seconds": result.seconds / len(pack)})
                curve_rows.extend({**identity, **{k: v for k, v in row.items() if k != "model"}}
                                  for row in result.curves if row["model"] == local)
                if local in result.pe_tables:
                    pe_tables[f"model_{model['model_id']}"] = result.pe_tables[local]
        if hasattr(task, "baselines"):
            for row in task.baselines():
                final_rows.append(dict(task=s["task"], model_id=len(models) + len(final_rows), seed=math.nan,
                                       steps=0, pack=-1, **row))
            data = task.data
            ground_truth = {"fc": data.fc, "labels": np.asarray(data.labels, dtype=str)}
            for name in ("networks", "centroids", "coupling"):
                if getattr(data, name) is not None:
                    ground_truth[name] = getattr(data, name)
            np.savez_compressed(staging / "ground_truth.npz", **ground_truth)
        results = pd.DataFrame(final_rows)
        results.to_parquet(staging / "results.parquet", index=False)
        pd.DataFrame(curve_rows).to_parquet(staging / "curves.parquet", index=False)
        np.savez_compressed(staging / "pe_tables.npz", **pe_tables)
        config = {"settings": s, "task": task.description, "torch": torch.__version__,
                  "models": models, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (staging / "config.json").write_text(json.dumps(config, indent=2, default=str))
        table = summary_table(results)
        (staging / "summary.txt").write_text(table.to_string(index=False) + "\n")
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(table.to_string(index=False))
    print(f"results written to {out}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with one line on an unknown flag
    try:
        run(resolve_settings(args))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
