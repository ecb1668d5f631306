"""fMRI as a pe_fast task: masked-region prediction (pe_fast.tasks.masked_regions) on real HCP resting-state BOLD
(Schaefer-100, the default), a Glasser-360 surrogate, or the user's own parcellated data."""
from __future__ import annotations

import dataclasses

from pe_fast.data.regions import GRADIENTS, MIN_REGIONS, DataError
from pe_fast.tasks.base import TaskKind, TaskSetting
from pe_fast.tasks.masked_regions import (ALL_BASELINES, REGION_DEFAULTS, REGION_SETTINGS, REGION_PES, REGION_PRESETS,
                                          REGION_SUMMARY, REGION_VIEW, MaskedRegionTask)

ATLASES = ("schaefer100", "glasser360")


# --data: its several-file rule is read where the data load too
DATA = TaskSetting("data", str, "your parcellated time series (.npy/.npz/.h5: subjects × time × regions) or CIFTI "
                                ".dtseries.nii runs, comma-separated, one subject each", files="several")


def region_data(s):
    if s.data:
        from pe_fast.data.user_data import load_user_data
        paths = DATA.paths(s.data)  # several CIFTI runs, one subject each
        data = load_user_data(paths if len(paths) > 1 else paths[0], regions=s.regions, parcellation=s.parcellation)
        if len(data.labels) < MIN_REGIONS:  # the loader, a library too, takes 2 or more
            raise DataError(f"{data_where(s)}: {len(data.labels)} regions; the sweep needs at least {MIN_REGIONS} (the "
                            f"PE is compared with {GRADIENTS} connectivity gradients, and n regions have n − 2)")
        return data
    from pe_fast.data import brain_atlas
    if s.atlas == "glasser360":
        return brain_atlas.load_glasser360_surrogate()
    return brain_atlas.load_schaefer100_hcp()


def data_where(s) -> str:
    """--data's files as the data loader names them in its messages (the first, and how many more)."""
    paths = DATA.paths(s.data)
    return paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} files)"


def load(s) -> MaskedRegionTask:
    """The task on the settings' data. What the task finds in the user's data (every region constant once
    z-scored, too few subjects for the split) names the file, as the loader's own refusals do (the sweep puts
    --data in front); a message that names its flag (--window) is left as it is."""
    data = region_data(s)
    try:
        return MaskedRegionTask.from_settings(data, s)
    except ValueError as error:
        if s.data and not isinstance(error, DataError) and not str(error).startswith("--"):
            raise DataError(f"{data_where(s)}: {error}") from None
        raise


def user_data_rules(s: dict, given: set[str]) -> str | None:
    """--atlas chooses built-in data; --regions and --parcellation describe the user's --data."""
    if s["data"] is not None and "atlas" in given:
        return "--atlas chooses the built-in data; with --data, your --regions table describes the regions instead"
    if (s["regions"] or s["parcellation"]) and not s["data"]:
        return "--regions and --parcellation describe --data; give --data too"
    return None


KIND = TaskKind(
    name="fmri",
    defaults=REGION_DEFAULTS,
    # Every PE family of the paper's fMRI comparison, not only the σ grid; and the default in half the time, at twice
    # the rate decaying to zero over 1,500 steps: the 20,000-step run's verdicts once (docs/results.md), though its
    # report calls them provisional, the plateau being the schedule's.
    presets={**REGION_PRESETS, "all-pes": dict(pe="learned,none,sin1d,random,sinnd"),
             "quick": dict(lr=6e-3, schedule="cosine", steps=1500)},
    pe_kinds=REGION_PES,
    settings=(TaskSetting("atlas", str,
                          "schaefer100 = real HCP BOLD (default); glasser360 = simulated from real HCP FC",
                          default="schaefer100", choices=ATLASES),
              DATA,
              TaskSetting("regions", str, "regions table for --data (CSV: label,x,y,z,network)", files="one"),
              TaskSetting("parcellation", str, "the .dlabel.nii that parcellates a CIFTI --data", files="one"),
              *REGION_SETTINGS),
    check=user_data_rules,
    summary=REGION_SUMMARY,
    view=dataclasses.replace(REGION_VIEW, figures=(*REGION_VIEW.figures, "brain_maps")),  # real cortex
    load=load,
    readout_token=MaskedRegionTask.readout_token,
    baselines=ALL_BASELINES,
    model_dims=MaskedRegionTask.model_dims,
)
