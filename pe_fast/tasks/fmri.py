"""fMRI as a pe_fast task: masked-region prediction (pe_fast.tasks.masked_regions) on real HCP resting-state BOLD
(Schaefer-100, the default), a Glasser-360 surrogate, or the user's own parcellated data."""
from __future__ import annotations

import dataclasses

from pe_fast.tasks.base import TaskKind
from pe_fast.tasks.masked_regions import (REGION_DEFAULTS, REGION_FLAGS, REGION_PES, REGION_PRESETS,
                                          REGION_SUMMARY, REGION_VIEW, MaskedRegionTask)

ATLASES = ("schaefer100", "glasser360")


def region_data(s):
    if s.data:
        from pe_fast.data.user_data import load_user_data
        paths = s.data.split(",")  # several CIFTI runs, one subject each
        return load_user_data(paths if len(paths) > 1 else paths[0], regions=s.regions, parcellation=s.parcellation)
    from pe_fast.data import brain_atlas
    if s.atlas == "glasser360":
        return brain_atlas.load_glasser360_surrogate()
    return brain_atlas.load_schaefer100_hcp()


KIND = TaskKind(
    name="fmri",
    defaults=REGION_DEFAULTS,
    # Every PE family of the paper's fMRI comparison, not only the σ grid.
    presets={**REGION_PRESETS, "all-pes": dict(pe="learned,none,sin1d,random,sinnd")},
    pe_kinds=REGION_PES,
    flags=("atlas", "data", "regions", "parcellation") + REGION_FLAGS,
    summary=REGION_SUMMARY,
    view=dataclasses.replace(REGION_VIEW, figures=(*REGION_VIEW.figures, "brain_maps")),  # real cortex
    load=lambda s: MaskedRegionTask.from_settings(region_data(s), s),
)
