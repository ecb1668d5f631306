"""The task object a sweep trains, built from its settings; a problem with the user's files or a missing data
package becomes a UsageError (one line, exit 2)."""
from __future__ import annotations

from pe_fast.sweep.settings import NETSIM_FLAGS, Settings, UsageError


def load_task(s: Settings):
    if s.task == "lst":
        from pe_fast.tasks.lst import LSTTask, PuzzleFileError
        try:
            return LSTTask(train_path=s.lst_train, ood_path=s.lst_ood)
        except PuzzleFileError as error:
            raise UsageError(str(error))
    from pe_fast.data import DataError
    from pe_fast.tasks.masked_regions import MaskedRegionTask
    try:
        return MaskedRegionTask(load_region_data(s), s.task, mask_fraction=s.mask_fraction, window=s.window,
                                split=s.split)
    except (DataError, ValueError) as error:
        raise UsageError(str(error))


def load_region_data(s: Settings):
    if s.task == "netsim":
        from pe_fast.data.netsim import simulate_network
        network = {k: getattr(s, k) for k in NETSIM_FLAGS if getattr(s, k) is not None and k != "netsim_seed"}
        return simulate_network(**network, seed=s.netsim_seed or 0)
    if s.data:
        from pe_fast.data.user_data import load_user_data
        return load_user_data(s.data, regions=s.regions, parcellation=s.parcellation)
    from pe_fast.data import brain_atlas
    if s.atlas == "glasser360":
        return brain_atlas.load_glasser360_surrogate()
    return brain_atlas.load_schaefer100_hcp()
