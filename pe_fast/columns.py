"""The names of the result columns pe_fast generates, built and read here only: the tasks, the trainer and the
rich/lazy probe write them, the report and the live curves read them back, through these functions
(results.parquet, curves.parquet and the TensorBoard tags hold them).

Task scores: {split}_{metric} (test_r2, ood_acc), and an accuracy on one condition's items {split}_acc_{condition}
(ood_acc_binary); what a metric means for the report and the stopping rule (lower is better, shown in percent) is
said once, in METRICS.

Attention statistics: {prefix}_l{layer}_h{head}_{stat}, prefix "attn" for the training window's and "{split}_attn"
for a split's (test_attn, ood_attn), stat one of the op's STAT_NAMES or probe_{name} for a probe's mass.
"""
from __future__ import annotations

import dataclasses
import re

ACCURACY, MSE, R2 = "acc", "mse", "r2"
# metric -> (lower is better, shown in percent)
METRICS = {ACCURACY: (False, True), MSE: (True, False), R2: (False, False)}


def score(split: str, metric: str, condition: str | None = None) -> str:
    """A task's score column: test_r2, ood_acc, or ood_acc_binary (the accuracy on one condition's items)."""
    if metric not in METRICS or "_" in split:
        raise ValueError(f"no score column for split {split!r} and metric {metric!r}")
    return f"{split}_{metric}" if condition is None else f"{split}_{metric}_{condition}"


def _score_parts(column: str) -> tuple[str, str] | None:
    """(split, metric) of a score column, else None."""
    parts = column.split("_")
    return (parts[0], parts[1]) if len(parts) >= 2 and parts[1] in METRICS else None


def score_split(column: str) -> str:
    """The split a score column scores (test_r2 -> test)."""
    parts = _score_parts(column)
    if parts is None:
        raise ValueError(f"{column!r} is not a task's score column")
    return parts[0]


def lower_is_better(column: str) -> bool:
    """Whether a score improves as it falls (an MSE) rather than as it rises (an accuracy, an R²)."""
    parts = _score_parts(column)
    return parts is not None and METRICS[parts[1]][0]


def in_percent(column: str) -> bool:
    """Whether the report shows the column in percent (the accuracies)."""
    parts = _score_parts(column)
    return parts is not None and METRICS[parts[1]][1]


TRAINING_WINDOW = "attn"
PROBE = "probe_"
# the rich/lazy measures (pe_fast.metrics.rich_lazy and PackTrainer's pe_drift), in the report's order
PE_DRIFT = "pe_drift"
REPR_CHANGE = "repr_change"
ATTN_CHANGE = "attn_change"


def weight_drift(block: int) -> str:
    return f"weight_drift_b{block}"


RICH_LAZY = (PE_DRIFT, weight_drift(0), REPR_CHANGE, ATTN_CHANGE)
# the effective rank of what was learned: of the PE's change P_t − P_0 and of block b's weight changes W_t − W_0
PE_CHANGE_RANK = "dpe_rank"


def weight_change_rank(block: int) -> str:
    return f"dw_rank_b{block}"


# the empirical tangent kernel on the probe items (metrics/tangent_kernel.py), over all parameters and the PE alone
NTK_DISTANCE, NTK_VELOCITY, NTK_ALIGNMENT = "ntk_distance", "ntk_velocity", "ntk_alignment"
NTK_PE_DISTANCE, NTK_PE_VELOCITY, NTK_PE_ALIGNMENT = "ntk_pe_distance", "ntk_pe_velocity", "ntk_pe_alignment"
TANGENT_KERNEL = (NTK_DISTANCE, NTK_VELOCITY, NTK_ALIGNMENT, NTK_PE_DISTANCE, NTK_PE_VELOCITY, NTK_PE_ALIGNMENT)


def parse_change_rank_block(column: str) -> int | None:
    """The block of a weight_change_rank column, else None."""
    match = re.fullmatch(r"dw_rank_b(\d+)", column)
    return int(match.group(1)) if match else None


def attention_prefix(split: str | None = None) -> str:
    """The prefix of the attention statistics measured on a split, or in the training window (split None)."""
    return TRAINING_WINDOW if split is None else f"{split}_{TRAINING_WINDOW}"


def probe_stat(name: str) -> str:
    return f"{PROBE}{name}"


def attention_column(prefix: str, layer: int, head: int, stat: str) -> str:
    return f"{prefix}_l{layer}_h{head}_{stat}"


@dataclasses.dataclass(frozen=True)
class AttentionColumn:
    prefix: str
    layer: int
    head: int
    stat: str

    @property
    def probe(self) -> str | None:
        """The probe's name where the statistic is a probe's mass, else None."""
        return self.stat[len(PROBE):] if self.stat.startswith(PROBE) else None


_ATTENTION = re.compile(r"^(?P<prefix>\w+?)_l(?P<layer>\d+)_h(?P<head>\d+)_(?P<stat>.+)$")


def parse_attention_column(column: str) -> AttentionColumn | None:
    """attention_column's parts back, or None for any other column."""
    match = _ATTENTION.match(column)
    if match is None:
        return None
    return AttentionColumn(match["prefix"], int(match["layer"]), int(match["head"]), match["stat"])
