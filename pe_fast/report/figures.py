"""The report's figures (matplotlib, PNG files only)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window; must precede pyplot
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D

from pe_fast import columns
from pe_fast.results import run_folder
from pe_fast.metrics import gradients as gradient_metrics
from pe_fast.metrics import pe_geometry
from pe_fast.report import brain_maps
from pe_fast.report.numbers import Alignment, fmt, grouped, layer_head_mean, probe_names
from pe_fast.results.reading import Run, read_npz
from pe_fast.results.summary import is_baseline, varying_axes
from pe_fast.tasks.base import TaskView



class Styles:
    """One colour per PE kind (σ-vs-metric plots) and one colour per σ (over-training plots), fixed per run."""

    def __init__(self, results: pd.DataFrame):
        kinds = list(dict.fromkeys(results["pe"]))
        palette = plt.get_cmap("tab10").colors
        self.kind_colour = {k: palette[i % len(palette)] for i, k in enumerate(kinds)}
        sigmas = results["sigma"].dropna()
        lo, hi = (sigmas.min(), sigmas.max()) if len(sigmas) else (1.0, 1.0)
        self.norm = LogNorm(vmin=lo / 1.2 if lo == hi else lo, vmax=hi * 1.2 if lo == hi else hi)
        self.cmap = plt.get_cmap("viridis")
        sigma_kinds = [k for k in kinds if results.loc[results["pe"] == k, "sigma"].notna().any()]
        self.dash = {k: ("-", ":", "-.")[i % 3] for i, k in enumerate(sigma_kinds)}
        # A legend entry per σ when few; a colour bar when many (a paper sweep has 20).
        self.colour_bar = sigmas.nunique() > 8

    def by_sigma(self, pe: str, sigma: float) -> dict:
        if np.isfinite(sigma):
            label = f"{pe} (colour = σ)" if self.colour_bar else f"{pe} σ={sigma:g}"
            return dict(color=self.cmap(self.norm(sigma)), linestyle=self.dash.get(pe, "-"), label=label)
        return dict(color=self.kind_colour[pe], linestyle="--", label=pe)

    def add_colour_bar(self, fig, axes):
        if self.colour_bar:
            bar = fig.colorbar(plt.cm.ScalarMappable(norm=self.norm, cmap=self.cmap), ax=axes, aspect=30,
                               label="σ of the PE's initialisation")
            set_sigma_ticks(bar.ax.yaxis, self.norm.vmin, self.norm.vmax)


def set_sigma_ticks(axis, lo: float, hi: float, values=None):
    """Plain-number ticks on a log σ axis: the σ values themselves when few, else 1-2-5 steps."""
    if values is None or not 0 < len(values) <= 8:
        values = [v * 10.0 ** e for e in range(-3, 3) for v in (1, 2, 5) if lo <= v * 10.0 ** e <= hi]
    axis.set_ticks(values)
    axis.set_ticklabels([f"{v:g}" for v in values])
    axis.set_minor_locator(matplotlib.ticker.NullLocator())


def panel_grid(count: int, width: float = 4.6, height: float = 3.6):
    cols = 2 if count == 4 else min(count, 3)
    width = 6.4 if count == 1 else width
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.6), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def figure_legend(fig, axes, extra=()):
    """One legend below all panels, one entry per label."""
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    handles.update({h.get_label(): h for h in extra})
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=min(4, len(handles)),
                   frameon=False)


def save(fig, path: Path):
    """Written atomically: a reader (a browser on a running sweep's report) never sees half a PNG. An absolute
    path (the report's: its folder's links resolved once) is followed from the root through no link."""
    try:  # tight: a long title is never clipped
        run_folder.write_atomic(path, lambda file: fig.savefig(file, dpi=100, format="png", bbox_inches="tight"),
                                under=run_folder.no_link_on_the_way(path))
    finally:
        plt.close(fig)


def metric_vs_sigma(results: pd.DataFrame, metrics: list[str], styles: Styles, title: str, path: Path):
    """Mean ± sd over seeds of each metric against σ, one line per σ-PE; σ-less PEs as bands (mean ± sd),
    baselines as dashed reference lines. With no σ at all, a point per PE."""
    models = results[~is_baseline(results["pe"])]
    baselines = results[is_baseline(results["pe"])]
    sigmas = np.sort(models["sigma"].dropna().unique())
    fig, axes = panel_grid(len(metrics))
    baseline_style = dict(color="0.35", linestyle=(0, (4, 2)), linewidth=1.2)
    for ax, metric in zip(axes, metrics):
        g = grouped(models, metric).dropna(subset=["mean"])
        if len(sigmas):
            for pe in dict.fromkeys(g["pe"]):
                rows = g[g["pe"] == pe].sort_values("sigma")
                colour = styles.kind_colour[pe]
                if rows["sigma"].notna().all():
                    ax.errorbar(rows["sigma"], rows["mean"], yerr=rows["sd"], color=colour, marker="o",
                                capsize=3, label=f"{pe} (mean ± sd over seeds)")
                else:
                    row = rows.iloc[0]
                    ax.axhspan(row["mean"] - row.sd, row["mean"] + row.sd, color=colour, alpha=0.15)
                    ax.axhline(row["mean"], color=colour, linestyle="--", label=f"{pe} (no σ; band = ± sd)")
            ax.set_xscale("log")
            ax.set_xlabel("σ of the PE's N(0, σ²) initialisation (log scale)")
            set_sigma_ticks(ax.xaxis, sigmas[0], sigmas[-1], sigmas)
        else:
            positions = np.arange(len(g))
            ax.errorbar(positions, g["mean"], yerr=g["sd"], fmt="o", capsize=4, color="k")
            ax.set_xticks(positions)
            ax.set_xticklabels(g["pe"])
            ax.set_xlim(-0.7, len(g) - 0.3)
            ax.set_xlabel("PE (no σ in this run; mean ± sd over seeds)")
        for r in grouped(baselines, metric).dropna(subset=["mean"]).itertuples():
            ax.axhline(r.mean, **baseline_style)
            ax.annotate(r.pe, (0.01, r.mean), xycoords=("axes fraction", "data"), fontsize=7, color="0.25",
                        va="bottom")
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    extra = [Line2D([], [], **baseline_style, label="non-transformer baseline")] if len(baselines) else []
    figure_legend(fig, axes, extra)
    fig.suptitle(title)
    save(fig, path)


def alignment_figure(results: pd.DataFrame, align: Alignment, view: TaskView, styles: Styles, path: Path):
    fig, ax = plt.subplots(figsize=(7.2, 5.6), layout="constrained")
    rows = results.loc[align.x.index]
    for (pe, sigma), idx in rows.groupby(["pe", "sigma"], dropna=False, sort=False).groups.items():
        style = styles.by_sigma(pe, sigma)
        ax.scatter(align.x[idx], align.y[idx], color=style["color"], label=style["label"], s=36,
                   marker="o" if np.isfinite(sigma) else "s", edgecolors="k", linewidths=0.4)
    ax.set_xlabel(f"attention mass on the {view.probe} probe\n(final, mean over layers and heads: "
                  f"{align.source})")
    ax.set_ylabel(view.score)
    ax.set_title(f"Attention alignment vs {view.score}: Spearman ρ = {fmt(align.rho, 2)} (n = {align.n} models)")
    ax.grid(alpha=0.3)
    styles.add_colour_bar(fig, ax)
    figure_legend(fig, [ax])
    save(fig, path)


def curves_by_sigma(curves: pd.DataFrame, panels: dict[str, pd.Series], styles: Styles, title: str, path: Path,
                    log_y: bool = False):
    """Each panel: a per-model series against the step, mean over seeds per (PE, σ), shaded ± sd unless there
    are so many σ that the bands would hide each other."""
    fig, axes = panel_grid(len(panels))
    shade = not styles.colour_bar
    for ax, (name, series) in zip(axes, panels.items()):
        frame = curves[["pe", "sigma", "step"]].assign(value=series).dropna(subset=["value"])
        if log_y:
            frame = frame[frame["value"] > 0]  # step 0 has drift 0 by definition
        for (pe, sigma), group in frame.groupby(["pe", "sigma"], dropna=False, sort=False):
            steps = group.groupby("step")["value"]
            mean, sd = steps.mean(), steps.std(ddof=0)  # population sd, as in the tables
            style = styles.by_sigma(pe, sigma)
            ax.plot(mean.index, mean, **style)
            if shade:
                ax.fill_between(mean.index, mean - sd, mean + sd, color=style["color"], alpha=0.15, linewidth=0)
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 5)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("training step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    styles.add_colour_bar(fig, axes)
    figure_legend(fig, axes)
    fig.suptitle(title + ("\n(line = mean over seeds, shade = ± sd)" if shade else "\n(line = mean over seeds)"))
    save(fig, path)


def chosen_models(results: pd.DataFrame, pe_tables: dict) -> list[pd.Series]:
    """The first-seed learned (else random) PE models at the smallest and the largest σ that have a table."""
    for kind in ("learned", "random"):
        rows = results[(results["pe"] == kind) & results["sigma"].notna()]
        rows = rows[[run_folder.pe_table_key(i) in pe_tables for i in rows["model_id"]]]
        if len(rows):
            rows = rows.sort_values(["sigma", "model_id"])
            small, large = rows.iloc[0], rows[rows["sigma"] == rows["sigma"].max()].iloc[0]
            return [small] if small.sigma == large.sigma else [small, large]
    return []


def grid_pe_figure(results: pd.DataFrame, pe_tables: dict, path: Path, similarity_maps: bool = False) -> str | None:
    """PCA (2 components) of the first block's PE vectors next to the true square grid of the tokens (the LST's
    4×4 cells, the digits' 8×8 pixels; row-major). similarity_maps: below them, each model's PE cosine similarity
    with the centre token laid out on the grid, beside minus the grid distance to it (what a PE mirroring the grid
    shows). Returns why it was not drawn, or None."""
    chosen = chosen_models(results, pe_tables)
    if not chosen:
        return "no pe_tables.npz entry for a learned or random PE model."
    count = len(pe_tables[run_folder.pe_table_key(chosen[0].model_id)][0])
    side = math.isqrt(count)
    if side * side != count:
        return f"the {count} tokens do not lie on a square grid."
    cells = np.arange(count)
    grid = np.stack([cells % side, -(cells // side)], axis=1).astype(float)  # x = column, y = −row: reads as a grid
    panels = 1 + len(chosen)
    fig, axes = plt.subplots(1 + similarity_maps, panels, figsize=(4.4 * panels, 4.6 * (1 + similarity_maps)),
                             layout="constrained", squeeze=False)

    def draw(ax, points, title):
        colours = plt.get_cmap("tab10").colors
        for r in range(side):  # lines join grid neighbours: a lattice shows as a lattice
            ax.plot(points[r * side:(r + 1) * side, 0], points[r * side:(r + 1) * side, 1],
                    color=colours[r % len(colours)], linewidth=1)
            ax.plot(points[r::side, 0], points[r::side, 1], color="0.6", linewidth=0.8, linestyle=":")
        for i, (x, y) in enumerate(points):
            ax.scatter(x, y, color=colours[(i // side) % len(colours)], s=60 if side <= 4 else 24, zorder=3,
                       edgecolors="k", linewidths=0.4)
            if side <= 4:
                ax.annotate(str(i), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.3)

    draw(axes[0, 0], grid, f"true {side}×{side} grid ({'cell index, ' if side <= 4 else ''}colour = row)")
    axes[0, 0].set_xlabel("column")
    axes[0, 0].set_ylabel("− row")
    for ax, model in zip(axes[0, 1:], chosen):
        table = pe_tables[run_folder.pe_table_key(model.model_id)][0]
        centred = table - table.mean(0)
        u, s, _ = np.linalg.svd(centred, full_matrices=False)
        explained = (s[:2] ** 2).sum() / max((s ** 2).sum(), 1e-30)
        rsa = f", pe_rsa {fmt(model['pe_rsa'], 2)}" if "pe_rsa" in model else ""
        draw(ax, u[:, :2] * s[:2], f"{model.pe} σ={model.sigma:g}, seed {int(model.seed)}{rsa}\n"
                                   f"PCA of block-0 PE ({100 * explained:.0f}% of variance)")
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
    if similarity_maps:
        centre = (side // 2) * side + side // 2
        rows, cols = np.divmod(cells, side)
        maps = [("− grid distance", -np.hypot(rows - rows[centre], cols - cols[centre]))]
        maps += [(f"{model.pe} σ={model.sigma:g}: PE cosine similarity", pe_geometry.cosine_similarity_matrix(
            pe_tables[run_folder.pe_table_key(model.model_id)][0])[centre]) for model in chosen]
        for ax, (title, values) in zip(axes[1], maps):
            values = values.astype(float)
            values[centre] = np.nan  # its similarity with itself would set the colour scale
            image = ax.imshow(values.reshape(side, side), cmap="viridis")
            ax.scatter(centre % side, centre // side, marker="x", color="r")
            ax.set_xticks(range(side))
            ax.set_yticks(range(side))
            ax.set_title(f"{title}\nto the centre token (×)", fontsize=10)
            ax.set_xlabel("column")
            ax.set_ylabel("row")
            fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle("Learned PE geometry (lines: same row solid, same column dotted)")
    save(fig, path)
    return None


def brain_pe_figure(results: pd.DataFrame, pe_tables: dict, ground_truth: Path, path: Path) -> str | None:
    """FC and the PE cosine-similarity matrices (small and large σ), ordered by network when the networks are
    known. Returns why it was not drawn, or None."""
    chosen = chosen_models(results, pe_tables)
    if not chosen:
        return "no pe_tables.npz entry for a learned or random PE model."
    truth = read_npz(ground_truth)
    if "fc" not in truth:
        return f"{ground_truth.name} has no 'fc' array."
    networks = truth.get("networks")
    order = np.argsort(networks, kind="stable") if networks is not None else np.arange(len(truth["fc"]))
    bounds = (np.flatnonzero(networks[order][1:] != networks[order][:-1]) + 0.5) if networks is not None else []
    matrices = [("functional connectivity (FC)", truth["fc"])]
    for model in chosen:
        similarity = pe_geometry.cosine_similarity_matrix(pe_tables[run_folder.pe_table_key(model.model_id)][0])
        corr = f", pe_fc_corr {fmt(model['pe_fc_corr'], 2)}" if "pe_fc_corr" in model else ""
        matrices.append((f"PE cosine similarity, {model.pe} σ={model.sigma:g}{corr}", similarity))
    axis_label = "token (ordered by network)" if networks is not None else "token (no network labels)"
    fig, axes = plt.subplots(1, len(matrices), figsize=(4.8 * len(matrices), 4.6), layout="constrained")
    for ax, (title, matrix) in zip(axes, matrices):
        ordered = matrix[np.ix_(order, order)]
        limit = np.nanmax(np.abs(ordered[~np.eye(len(ordered), dtype=bool)])) or 1.0
        image = ax.imshow(ordered, cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
        for b in bounds:
            ax.axhline(b, color="k", linewidth=0.6)
            ax.axvline(b, color="k", linewidth=0.6)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(axis_label)
        fig.colorbar(image, ax=ax, shrink=0.8)
    axes[0].set_ylabel(axis_label)
    fig.suptitle("Learned PE similarity vs FC, block-0 PE" + (" (lines: network boundaries)" if len(bounds) else ""))
    save(fig, path)
    return None


def gradient_figure(results: pd.DataFrame, pe_tables: dict, ground_truth: Path, path: Path) -> str | None:
    """Per σ, the first seed's block-0 PE: the PC that best follows connectivity gradient 1, against it.
    Returns why it was not drawn, or None."""
    truth = read_npz(ground_truth)
    if "gradients" not in truth:
        return f"{ground_truth.name} has no 'gradients' array (a results folder from before issue 19)."
    gradient = truth["gradients"][:, 0]
    models = results[(results["pe"] == "learned") & results["sigma"].notna()]
    models = models[[run_folder.pe_table_key(i) in pe_tables for i in models["model_id"]]]
    if models.empty:
        return "no pe_tables.npz entry for a learned PE model."
    chosen = models.sort_values(["sigma", "model_id"]).groupby("sigma", sort=True).head(1)
    for model in chosen.itertuples():  # no principal axis to show
        if np.ptp(pe_tables[run_folder.pe_table_key(model.model_id)][0], axis=0).max() == 0:
            return f"the block-0 PE of model {model.model_id} (σ={model.sigma:g}) is the same vector for every token."
    fig, axes = panel_grid(len(chosen), width=3.6, height=3.4)
    for ax, model in zip(axes, chosen.itertuples()):
        table = pe_tables[run_folder.pe_table_key(model.model_id)][0]
        (r, pc), = gradient_metrics.gradient_alignment(table, gradient[:, None])
        scores, shares = gradient_metrics.pe_principal_components(table, pc + 1)
        sign = np.sign(np.corrcoef(scores[:, pc], gradient)[0, 1]) or 1.0  # a PC's sign is arbitrary
        ax.scatter(gradient, sign * scores[:, pc], s=12, color="tab:blue", alpha=0.8)
        ax.set_title(f"σ={model.sigma:g}, seed {int(model.seed)}: PC{pc + 1} ({100 * shares[pc]:.0f} % of "
                     f"variance)\n|r| = {r:.2f}", fontsize=9)
        ax.set_xlabel("connectivity gradient 1")
        ax.set_ylabel(f"PE PC{pc + 1} score (sign aligned)")
        ax.grid(alpha=0.3)
    fig.suptitle("Learned PE's principal axis vs the FC's principal gradient (one point per token)")
    save(fig, path)
    return None


# the grid axes a phase diagram puts against σ: axis -> its name, what its value means, the flag that makes it a list
PHASE_AXES = {"lr": ("learning rate", "", "--lr"), "init_gamma": ("init γ", " (std = fan_in^-γ)", "--init-gamma")}


def phase_diagram(results: pd.DataFrame, metrics: list[str], path: Path, axis: str = "lr") -> str | None:
    """Heatmaps over σ × a grid axis (PHASE_AXES) of each metric, mean over seeds, for the learned (else random)
    PE and each optimizer kind. Returns why it was not drawn, or None."""
    name, meaning, flag = PHASE_AXES[axis]
    models = results[results["pe"].isin(["learned", "random"]) & results["sigma"].notna()]
    if axis not in models or models["sigma"].nunique() < 2 or models[axis].nunique() < 2:
        return f"needs σ and the {name} to vary (--sigmas and {flag} lists)."
    models = models[models["pe"] == models["pe"].iloc[0]]
    kinds = list(dict.fromkeys(models["optimizer"])) if "optimizer" in models else [None]
    fig, axes = plt.subplots(len(kinds), len(metrics), figsize=(4.2 * len(metrics), 3.6 * len(kinds)),
                             squeeze=False, layout="constrained")
    for row, kind in zip(axes, kinds):
        of_kind = models if kind is None else models[models["optimizer"] == kind]
        for ax, metric in zip(row, metrics):
            table = of_kind.groupby([axis, "sigma"])[metric].mean().unstack("sigma")
            image = ax.imshow(table.to_numpy(), origin="lower", aspect="auto", cmap="viridis")
            for (i, j), value in np.ndenumerate(table.to_numpy()):
                light = image.norm(value) > 0.6  # dark text on the bright end of viridis
                ax.annotate(f"{value:.3g}", (j, i), ha="center", va="center", fontsize=8, color="k" if light else "w")
            ax.set_xticks(range(table.shape[1]), [f"{v:g}" for v in table.columns])
            ax.set_yticks(range(table.shape[0]), [f"{v:g}" for v in table.index])
            ax.set_xlabel("σ")
            ax.set_ylabel(name + meaning)
            ax.set_title(f"{metric}" + (f" ({kind})" if kind else ""), fontsize=9)
            fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"{models['pe'].iloc[0]} PE: σ × {name}, mean over seeds")
    save(fig, path)
    return None


# ---- the report's figures as a table: one row per figure, drawn in the table's order ----


@dataclasses.dataclass
class Page:
    """What a figure is drawn from: the run, its task's view and the attention alignment; figures go to folder."""
    run: Run
    view: TaskView
    align: Alignment | None
    folder: Path
    styles: Styles

    @property
    def results(self) -> pd.DataFrame:
        return self.run.results

    @property
    def models(self) -> pd.DataFrame:
        """The trained models' rows (no baselines)."""
        return self.results[~is_baseline(self.results["pe"])]

    @property
    def curves(self) -> pd.DataFrame:
        return self.run.curves

    @property
    def ground_truth(self) -> Path | None:
        path = self.run.path / run_folder.GROUND_TRUTH
        return path if path.is_file() else None

    def present(self, metrics) -> list[str]:
        """The metrics the results hold values of."""
        return [m for m in metrics if m in self.results and self.results[m].notna().any()]


@dataclasses.dataclass(frozen=True)
class Figure:
    """One figure: figures/<name>.png under the heading name, drawn where it applies; draw returns why it could not
    be drawn (a "Not drawn" line naming subject), or None."""
    name: str
    applies: Callable[[Page], bool]
    draw: Callable[[Page, Path], str | None]
    caption: Callable[[Page], str]
    subject: str


def always(page: Page) -> bool:
    return True


def in_view(name: str) -> Callable[[Page], bool]:
    """For the figures a task's view names (TaskView.figures): those of its own ground truth."""
    return lambda page: name in page.view.figures


def draw_generalisation(page: Page, path: Path) -> str | None:
    metrics = page.present(page.view.generalisation)
    if not metrics:
        return f"none of {', '.join(page.view.generalisation)} in the results."
    metric_vs_sigma(page.results, metrics, page.styles, "Generalisation vs σ (mean ± sd over seeds)", path)


def draw_similarity(page: Page, path: Path) -> str | None:
    similarity = page.present(page.view.similarity)
    if not similarity:
        return f"none of {', '.join(page.view.similarity)} has values."
    metric_vs_sigma(page.models, similarity, page.styles, "Learned PE vs ground truth, by σ (mean ± sd over seeds)",
                    path)


def draw_alignment(page: Page, path: Path) -> str | None:
    if page.align is None or not page.align.n:
        return f"no attention column for the {page.view.probe} probe, or no {page.view.score}."
    alignment_figure(page.results, page.align, page.view, page.styles, path)


def draw_attention(page: Page, path: Path) -> str | None:
    panels = {}
    if not page.curves.empty:
        entropy = layer_head_mean(page.curves, columns.attention_prefix(), "entropy")
        if entropy is not None:
            panels["attention entropy (nats)"] = entropy
        for probe in probe_names(page.curves):
            panels[f"attention mass on {probe}"] = layer_head_mean(page.curves, columns.attention_prefix(),
                                                                   columns.probe_stat(probe))
    if not panels:
        return "no curves.parquet or no attn_* columns in it."
    curves_by_sigma(page.curves, panels, page.styles, "Attention statistics over training, mean over layers and heads",
                    path)


def draw_pe_drift(page: Page, path: Path) -> str | None:
    curves = page.curves
    drift = columns.PE_DRIFT
    if curves.empty or drift not in curves or not curves[drift].gt(0).any():
        return "no pe_drift values in curves.parquet (learned PEs only)."
    curves_by_sigma(curves, {f"{drift} = ‖P_t − P_0‖ / ‖P_0‖ (log scale)": curves[drift]}, page.styles,
                    "How far the learned PE moved from its initial value", path, log_y=True)


def draw_rank(page: Page, path: Path) -> str | None:
    rank = page.present(("pe_effective_rank", "pe_pc1_share"))
    if not rank:
        return "no pe_effective_rank values in the results."
    metric_vs_sigma(page.models, rank, page.styles, "Spectrum of the block-0 PE, by σ (mean ± sd over seeds)", path)


def draw_rank_over_training(page: Page, path: Path) -> str | None:
    curves = page.curves
    if curves.empty or "pe_effective_rank" not in curves or not curves["pe_effective_rank"].notna().any():
        return "no pe_effective_rank values in curves.parquet."
    curves_by_sigma(curves, {"effective rank of the block-0 PE": curves["pe_effective_rank"]}, page.styles,
                    "Effective rank of the PE over training", path)


def draw_change_rank(page: Page, path: Path) -> str | None:
    curves = page.curves
    wanted = [columns.PE_CHANGE_RANK] + [c for c in curves.columns if columns.parse_change_rank_block(c) is not None]
    panels = {("PE: P_t − P_0" if c == columns.PE_CHANGE_RANK else f"block {columns.parse_change_rank_block(c)}: "
               "W_t − W_0"): curves[c] for c in wanted if c in curves and curves[c].notna().any()}
    if not panels:
        return "no dpe_rank or dw_rank_b* values in curves.parquet."
    curves_by_sigma(curves, panels, page.styles, "Effective rank of what was learned, over training", path)


def draw_tangent_kernel_over_training(page: Page, path: Path) -> str | None:
    curves = page.curves
    panels = {f"{name} ({'PE alone' if 'pe' in name else 'all parameters'})": curves[name]
              for name in columns.TANGENT_KERNEL if name in curves and curves[name].notna().any()}
    if not panels:
        return "no ntk_* values in curves.parquet (a sweep with --ntk-items 0, or from before the tangent kernel)."
    curves_by_sigma(curves, panels, page.styles, "The empirical tangent kernel over training", path)


def draw_tangent_kernel(page: Page, path: Path) -> str | None:
    moved = page.present(columns.TANGENT_KERNEL)
    if not moved:
        return "no ntk_* columns in the results (a sweep with --ntk-items 0, or from before the tangent kernel)."
    metric_vs_sigma(page.models, moved, page.styles,
                    "The empirical tangent kernel at the end of training (mean ± sd over seeds)", path)


def draw_rich_lazy(page: Page, path: Path) -> str | None:
    moved = page.present(columns.RICH_LAZY)
    if not moved:
        return "none of the drift / change columns in the results."
    metric_vs_sigma(page.models, moved, page.styles,
                    "How far each model moved from its initialisation (mean ± sd over seeds)", path)


def rich_lazy_caption(page: Page) -> str:
    axes = varying_axes(page.results)
    return ("Rich versus lazy against σ: relative drift of the PE and of block 0's weights, 1 − CKA of the last "
            "block's features and the first block's attention change from step 0 (0 = lazy: nothing moved)."
            + (f" Pooled over {', '.join(axes)}." if axes else ""))


def draw_phase_diagram(page: Page, path: Path) -> str | None:
    return phase_diagram(page.results, page.present((page.view.score, columns.PE_DRIFT, columns.REPR_CHANGE)), path)


def draw_gamma_phase_diagram(page: Page, path: Path) -> str | None:
    metrics = page.present((page.view.score, columns.PE_DRIFT, columns.NTK_DISTANCE, columns.PE_CHANGE_RANK))
    return phase_diagram(page.results, metrics, path, "init_gamma")


def draw_gradient(page: Page, path: Path) -> str | None:
    return gradient_figure(page.results, page.run.pe_tables, page.ground_truth, path)


def draw_learned_pe_grid(page: Page, path: Path) -> str | None:
    return grid_pe_figure(page.results, page.run.pe_tables, path)


def draw_learned_pe_on_grid(page: Page, path: Path) -> str | None:
    return grid_pe_figure(page.results, page.run.pe_tables, path, similarity_maps=True)


def draw_learned_pe_fc(page: Page, path: Path) -> str | None:
    if page.ground_truth is None:
        return "no ground_truth.npz (fc, networks) in the folder."
    return brain_pe_figure(page.results, page.run.pe_tables, page.ground_truth, path)


FIGURE_TABLE = (
    Figure("generalisation_vs_sigma", always, draw_generalisation,
           lambda page: (f"Generalisation ({', '.join(page.present(page.view.generalisation))}) against σ for each "
                         f"PE kind; PEs without σ as horizontal bands, baselines as dashed lines."),
           "generalisation vs σ"),
    Figure("pe_similarity_vs_sigma", always, draw_similarity,
           lambda page: (f"PE vs ground-truth similarity ({', '.join(page.present(page.view.similarity))}) against "
                         f"σ (pe_procrustes: lower = closer)."),
           "PE similarity vs σ"),
    Figure("alignment_vs_generalisation", always, draw_alignment,
           lambda page: (f"Each point is one model: final attention mass on the {page.view.probe} probe "
                         f"({page.align.source}, mean over layers and heads) against {page.view.score}; Spearman "
                         f"ρ = {fmt(page.align.rho, 3)}."),
           "attention alignment"),
    Figure("attention_over_training", always, draw_attention,
           lambda page: ("Per-step attention statistics of the training batches (averaged over each evaluation "
                         "window, layers and heads) against the step, by σ."),
           "attention over training"),
    Figure("pe_drift", always, draw_pe_drift,
           lambda page: ("Relative distance of the learned PE from its initial value over training, by σ: large = "
                         "rich learning, small = lazy."),
           "PE drift"),
    Figure("pe_rank_vs_sigma", always, draw_rank,
           lambda page: ("Effective rank (Σs)² / Σs² of the token-centred PE table and its first principal "
                         "component's share of variance against σ: low rank = a PE organised along few axes."),
           "PE rank vs σ"),
    Figure("pe_rank_over_training", always, draw_rank_over_training,
           lambda page: "Effective rank of the block-0 PE table against the training step, by σ.",
           "PE rank over training"),
    Figure("change_rank_over_training", always, draw_change_rank,
           lambda page: ("Effective rank (exp of the singular values' entropy) of the PE's change from its "
                         "initialisation and of each block's weight changes (mean over its four matrices) against the "
                         "training step, by σ: a change that grows in rank step by step is rich learning."),
           "rank of what was learned"),
    Figure("pe_gradient", lambda page: "pe_gradient" in page.view.figures and page.ground_truth is not None,
           draw_gradient,
           lambda page: ("One panel per σ (first seed): each token's score on the PE principal component that best "
                         "follows connectivity gradient 1, against gradient 1."),
           "PE vs connectivity gradient"),
    Figure("rich_lazy_vs_sigma", always, draw_rich_lazy, rich_lazy_caption, "rich vs lazy"),
    Figure("tangent_kernel_vs_sigma", always, draw_tangent_kernel,
           lambda page: ("The empirical tangent kernel on the fixed probe items at the end of training against σ: "
                         "its distance from the step-0 kernel (0 = lazy: the kernel did not move), its velocity "
                         "(distance from the previous evaluation's kernel per 1,000 steps) and its alignment with "
                         "the targets, over all parameters and over the PE alone."),
           "tangent kernel vs σ"),
    Figure("tangent_kernel_over_training", always, draw_tangent_kernel_over_training,
           lambda page: "The same kernel measures against the training step, by σ.",
           "tangent kernel over training"),
    Figure("phase_diagram", always, draw_phase_diagram,
           lambda page: (f"{page.view.score}, PE drift and representation change over σ × learning rate (mean over "
                         f"seeds): where training turns from rich to lazy."),
           "phase diagram"),
    Figure("phase_diagram_gamma", always, draw_gamma_phase_diagram,
           lambda page: (f"{page.view.score}, PE drift, tangent-kernel distance and the PE change's rank over σ × "
                         f"the initialisation scale γ (weights' std = fan_in^-γ; mean over seeds): the phase diagram "
                         f"of Zhang et al. (2024) with the PE's σ as a second axis."),
           "phase diagram σ × γ"),
    Figure("learned_pe", in_view("learned_pe_grid"), draw_learned_pe_grid,
           lambda page: "2D PCA of the first block's learned PE vectors (small and large σ) next to the true grid.",
           "learned PE"),
    # a file of its own: the digits draw it beside learned_pe's similarity with the pixels' correlation
    Figure("learned_pe_on_grid", in_view("learned_pe_on_grid"), draw_learned_pe_on_grid,
           lambda page: ("2D PCA of the first block's learned PE vectors (small and large σ) next to the true grid; "
                         "below, each PE's cosine similarity with the centre token laid out on the grid, beside "
                         "minus the grid distance to it."),
           "learned PE on the grid"),
    Figure("learned_pe", in_view("learned_pe_fc"), draw_learned_pe_fc,
           lambda page: "Learned PE cosine similarity (small and large σ) next to FC, tokens ordered by network.",
           "learned PE"),
)


def draw_brain_maps(page: Page) -> tuple[dict[str, str], list[str]]:
    """The cortical surface figures (brain_maps.py), several from one ground truth: (drawn name -> caption, notes
    on what was not drawn)."""
    if page.ground_truth is None:
        return {}, []
    regions, why = brain_maps.surface_regions(page.run.settings)
    if why:
        return {}, [f"brain maps: {why}"]
    return brain_maps.brain_figures(page.results, page.run.pe_tables, read_npz(page.ground_truth), regions,
                                    page.folder)


# Every figure the report can write; stale ones from an earlier report are removed when not redrawn.
FIGURES = (*dict.fromkeys(row.name for row in FIGURE_TABLE), *brain_maps.FIGURES)


def draw_figures(run: Run, view: TaskView, align: Alignment | None, directory: Path
                 ) -> tuple[dict[str, str], list[str]]:
    """Every figure of FIGURE_TABLE that applies, into DIR/figures/ (and the brain maps, where the task's view asks
    for them): (figure name -> caption, why each other one is not drawn). A figure from an earlier report that this
    one cannot draw is removed: it would mislead."""
    results, curves = run.results, run.curves
    folder = directory / run_folder.FIGURES
    folder.mkdir(exist_ok=True)
    styles = Styles(pd.concat([results[["pe", "sigma"]], curves[["pe", "sigma"]]] if not curves.empty
                              else [results[["pe", "sigma"]]]))
    page = Page(run, view, align, folder, styles)
    drawn: dict[str, str] = {}   # figure name -> caption
    skipped: list[str] = []
    for row in FIGURE_TABLE:
        if row.applies(page):
            why = row.draw(page, folder / f"{row.name}.png")
            if why:
                skipped.append(f"{row.subject}: {why}")
            else:
                drawn[row.name] = row.caption(page)
    if "brain_maps" in view.figures:
        brain_drawn, brain_skipped = draw_brain_maps(page)
        drawn.update(brain_drawn)
        skipped += brain_skipped
    for name in FIGURES:
        if name not in drawn:
            run_folder.remove_file(folder / f"{name}.png", under=run_folder.no_link_on_the_way(folder))
    return drawn, skipped
