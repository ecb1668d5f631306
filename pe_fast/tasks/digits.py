"""Masked-pixel prediction on real handwritten digits (pe_fast.data.digits): the fMRI task's objective and measures
(pe_fast.tasks.masked_regions) with pixels for regions, so that the ground truth the PE is compared with, the pixel
grid, is exact rather than estimated. The tokens' coordinates are the grid's two axes, so the 2D sinusoidal PE and
2D RoPE apply as on the LST."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from pe_fast.models.transformer import PE_KINDS
from pe_fast.tasks.base import TaskKind
from pe_fast.tasks.masked_regions import REGION_DEFAULTS, REGION_SETTINGS, REGION_VIEW, MaskedRegionTask


class DigitsTask(MaskedRegionTask):
    """The masked-region task on the digits, its PEs built on the 2D pixel grid (the region tasks' sinnd and
    distance measures on the same grid, as the data's "centroids" in a plane)."""

    def __init__(self, data, name: str, **options):
        super().__init__(data, name, **options)
        from pe_fast.data.digits import grid_coordinates
        self.coordinates = grid = grid_coordinates()
        # the grid's own attention probes beside the region tasks' (quadrant, distance, pixel correlation)
        rows, columns = grid[:, :1], grid[:, 1:]
        grid_probes = {"same_row": rows == rows.T, "same_column": columns == columns.T,
                       "neighbours": np.abs(rows - rows.T) + np.abs(columns - columns.T) == 1}
        stacked = np.stack(list(grid_probes.values())).astype(np.float32)
        stacked[:, np.arange(len(grid)), np.arange(len(grid))] = 0.0  # attention to itself says nothing
        self.probe_names = [*self.probe_names, *grid_probes]
        self.probes = torch.cat([self.probes, torch.from_numpy(stacked)])
        self.description["probes"] = self.probe_names


def load(s) -> DigitsTask:
    from pe_fast.data.digits import load_digit_regions
    return DigitsTask(load_digit_regions(), s.task, mask_fraction=s.mask_fraction, window=s.window, split=s.split)


KIND = TaskKind(
    name="digits",
    # The fMRI default's training, with the controls the grid allows: the 2D sinusoidal PE and no PE.
    defaults={**REGION_DEFAULTS, "pe": "learned,sin2d,none"},
    presets={"all-pes": dict(pe="learned,sin2d,rope2d,sin1d,random,none"),
             # a GPU's share: the finer σ grid and ten seeds
             "gpu": dict(pe="learned,sin2d,none", sigmas="0.01,0.1,0.2,0.5,1,2", seeds=10)},
    pe_kinds=PE_KINDS,
    settings=REGION_SETTINGS,
    summary=("train_mse", "test_mse", "test_r2", "pe_dist_spearman", "pe_procrustes", "pe_fc_corr", "pe_modularity",
             "pe_effective_rank"),
    # the PE against the exact grid first, then against the pixels' correlation and the quadrants
    # attention alignment: the mass on each pixel's four grid neighbours
    view=dataclasses.replace(REGION_VIEW, probe="neighbours", similarity=("pe_dist_spearman", "pe_procrustes", "pe_fc_corr",
                                                      "pe_modularity", "pe_segregation", "pe_gradient_corr")),
    load=load,
)
