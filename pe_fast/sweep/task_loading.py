"""The task a sweep trains, built by its TaskKind from the settings; a problem with the user's files or a missing
data package becomes a UsageError (one line, exit 2)."""
from __future__ import annotations

from pe_fast.data import DataError
from pe_fast.sweep.settings import Settings, UsageError
from pe_fast.tasks import KINDS


def load_task(s: Settings):
    try:
        return KINDS[s.task].load(s)
    except (DataError, ValueError) as error:  # pe_fast.tasks.lst_puzzles.PuzzleFileError is a ValueError
        raise UsageError(str(error))
