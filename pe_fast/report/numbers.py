"""The report's numbers: per-(PE, σ) statistics, attention alignment against generalisation, the summary table
and the plain-language statement."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # the t quantile (scipy.stats's own, without its second of import)

from pe_fast import columns
from pe_fast.columns import lower_is_better
from pe_fast.metrics.convergence import FIT_THRESHOLD, MIN_EVALUATIONS, PLATEAU_TOLERANCE, quarter_gains
from pe_fast.metrics.correlation import spearman
from pe_fast.results.reading import Run
from pe_fast.results.summary import axis_label, is_baseline, sigma_label, varying_axes
from pe_fast.tasks.base import TaskView

def grouped(frame: pd.DataFrame, metric: str, axes: list[str] = ()) -> pd.DataFrame:
    """Mean, sd (population, as summary.txt) and count of a metric per (pe, σ, *axes), in the run's order; NaN
    skipped."""
    keys = ["pe", "sigma", *axes]
    rows = []
    for key, group in frame.groupby(keys, dropna=False, sort=False):
        values = group[metric].to_numpy(dtype=float) if metric in group else np.array([np.nan])
        values = values[np.isfinite(values)]
        rows.append(dict(zip(keys, key), mean=values.mean() if len(values) else np.nan,
                         sd=values.std() if len(values) else np.nan, n=len(values), models=len(group)))
    return pd.DataFrame(rows, columns=[*keys, "mean", "sd", "n", "models"])


def layer_head_mean(frame: pd.DataFrame, prefix: str, stat: str) -> pd.Series | None:
    """Mean over layers and heads of the columns {prefix}_l{l}_h{h}_{stat}; None when there are none."""
    chosen = [c for c in frame.columns
              if (parsed := columns.parse_attention_column(c)) and (parsed.prefix, parsed.stat) == (prefix, stat)]
    return frame[chosen].mean(axis=1) if chosen else None


def probe_names(frame: pd.DataFrame) -> list[str]:
    """The probes present, read from the attention columns (attn_l0_h0_probe_<name>)."""
    names = [parsed.probe for c in frame.columns
             if (parsed := columns.parse_attention_column(c)) and parsed.probe is not None]
    return list(dict.fromkeys(names))


@dataclasses.dataclass
class Alignment:
    x: pd.Series            # per model: the alignment measure (probe mass, or attention-map alignment)
    y: pd.Series            # per model: the generalisation score
    rho: float
    n: int
    source: str             # which columns x averages, for the caption


def alignment(results: pd.DataFrame, view: TaskView) -> Alignment | None:
    """Attention mass on the task's ground-truth probe against generalisation, across all models. The attention
    is taken on the split the score comes from (ood_attn_* for ood_acc) when recorded, else the training window."""
    split = columns.score_split(view.score)
    for prefix in (columns.attention_prefix(split), columns.attention_prefix()):
        x = layer_head_mean(results, prefix, columns.probe_stat(view.probe))
        if x is not None and x.notna().any():
            break
    else:
        return None
    return against_score(results, x, view, columns.attention_column(prefix, "*", "*", columns.probe_stat(view.probe)))


def map_alignment(results: pd.DataFrame, view: TaskView) -> Alignment | None:
    """The paper's attention-map alignment: each model's mean attention maps against those of the task's
    ground-truth PE models (results' attn_map_alignment), against generalisation, across all models."""
    if view.reference_pe is None or "attn_map_alignment" not in results:
        return None
    return against_score(results, results["attn_map_alignment"].astype(float), view, "attn_map_alignment")


def against_score(results: pd.DataFrame, x: pd.Series, view: TaskView, source: str) -> Alignment | None:
    """Spearman ρ of a per-model measure x with the task's generalisation score, over the models that have both."""
    if view.score not in results:
        return None
    y = results[view.score].astype(float)
    keep = x.notna() & y.notna()
    x, y = x[keep], y[keep]
    n = len(x)
    rho = spearman(x, y) if n >= 3 else math.nan
    return Alignment(x, y, rho, n, source)


def fmt(value: float, digits: int = 3) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def summary_markdown(results: pd.DataFrame, view: TaskView) -> str:
    """Mean ± sd over seeds per (PE, σ, every optimizer axis that varies) of the task's main metrics, as a
    markdown table."""
    metrics = [m for m in view.summary if m in results and results[m].notna().any()]
    axes = varying_axes(results)
    per_metric = {m: grouped(results, m, axes) for m in metrics}
    keys = grouped(results, metrics[0] if metrics else "", axes)
    header = "| PE | σ | " + "".join(f"{a} | " for a in axes) + "models | " + " | ".join(metrics) + " |"
    lines = [header, "|" + "---|" * (3 + len(axes) + len(metrics))]
    for i, key in keys.iterrows():
        cells = []
        for m in metrics:
            row = per_metric[m].iloc[i]
            cells.append("–" if row.n == 0 else f"{fmt(row['mean'])} ± {fmt(row['sd'])}")
        lines.append(f"| {key.pe} | {sigma_label(key.sigma)} | " + "".join(f"{axis_label(a, key[a])} | " for a in axes)
                     + f"{int(key.models)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_difference(a: pd.Series, b: pd.Series | float) -> tuple[float, float, float, int] | None:
    """Mean of a − b over the seeds both have (a, b indexed by seed; b may be one number, e.g. a baseline) and its
    95 % t interval: (mean, low, high, seeds), or None with fewer than 2 seeds."""
    diff = (a - b).dropna()
    diff = diff[np.isfinite(diff)]
    if len(diff) < 2:
        return None
    half = stdtrit(len(diff) - 1, 0.975) * diff.std(ddof=1) / math.sqrt(len(diff))
    return diff.mean(), diff.mean() - half, diff.mean() + half, len(diff)


def fmt_paired(label: str, paired: tuple[float, float, float, int]) -> str:
    mean, low, high, n = paired
    return f"{label} {mean:+.3f} (95 % CI {low:+.3f} to {high:+.3f}, {n} seeds)"


def paired_statements(results: pd.DataFrame, score: str) -> list[str]:
    """Seed-paired differences, when the grid varies only PE and σ: each σ-PE's best σ against its largest, the
    learned PE against the random one at each σ both have, and the best (PE, σ) of all against each other PE kind's
    best (its σ, or the sinusoids and none without one) and each non-transformer reference."""
    models = results[~is_baseline(results["pe"])]
    if varying_axes(results) or "seed" not in models or score not in models:
        return []
    better = min if lower_is_better(score) else max
    by_seed = {key: group.set_index("seed")[score] for key, group in models.groupby(["pe", "sigma"], dropna=False)}
    means = {key: values.mean() for key, values in by_seed.items() if np.isfinite(values).any()}
    if not means:
        return []
    lines = []
    for pe in dict.fromkeys(models["pe"]):
        sigmas = sorted(k[1] for k in means if k[0] == pe and np.isfinite(k[1]))
        if len(sigmas) < 2:
            continue
        best = better(sigmas[:-1], key=lambda sigma: means[(pe, sigma)])
        if (paired := paired_difference(by_seed[(pe, best)], by_seed[(pe, sigmas[-1])])) is not None:
            lines.append(fmt_paired(f"{pe} σ={best:g} − σ={sigmas[-1]:g}:", paired))
    # A random PE is the same seed's learned PE at initialisation, never trained (tests/test_pe.py): the paired
    # difference is what training the PE added.
    for sigma in sorted(s for pe, s in means if pe == "random" and ("learned", s) in means):
        if (paired := paired_difference(by_seed[("learned", sigma)], by_seed[("random", sigma)])) is not None:
            lines.append(fmt_paired(f"learned − random (training the PE) at σ={sigma:g}:", paired))
    top = better(means, key=means.get)
    label = lambda key: key[0] + (f" σ={key[1]:g}" if np.isfinite(key[1]) else "")  # noqa: E731
    for pe in dict.fromkeys(models["pe"]):  # in the run's order
        if pe == top[0] or not any(key[0] == pe for key in means):
            continue
        best = better((key for key in means if key[0] == pe), key=means.get)
        if best[1] == top[1] and {top[0], best[0]} == {"learned", "random"}:
            continue  # the learned − random line at that σ above
        if (paired := paired_difference(by_seed[top], by_seed[best])) is not None:
            lines.append(fmt_paired(f"{label(top)} − {label(best)}:", paired))
    for row in results[is_baseline(results["pe"])].itertuples():
        reference = getattr(row, score)
        if np.isfinite(reference) and (paired := paired_difference(by_seed[top], float(reference))) is not None:
            lines.append(fmt_paired(f"{label(top)} − {row.pe}:", paired))
    return lines


def statement(run: Run, view: TaskView, checks: list[Convergence]) -> str:
    """One plain paragraph of what the numbers show, every figure computed here from the results; the verdicts of
    PE kinds whose convergence checks failed are marked provisional."""
    results = run.results
    models = results[~is_baseline(results["pe"])]
    parts = []
    score = view.score
    if score not in results:
        return f"The results hold no {score} column, so there is nothing to compare yet."
    provisional = {c.pe for c in checks if not c.converged}
    for pe in dict.fromkeys(models["pe"]):
        start = len(parts)
        rows = models[models["pe"] == pe]
        g = grouped(rows, score).dropna(subset=["mean"])
        if g.empty:
            continue
        if g["sigma"].notna().all() and len(g) >= 2:
            lo, hi = g.loc[g["sigma"].idxmin()], g.loc[g["sigma"].idxmax()]
            best = g.loc[g["mean"].idxmin()] if lower_is_better(score) else g.loc[g["mean"].idxmax()]
            text = (f"{pe} PE: σ={lo.sigma:g} {score} {fmt(lo['mean'])} ± {fmt(lo.sd)} vs σ={hi.sigma:g} "
                    f"{fmt(hi['mean'])} ± {fmt(hi.sd)} (best mean at σ={best.sigma:g}, {fmt(best['mean'])})")
            per_model = rows[["sigma", score]].dropna()
            if per_model["sigma"].nunique() >= 2:
                rho = spearman(per_model["sigma"], per_model[score])
                text += f"; Spearman ρ(σ, {score}) = {fmt(rho, 2)} over {len(per_model)} models"
            if view.fit and view.fit in rows:
                fit = grouped(rows, view.fit).dropna(subset=["mean"])
                if len(fit) >= 2:
                    f_lo, f_hi = fit.loc[fit["sigma"].idxmin()], fit.loc[fit["sigma"].idxmax()]
                    text += (f"; {view.fit} {fmt(f_lo['mean'])} at σ={f_lo.sigma:g} and {fmt(f_hi['mean'])} "
                             f"at σ={f_hi.sigma:g}")
            for metric in view.similarity[:1]:
                sim = grouped(rows, metric).dropna(subset=["mean"])
                if len(sim) >= 2:
                    s_lo, s_hi = sim.loc[sim["sigma"].idxmin()], sim.loc[sim["sigma"].idxmax()]
                    text += (f"; {metric} {fmt(s_lo['mean'])} at σ={s_lo.sigma:g} "
                             f"and {fmt(s_hi['mean'])} at σ={s_hi.sigma:g}")
            parts.append(text + ".")
        else:
            desc = ", ".join((f"σ={r.sigma:g} " if np.isfinite(r.sigma) else "") + f"{fmt(r.mean)} ± {fmt(r.sd)}"
                             for r in g.itertuples())
            parts.append(f"{pe}: {score} {desc}.")
        if pe in provisional and len(parts) > start:  # a finding only once the curves have flattened
            parts[start] = "Provisional, not converged: " + parts[start]
    baselines = results[is_baseline(results["pe"])]
    if not baselines.empty:
        g = grouped(baselines, score).dropna(subset=["mean"])
        if not g.empty:
            parts.append("Non-transformer references: " + ", ".join(
                f"{r.pe} {fmt(r.mean)}" for r in g.itertuples()) + f" ({score}).")
    if paired := paired_statements(results, score):
        parts.append(f"Paired by seed ({score}): " + "; ".join(paired) + ".")
    return " ".join(parts) if parts else f"No model has a finite {score} yet."


# ---- convergence: whether the verdicts are those of trained models ----

MOVING_LR = 0.5  # a plateau (metrics.convergence) counts where the learning rate was at least this fraction of its peak


@dataclasses.dataclass
class Convergence:
    pe: str
    # who: "σ=0.1" (with the optimizer axes that vary: "σ=0.1, lr=0.003"), or "it" for a PE without σ
    still_improving: list[tuple[str, float, int | None]]  # (who, gain over the last quarter, more steps or None)
    unfit: list[tuple[str, float]]                          # (who, final training fit)
    too_short: bool                                           # too few evaluations to tell
    decayed: float | None = None  # the learning rate over the last quarter as a fraction of its peak, when so low
    #                               that a flat end may be the schedule's rather than a plateau

    @property
    def converged(self) -> bool:
        return not (self.still_improving or self.unfit or self.too_short or self.decayed is not None)


def _value_at(curve: pd.Series, step: float) -> float:
    """The curve (indexed by step) at its last evaluation at or before `step`."""
    return float(curve[curve.index <= step].iloc[-1])


def convergence(curves: pd.DataFrame, view: TaskView) -> list[Convergence]:
    """Per PE kind: which σ (and value of each optimizer axis that varies) still gained more than
    PLATEAU_TOLERANCE in the generalisation score over the last quarter of training (and, where the quarter
    before gained more, how many more steps a geometric slow-down of the gains suggests until a quarter gains
    less), and which do not fit their training set."""
    score, lower = view.score, lower_is_better(view.score)
    if curves.empty or score not in curves or "step" not in curves:
        return []
    rows = curves[~is_baseline(curves["pe"])]
    axes = varying_axes(rows)
    out = []
    for pe in dict.fromkeys(rows["pe"]):
        of_pe = rows[rows["pe"] == pe]
        result = Convergence(pe, [], [], False)
        for key, group in of_pe.groupby(["sigma", *axes], dropna=False, sort=False):
            who = _who(key[0], dict(zip(axes, key[1:])))
            curve = group.groupby("step")[score].mean().dropna().sort_index()
            end = curve.index.max() if len(curve) else 0
            if len(curve) < MIN_EVALUATIONS or end <= 0:
                result.too_short = True
                continue
            last, before = quarter_gains(curve.index, curve.to_numpy(), lower)
            if "lr_last" in group:  # the rate at each evaluation
                lr = group.groupby("step")["lr_last"].mean().sort_index()
                fraction = _value_at(lr, 0.75 * end) / lr.max() if lr.max() > 0 else 1.0
                if fraction < MOVING_LR and last <= PLATEAU_TOLERANCE:
                    result.decayed = min(fraction, result.decayed if result.decayed is not None else 1.0)
            if last > PLATEAU_TOLERANCE:
                more = None
                # slowing down by last/before a quarter (clearly: a ratio near 1 gives no estimate): quarters
                # until one gains no more than the tolerance
                if 0 < last < 0.9 * before:
                    quarters = math.ceil(math.log(PLATEAU_TOLERANCE / last) / math.log(last / before) - 1e-9)
                    more = int(quarters * end / 4)
                result.still_improving.append((who, last, more))
            if view.fit and view.fit in group:
                fit = group.groupby("step")[view.fit].mean().dropna().sort_index()
                if len(fit) and fit.iloc[-1] < FIT_THRESHOLD:
                    result.unfit.append((who, float(fit.iloc[-1])))
        out.append(result)
    return out


def _who(sigma: float, axes: dict) -> str:
    parts = ([f"σ={sigma:g}"] if np.isfinite(sigma) else []) + [f"{a}={axis_label(a, v)}" for a, v in axes.items()]
    return ", ".join(parts) or "it"


def stopping_lines(results: pd.DataFrame, budget: int | None) -> list[str]:
    """When each pack stopped and why (--until converged); none for sweeps from before the column."""
    if "stopped" not in results:
        return []
    lines = []
    for pack, rows in results[~is_baseline(results["pe"])].groupby("pack", sort=True):
        step, why = int(rows["steps"].max()), rows["stopped"].iloc[0]
        of = f" of {budget:,}" if budget else ""
        what = ("every model's score had levelled off" if why == "converged" else "the step budget (--steps)")
        lines.append(f"* pack {pack} ({', '.join(dict.fromkeys(rows['pe']))}, {len(rows)} models): stopped at step "
                     f"{step:,}{of}: {what}.")
    return lines


def convergence_lines(checks: list[Convergence], view: TaskView) -> list[str]:
    """One line per PE kind for the top of report.md."""
    lines = []
    for c in checks:
        if c.converged:
            lines.append(f"* **{c.pe}: converged**: every σ's {view.score} moved less than {PLATEAU_TOLERANCE:g} "
                         f"over the last quarter of training" + (" and it fits its training set." if view.fit
                                                                  else "."))
            continue
        reasons = []
        if c.too_short:
            reasons.append(f"too few evaluations to tell (fewer than {MIN_EVALUATIONS})")
        if c.decayed is not None:
            reasons.append(f"flat over the last quarter, but at a learning rate down to {100 * c.decayed:.0f} % of "
                           f"its peak (a cosine schedule's end): a plateau of the schedule, not shown to be the "
                           f"model's; a longer or constant-rate run would tell")
        for who, gain, more in c.still_improving:
            hint = (f"the slowing gains suggest about {more:,} more steps" if more is not None
                    else "its gains are not slowing: train at least twice as long")
            reasons.append(f"{who} still gained {gain:.3f} {view.score} in the last quarter ({hint})")
        for who, fit in c.unfit:
            reasons.append(f"{who} does not fit its training set ({view.fit} {fit:.3f})")
        lines.append(f"* **{c.pe}: not converged**: " + "; ".join(reasons) + ". Its verdicts below are provisional.")
    return lines
