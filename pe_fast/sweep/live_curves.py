"""--tensorboard: every evaluation of every model as TensorBoard scalars, written while the sweep trains, so that
`tensorboard --logdir DIR/tensorboard` shows the curves live (curves.parquet only appears when a pack ends).

One TensorBoard run per model, named by what tells the models apart: DIR/tensorboard/<pe>/sigma=<σ>/seed=<seed>,
plus lr=…, weight_decay=…, momentum=…, optimizer=… where the sweep varies them; TensorBoard's run filter then
selects by PE, σ or seed with a regex. A tag is the results column's name, the attention statistics grouped
(attn/l0_h0_entropy, ood_attn/…). When a pack ends, each model's settings and final metrics go to the
hyperparameter plugin's table (metrics tagged final/…).

A resumed pack continues from its last checkpoint at step T; what a killed process logged after T is purged
(SummaryWriter's purge_step), so no step is shown twice.
"""
from __future__ import annotations

import math
from pathlib import Path

from pe_fast import columns
from pe_fast.results.summary import GRID_AXES

FOLDER = "tensorboard"


def run_name(model: dict, varying: tuple[str, ...]) -> str:
    sigma = model["sigma"]
    parts = [model["pe"], *([] if sigma is None or math.isnan(sigma) else [f"sigma={sigma:g}"]),
             *(f"{axis}={model[axis]:g}" if isinstance(model[axis], float) else f"{axis}={model[axis]}"
               for axis in varying), f"seed={model['seed']}"]
    return "/".join(parts)


def folder_problem(out: Path, models: list[dict], varying: tuple[str, ...]) -> str | None:
    """What in DIR/tensorboard is in the way of a model's run (a file where its folder goes), in words, or None: a
    resumed sweep met it after starting, and ended with the disk-full line (exit 1)."""
    for model in models:
        path = out / FOLDER
        for part in run_name(model, varying).split("/"):
            if (path.exists() or path.is_symlink()) and not path.is_dir():
                return f"{path} is not a folder; --tensorboard writes each model's curves under {out / FOLDER}: " \
                       f"move it away"
            path = path / part
    return None


def tag(column: str) -> str:
    """attn_l0_h0_entropy -> attn/l0_h0_entropy, ood_attn_l0_… -> ood_attn/l0_…; other columns as they are."""
    parsed = columns.parse_attention_column(column)
    return column if parsed is None else f"{parsed.prefix}/{column[len(parsed.prefix) + 1:]}"


def numbers(row: dict) -> dict[str, float]:
    """The row's finite numeric metrics (not its model index and step)."""
    return {k: float(v) for k, v in row.items() if k not in ("model", "step") and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


class LiveCurves:
    """The TensorBoard runs of one pack's models. evaluation(rows) after each evaluation (rows as PackTrainer
    returns them, `model` being the index in the pack); finish(final_rows) once, when the pack is done."""

    def __init__(self, out: Path, pack: list[dict], varying: tuple[str, ...], resumed_at: int):
        from torch.utils.tensorboard import SummaryWriter  # the optional extra: checked when the flags are read
        self.pack, self.varying = pack, varying
        purge = resumed_at + 1 if resumed_at else None  # hide what a killed run logged after its checkpoint
        self.writers = [SummaryWriter(str(out / FOLDER / run_name(m, varying)), purge_step=purge) for m in pack]

    def evaluation(self, rows: list[dict]):
        for row in rows:
            writer = self.writers[row["model"]]
            for column, value in numbers(row).items():
                writer.add_scalar(tag(column), value, row["step"])
        for writer in self.writers:
            writer.flush()

    def finish(self, final_rows: list[dict], step: int):
        for model, row, writer in zip(self.pack, final_rows, self.writers):
            settings = {"pe": model["pe"], "sigma": math.nan if model["sigma"] is None else model["sigma"],
                        "seed": model["seed"],
                        **{axis: math.nan if model.get(axis) is None else model[axis] for axis in GRID_AXES}}
            writer.add_hparams(settings, {f"final/{k}": v for k, v in numbers(row).items()}, run_name=".",
                               global_step=step)
            writer.close()


def varying_axes(s) -> tuple[str, ...]:
    """The grid axes the sweep's settings give more than one value."""
    return tuple(axis for axis in GRID_AXES if len(getattr(s, axis) or ()) > 1)
