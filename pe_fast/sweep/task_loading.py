"""The task a sweep trains, built by its TaskKind from the settings; a problem with the user's files or a missing
data package becomes a UsageError (one line, exit 2) that names the flag of the file it is about."""
from __future__ import annotations

from pe_fast.data import DataError
from pe_fast.results.settings import Settings
from pe_fast.sweep import UsageError
from pe_fast.tasks import KINDS


def load_task(s: Settings):
    try:
        return KINDS[s.task].load(s)
    except (DataError, ValueError) as error:  # pe_fast.tasks.lst_puzzles.PuzzleFileError is a ValueError
        raise UsageError(with_flag(str(error), s, getattr(error, "setting", None)))
    except OSError as error:  # a file this user may not read (mode 000, another owner's)
        raise UsageError(with_flag(f"{error.filename}: {error.strerror or error}", s)) from None


def with_flag(message: str, s: Settings, about: str | None = None) -> str:
    """The message with the flag in front that named the file (or the folder of the file) it opens with: the data
    layer names files, as it is also a library, and the user typed flags. about: the setting the error says it is
    about, where it knows (one file may be named by two flags)."""
    named = [(path, setting.name) for setting in KINDS[s.task].settings if setting.files and getattr(s, setting.name)
             for path in setting.paths(getattr(s, setting.name))]
    named.sort(key=lambda named_path: named_path[1] != about)  # the setting it is about first among equals
    for path, flag in sorted(named, key=lambda named_path: -len(named_path[0])):  # a file in a named folder: its own
        if message.startswith(path) and message[len(path):len(path) + 1] in (":", " ", "/"):
            return f"--{flag.replace('_', '-')} {message}"
    return message
