"""The results folder of a sweep, written so that a kill at any moment (SIGKILL included) loses at most the steps
since a pack's last checkpoint, and never leaves a half-written file where a reader would take it for a whole one.

    DIR/.lock                      pid, host and start time of the sweep writing DIR (one writer at a time)
    DIR/config.json                settings, task, models and packs: written at the start
    DIR/ground_truth.npz           region tasks: FC, networks, centroids, coupling (written at the start)
    DIR/packs/<i>.checkpoint.pt    the training state of pack i while it trains (removed when it is done)
    DIR/packs/<i>.step             the step pack i has reached, while a Ray or SLURM worker trains it: the
                                   driver's progress line reads it (removed when the pack is done)
    DIR/packs/<i>/                 a finished pack: results.parquet, curves.parquet, pe_tables.npz and its
                                   trained models, weights.safetensors (unless --no-weights)
    DIR/results.parquet ...        at the end: every pack together, and summary.txt (results.parquet last,
                                   so its presence means the sweep finished)

Every file is written to a temporary name beside its target, flushed to disk, and renamed over the target
(os.replace, atomic on POSIX); a finished pack's folder is assembled as a temporary folder and renamed.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import numbers
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable
from typing import BinaryIO
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pe_fast.program_exit import brief, control_character, escaped
from pe_fast.data.declared_size import inflation, stored_bytes
from pe_fast.results import migrate
from pe_fast.results.settings import FLOAT32_MAX

LOCK = ".lock"
MAX_PID = 2**22  # Linux's pid_max ceiling (PID_MAX_LIMIT)
PARTIAL = ".partial-"  # the infix of temporary files and folders
# The folder's files (and, but for the summary and the report, each finished pack's under packs/<i>/)
CONFIG, GROUND_TRUTH = "config.json", "ground_truth.npz"
RESULTS, CURVES, PE_TABLES, SUMMARY = "results.parquet", "curves.parquet", "pe_tables.npz", "summary.txt"
REPORT, FIGURES = "report.md", "figures"
RDMS = "rdms.hdf5"  # the report's --rdms export
WEIGHTS = "weights.safetensors"  # each finished pack's trained models (weights.py), unless --no-weights
# the SHA-256 of each file a folder's writer wrote, beside them: a file changed since (an edit, a damaged copy) is
# refused by every reader. Not a signature: whoever edits a file can rewrite this record too.
DIGESTS = "digests.json"
# config.json not among them: it is written at the start, and every reader checks it against the settings' rules
# and the results it lists
# a finished pack's settings, Settings.trained_with(): config.json edited since the pack trained is found out
TRAINED_WITH = "trained_with.json"
CHECKPOINT_TRAINED_WITH = "trained_with"  # the same, as JSON text, under this key of each checkpoint
DIGESTED = (GROUND_TRUTH, RESULTS, CURVES, PE_TABLES, SUMMARY, WEIGHTS, TRAINED_WITH)
# config.json of a folder that pools finished sweeps (pe_fast.report.pooling) names them under this key: no packs
POOLED_FROM = "pooled_from"
# pe_tables.npz holds, per model id i, its PE tables under "model_<i>" (learned / random / fixed PEs) and its mean
# attention maps [L, N, N] on the task's attention split under "attention_map_<i>" (every model): the keys are
# built by these two functions alone, and recognised by is_table_key
PE_TABLE, ATTENTION_MAP = "model_", "attention_map_"
TABLE_KEY = re.compile(rf"(?:{PE_TABLE}|{ATTENTION_MAP})\d+")


def pe_table_key(model_id) -> str:
    return f"{PE_TABLE}{int(model_id)}"


def attention_map_key(model_id) -> str:
    return f"{ATTENTION_MAP}{int(model_id)}"


def is_table_key(key: str) -> bool:
    """Whether a pe_tables.npz key is one pe_table_key or attention_map_key builds."""
    return TABLE_KEY.fullmatch(key) is not None


class FolderLocked(Exception):
    """Another live sweep writes this folder."""


# ---- one writer ----------------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def read_lock(out: Path) -> dict | None:
    try:
        status = (out / LOCK).lstat()  # a link is no lock of ours, and what it leads to is not read
        # ours is a short JSON object; a FIFO would block the reader, anything else is not ours
        holder = json.loads((out / LOCK).read_text()) if stat.S_ISREG(status.st_mode) and status.st_size < 4096 \
            else {}
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        holder = {}  # a lock being written this instant, or a damaged one: treat as held by an unknown writer
    if not isinstance(holder, dict):
        return {}
    pid = holder.get("pid")
    # a pid os.kill cannot take (text, a bool, 2**70) is no lock of ours
    return holder if type(pid) is int and 0 < pid <= MAX_PID else {}


def lock_holder(out: Path) -> dict | None:
    """The lock's contents if a live sweep (or one on another host) holds DIR/.lock; None if free or stale."""
    holder = read_lock(out)
    if holder is None:
        return None
    if holder.get("host") == socket.gethostname() and not _alive(holder["pid"]):
        return None
    return holder


def describe(holder: dict) -> str:
    """A lock's holder as a line names it; its text (someone's file) escaped."""
    return escaped(f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}")


def locked_message(out: Path, holder: dict) -> str:
    """Why a sweep cannot write in out: the lock a live sweep (or one on another host) holds, or a .lock that is
    not one pe_fast wrote (a link, a folder, bytes that are no lock)."""
    if not holder:
        return (f"{out / LOCK} is not a lock a sweep wrote (a short JSON file naming its process), unless one is "
                f"writing it this instant: if no sweep is writing {out}, delete it")
    return (f"{out} is being written by another sweep ({describe(holder)}); wait for it or stop it (if it is gone, "
            f"delete {out / LOCK})")


def acquire_lock(out: Path, notice: Callable[[str], None]) -> Path:
    """Create DIR/.lock atomically (O_CREAT | O_EXCL). A lock left by a dead process on this host is taken over
    (notice says so); one held by a live process, or by another host, raises FolderLocked."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    content = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                          "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_lock(out)
            if lock_holder(out) is not None or holder is None:
                raise FolderLocked(locked_message(out, holder or {}))
            notice(f"taking over the stale lock of {describe(holder)}, which is no longer running")
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        return path
    raise FolderLocked(f"{out}: another sweep took the lock at the same moment; try again")


def release_lock(out: Path):
    holder = read_lock(out)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        (out / LOCK).unlink(missing_ok=True)


# ---- atomic writes -------------------------------------------------------------------------------------------


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _open_folder(path: Path, under: Path | None) -> int:
    """A descriptor of the folder path. Below `under` (a results folder) no part of the way is followed through a
    link: one swapped in for a folder after the checks would lead a write out of the results folder."""
    if under is None:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    folder = os.open(under, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in path.relative_to(under).parts:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
    except OSError as error:
        os.close(folder)
        if error.errno in (errno.ELOOP, errno.ENOTDIR):  # what a link or a file in a folder's place give
            raise OSError(error.errno, "a link or a file where pe_fast writes a folder (was the folder changed while "
                                       "it ran?)", str(path)) from None
        raise
    return folder


def no_link_on_the_way(path: Path) -> Path | None:
    """write_atomic's `under` for a path whose links were resolved once (Path.resolve()): its root, so that no
    link anywhere on the way is followed later; None (links followed) for a relative path."""
    return Path(path.anchor) if path.is_absolute() else None


def write_atomic(path: Path, write: Callable[[BinaryIO], None], under: Path | None = None):
    """write(file) writes the file's content into a new file beside path; it is flushed to disk and renamed over
    path, so a reader never sees half a file and a link planted at path is replaced, not written through. Below
    `under` no folder on the way is a link (_open_folder). The file gets the permissions the umask gives."""
    folder = _open_folder(path.parent, under)
    try:
        name = f".{path.name}{PARTIAL}{secrets.token_hex(4)}"
        made = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=folder)
        try:
            with open(made, "wb") as file:
                write(file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(name, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
            raise
    finally:
        os.close(folder)


def remove_file(path: Path, under: Path | None):
    """path removed, where it is there, through the same way as write_atomic's (a link is removed, not followed)."""
    folder = _open_folder(path.parent, under)
    try:
        os.unlink(path.name, dir_fd=folder)
    except FileNotFoundError:
        pass
    finally:
        os.close(folder)


def write_json(path: Path, data: dict):
    write_atomic(path, lambda file: file.write(json.dumps(data, indent=2, default=str).encode()))


def save_npz(file: BinaryIO, arrays: dict):
    np.savez_compressed(file, **arrays)  # a file object: given a path, np.savez would add ".npz" to it


def sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


# DIGESTS' key for config.json's task, the data's description: config.json itself is rewritten by --resume (its
# runtime flags), the description is not, and the readers compare it with the data only when they load the task
TASK_DESCRIPTION = "config.json task"


def task_description_digest(folder: Path) -> str | None:
    """The SHA-256 of config.json's task (as JSON, keys sorted), or None where there is none to read."""
    try:
        config = read_config(folder)
    except (OSError, ValueError):
        return None
    task = config.get("task") if isinstance(config, dict) else None
    return None if task is None else hashlib.sha256(json.dumps(task, sort_keys=True).encode()).hexdigest()


def write_digests(folder: Path):
    """DIGESTS: the SHA-256 of each of DIGESTED that folder holds, and of its config.json's task, written after
    them."""
    record = {name: sha256(folder / name) for name in DIGESTED if (folder / name).is_file()}
    if (folder / CONFIG).is_file() and (task := task_description_digest(folder)) is not None:
        record[TASK_DESCRIPTION] = task
    write_json(folder / DIGESTS, record)


class ChangedFile(ValueError):
    """A file of a results folder that is not what its writer recorded in DIGESTS, or an unreadable record."""


def hidden(name: str) -> bool:
    """A name a system or tool adds unasked (Finder's .DS_Store, Jupyter's .ipynb_checkpoints), or a writer's
    temporary one (.<name>.partial-*): never read, so not refused where a results folder holds only its own files."""
    return name.startswith(".")


def check_pack_files(folder: Path):
    """ChangedFile where a finished pack's folder holds a file its writer (write_pack) did not write."""
    stray = sorted(p.name for p in folder.iterdir() if p.name not in (*DIGESTED, DIGESTS) and not hidden(p.name)) \
        if folder.is_dir() else []
    if stray:
        raise ChangedFile(f"{folder / stray[0]} was added to a finished pack's folder, which holds its results, "
                          f"curves, PE tables, weights and {DIGESTS} only")


def check_digests(folder: Path) -> bool:
    """Each file DIGESTS names is the one its writer wrote (ChangedFile naming the first that is not, or one it
    names that is gone), as is config.json's task where it records one, and no file of DIGESTED was added since;
    False where the folder has no record (an older pe_fast's, or a sweep stopped between its last file and the
    record)."""
    path = folder / DIGESTS
    if not path.exists() and not path.is_symlink():
        return False
    if not path.is_file() or path.stat().st_size > 64 * 1024:  # a FIFO would block; a record names 7 files
        raise ChangedFile(f"{path} is not the record of its folder's files a pe_fast writes")
    try:
        record = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=unique_keys)
    except (ValueError, UnicodeDecodeError, RecursionError):
        record = None
    if not (isinstance(record, dict) and set(record) <= {*DIGESTED, TASK_DESCRIPTION} and all(
            isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for v in record.values())):
        raise ChangedFile(f"{path} is not the record of its folder's files a pe_fast writes")
    for name in DIGESTED:
        file = folder / name
        if name not in record:
            if file.exists() or file.is_symlink():
                raise ChangedFile(f"{file} was added after its folder was written ({DIGESTS} does not list it)")
            continue
        if not file.is_file():
            raise ChangedFile(f"{file} is gone or not a file, though {DIGESTS} lists it")
        if sha256(file) != record[name]:
            raise ChangedFile(f"{file} has changed since it was written (its SHA-256 is not the one {DIGESTS} "
                              f"records: edited, or damaged in a copy)")
    if TASK_DESCRIPTION in record and task_description_digest(folder) != record[TASK_DESCRIPTION]:
        raise ChangedFile(f"{folder / CONFIG}: its task, the description of the sweep's data, has changed since the "
                          f"folder was written (its SHA-256 is not the one {DIGESTS} records): edited, or removed")
    return True


# ---- the whole sweep's files -----------------------------------------------------------------------------------


def write_start(out: Path, config: dict, ground_truth: dict[str, np.ndarray]):
    """config.json (and the ground truth, where the task has one) at the start: the report can read a sweep
    while it runs and --resume can continue it."""
    write_json(out / CONFIG, config)
    if ground_truth:
        write_atomic(out / GROUND_TRUTH, lambda file: save_npz(file, ground_truth))


# config.json's parts, as the sweep (sweep/folder.py) and the pooled report write them
CONFIG_PARTS = {"settings": dict, "task": dict, "torch": str, "models": list, "packs": list, "time": str,
                POOLED_FROM: list}
# their text, which the report shows: time.strftime's "%Y-%m-%dT%H:%M:%S%z"; torch's version, or a pooled folder's
# sources' versions joined ("2.13.0+cpu, 2.11.0"; "None" for a source that recorded none)
CONFIG_TEXT = {"time": re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[+-]\d{4})?"),
               "torch": re.compile(r"[\w.+-]{1,40}(?:, [\w.+-]{1,40}){0,20}", re.ASCII)}
# config.json lists every model of the grid (at most settings.MAX_MODELS, a few hundred bytes each): far below this
MAX_CONFIG_BYTES = 2**28


def read_config(out: Path) -> dict:
    """DIR/config.json, written at the start of a sweep (FileNotFoundError; ValueError where it is not a regular file
    of at most MAX_CONFIG_BYTES (a FIFO would block the reader, /dev/zero fill its memory), not JSON, names a key
    twice (which would count?), or nests too deep for the parser: Python's JSON reader recurses, so a crafted file
    would end in a RecursionError)."""
    path = out / CONFIG
    status = path.stat()
    if not stat.S_ISREG(status.st_mode):
        raise ValueError(f"{path} is not a regular file")
    if status.st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} holds {status.st_size / 2**20:,.0f} MiB, far more than a sweep's config.json")
    try:
        config = json.loads(path.read_text(), object_pairs_hook=unique_keys)
    except RecursionError:
        raise ValueError("nested too deep to be a pe_fast config.json") from None
    if not isinstance(config, dict):
        raise ValueError(f"a JSON {type(config).__name__}, not an object")
    if (unknown := sorted(set(config) - set(CONFIG_PARTS))):
        raise ValueError(f"its part {unknown[0][:40]!r} is not one a sweep writes ({', '.join(CONFIG_PARTS)})")
    for part, kind in CONFIG_PARTS.items():  # absent or null in some older folders
        if config.get(part) is not None and not isinstance(config[part], kind):
            raise ValueError(f"its {part!r} is a JSON {type(config[part]).__name__}, where a sweep writes "
                             f"{'an object' if kind is dict else 'a list' if kind is list else 'text'}")
        if part in CONFIG_TEXT and config.get(part) is not None and not CONFIG_TEXT[part].fullmatch(config[part]):
            raise ValueError(f"its {part!r} is {config[part][:40]!r}, not the {part} a sweep records")
    return config


class KeyNamedTwice(ValueError):
    """A JSON object naming a key twice (JSON readers keep one of the two): which value was meant?"""

    def __init__(self, key: str):
        super().__init__(f"an object names {key[:40]!r} twice")
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json.loads' object_pairs_hook for files from outside: KeyNamedTwice where an object names a key twice."""
    unique = dict(pairs)
    if len(unique) < len(pairs):
        seen = set()
        raise KeyNamedTwice(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return unique


def is_finished(out: Path) -> bool:
    return readable_table(out / RESULTS)


def readable_table(path: Path) -> bool:
    """A results file counts only if it is a regular file that parses (a garbage file in a shared folder is not a
    finished sweep; a FIFO or a device would block the reader)."""
    import pyarrow.parquet
    if not path.is_file():
        return False
    try:
        pyarrow.parquet.read_metadata(path)
    except (OSError, ValueError, pyarrow.ArrowException):
        return False
    return True


class OutFolderError(ValueError):
    """A folder named to be written (the sweep's --out, the pooled report's --out) that cannot be: its message
    follows the flag's name."""


def path_text(value: str | os.PathLike, argument: str) -> str:
    """A path a caller gives (a str or an os.PathLike) as its text; TypeError naming the argument where it is
    neither, or its __fspath__ returns something other than text (bytes, a number)."""
    try:
        text = os.fspath(value)
    except TypeError:
        text = value
    except Exception as error:  # a caller's __fspath__ that raises
        raise TypeError(f"{argument}: its path could not be read ({type(error).__name__}: {brief(str(error))})") \
            from None
    if isinstance(text, str) and type(text) is not str:  # a subclass's own __str__ may say something else
        text = str.__str__(text)
    if not isinstance(text, str):
        raise TypeError(f"{argument}: expected a path (str or os.PathLike giving str), got {brief(value)} "
                        f"({type(text).__name__})")
    return text


# the installed package's source: what pe_fast writes there would mix with its code (and be shipped, or lost, with it)
PACKAGE = Path(__file__).resolve().parents[1]


def check_outside_package(path: Path):
    """OutFolderError where path (through links and ..) lies in the pe_fast package's own folder."""
    if path.resolve().is_relative_to(PACKAGE):
        raise OutFolderError(f"{path}: inside the pe_fast package's own folder {PACKAGE}; choose a place outside it")


SHELL_VARIABLE = re.compile(r"(?:^|/)\$\{?[A-Za-z_]")  # a path part $HOME or ${HOME}


def shell_text_problem(path: str) -> str | None:
    """Why a path to write holds text only a shell expands (a leading ~, a $VARIABLE part), or None: given from
    Python or quoted, out="~/x" made a folder named ~ here, which a later rm -rf ~ would meet."""
    if path.startswith("~"):
        return f"{path!r} begins with ~, which only a shell expands: write the path out ({os.path.expanduser(path)!r})"
    if SHELL_VARIABLE.search(path):
        return (f"{path!r} names a variable, which only a shell expands: write the path out "
                f"({os.path.expandvars(path)!r})")
    return None


def check_out_name(name: str | os.PathLike, kind: str) -> str:
    """The name of a folder or file (kind) to write, as text: not blank (Path("") is ".", the folder one runs in),
    no control character, UTF-8 (as the parquet files record it); else OutFolderError."""
    name = path_text(name, "out")
    if not name.strip():
        raise OutFolderError(f"{name!r} names no {kind}")
    if control_character(name):
        raise OutFolderError(f"{name!r}: holds a control character (a line break?)")
    if name.startswith("-"):  # --out=--version made a folder named so, where a flag was meant
        raise OutFolderError(f"{name!r} begins with -, as a flag does: write ./{name} for a {kind} named so")
    if (problem := shell_text_problem(name)) is not None:
        raise OutFolderError(f"{problem}, or ./{name} for a {kind} named so here")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 text, as os.fsdecode keeps them
        raise OutFolderError(f"{name!r}: holds bytes that are not UTF-8 text; rename it") from None
    return name


def check_out_folder(name: str | os.PathLike, probe: bool = True):
    """A folder to write must be named by text (not blank, no control character, UTF-8 as the parquet files
    record it), be a folder or creatable where its nearest existing parent is writable, and lie outside every
    other results folder (inside one, its packs/ say, it would be read as part of that one, and that folder's
    --resume or report would trip over it). name: as given, before Path("") makes it ".". probe=False leaves the
    write probe (check_writable) to the caller, where other checks come first: it makes and removes a folder."""
    name = check_out_name(name, "folder")
    out = Path(name)
    try:
        out.lstat()
    except (FileNotFoundError, NotADirectoryError):  # to be made; under a file: said below
        pass
    except OSError as error:  # a name longer than the file system takes, a loop of links
        raise OutFolderError(f"{out}: {error.strerror or error}")
    if out.exists() and not out.is_dir():
        raise OutFolderError(f"{out} is a file, not a folder")
    # a/missing/.. names nothing in a shell, but mkdir(parents=True) would make a/missing on the way and leave it
    for i, part in enumerate(out.parts):
        if part == ".." and i > 0 and not (before := Path(*out.parts[:i])).is_dir():
            raise OutFolderError(f"{out}: {before} is not a folder, so {before}/.. names none; write the path "
                                 f"without it")
    for path in (out, *out.absolute().parents):
        if path.exists():
            existing = path
            break
        if path.is_symlink():  # mkdir would fail on the link after the checks
            raise OutFolderError(f"{out}: {path} is a link to {os.readlink(path)}, which does not exist")
    if not existing.is_dir():
        raise OutFolderError(f"{out}: {existing} is a file, so the folder cannot be made")
    check_outside_package(out)
    home = next((p for p in out.resolve().parents if is_results_folder(p)), None)
    if home is not None:  # before the probe below, which would touch that folder
        raise OutFolderError(f"{out} lies inside the results folder {home}; choose a folder outside it")
    if probe:
        check_writable(out)


def check_writable(out: Path):
    """OutFolderError where nothing can be made in out (or, where it does not exist yet, its nearest existing
    parent): a real probe, made and removed, since permission bits do not bind root and some file systems are
    read-only."""
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as error:
        raise OutFolderError(f"{out}: cannot write in {existing} ({error.strerror or error})")


def sweep_of_packs(folder: Path) -> Path | None:
    """The sweep whose packs/ (or one pack of it, packs/<i>) folder is, or None: a folder given for DIR that is
    part of DIR."""
    folder = folder.resolve()
    if folder.name == "packs" and is_results_folder(folder.parent):
        return folder.parent
    if PACK_NAME.fullmatch(folder.name) and folder.parent.name == "packs" and is_results_folder(folder.parent.parent):
        return folder.parent.parent
    return None


def is_results_folder(folder: Path) -> bool:
    """Whether folder is a sweep's or a pooled report's: its config.json beside packs/, or a config.json of
    theirs alone (a sweep's first file); or, as the readers take a folder without config.json, one holding
    results.parquet or curves.parquet, or a finished pack. Another program's config.json is not."""
    try:
        if (folder / RESULTS).is_file() or (folder / CURVES).is_file() or (
                (folder / "packs").is_dir() and any(pack.name.isdigit() and (pack / RESULTS).is_file()
                                                    for pack in (folder / "packs").iterdir())):
            return True
    except OSError:  # a folder not to be read: judged by its config.json alone
        pass
    if not (folder / CONFIG).is_file():
        return False
    if (folder / "packs").is_dir():
        return True
    try:
        config = read_config(folder)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and ("settings" in config or POOLED_FROM in config)


class LeavesFolder(Exception):
    """A path in the results folder that leads out of it (a symbolic link): nothing is written through it."""


def check_inside(out: Path):
    """Raise LeavesFolder if any link in DIR (at any depth) points outside DIR: the sweep and the report write
    and delete inside DIR only, and a link would carry those writes elsewhere (and bring a reader's data from
    elsewhere)."""
    root = out.resolve()
    for folder, subfolders, files in os.walk(out):
        for name in subfolders + files:
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            try:
                target = path.resolve()
            except (RuntimeError, OSError):  # a loop of links (Python 3.12 and older: RuntimeError)
                raise LeavesFolder(f"{path} is a link that leads round in a loop; pe_fast reads and writes inside "
                                   f"a results folder only: replace the link by the folder or file itself") from None
            if not target.is_relative_to(root):
                raise LeavesFolder(f"{path} is a link to {target}, outside {out}; pe_fast reads and writes inside "
                                   f"its folder only: replace the link by the folder or file itself")


def write_parquet(table: pd.DataFrame, file: BinaryIO):
    """Written to a file we opened: given a path, pandas expands a leading ~ (a folder named "~" would be $HOME) and
    pyarrow reads "s3:..." as a URL."""
    table.to_parquet(file, index=False)


def write_final(out: Path, results: pd.DataFrame, curves: pd.DataFrame, pe_tables: dict[str, np.ndarray],
                summary: str):
    """Every pack together in the top-level files; results.parquet last (its presence means finished)."""
    write_atomic(out / PE_TABLES, lambda file: save_npz(file, pe_tables))
    write_atomic(out / CURVES, lambda file: write_parquet(curves, file))
    write_atomic(out / SUMMARY, lambda file: file.write(summary.encode()))
    write_atomic(out / RESULTS, lambda file: write_parquet(results, file))
    write_digests(out)


def remove_report(out: Path) -> list[str]:
    """The report's text and RDMs (report.md, rdms.hdf5), removed: a sweep that finishes has outgrown a report of
    its unfinished state. figures/ is kept (it may hold the user's own files; the report redraws its figures). The
    names removed."""
    removed = []
    for name in (REPORT, RDMS):
        path = out / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
    return removed


def remove_partials(out: Path):
    """Temporary files and folders of a writer that was killed mid-write."""
    for folder in (out, out / "packs"):
        if folder.is_dir():
            for leftover in folder.glob(f".*{PARTIAL}*"):
                # a link is removed, not what it leads to (rmtree refuses a link to a folder)
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink(missing_ok=True)


# ---- packs and checkpoints -----------------------------------------------------------------------------------


def pack_folder(out: Path, index: int) -> Path:
    return out / "packs" / str(index)


def checkpoint_path(out: Path, index: int) -> Path:
    return out / "packs" / f"{index}.checkpoint.pt"


def step_path(out: Path, index: int) -> Path:
    return out / "packs" / f"{index}.step"


def write_step(out: Path, index: int, step: int):
    path = step_path(out, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda file: file.write(f"{step}\n".encode()), under=out)


def read_step(out: Path, index: int) -> int | None:
    """The step a worker last reported for pack `index`; None before it reports, after the pack is done, or when
    the file cannot be read (progress only: never an error)."""
    try:
        return int(step_path(out, index).read_text())
    except (OSError, ValueError):
        return None


# a pack folder's name as pack_folder writes it: "１" and "01" pass str.isdigit and int() but name another folder
PACK_NAME = re.compile(r"0|[1-9][0-9]*")


def packs_problem(out: Path, count: int | None) -> str | None:
    """What in DIR/packs a sweep of `count` packs (None: not known) did not write there, in words, or None: packs a
    file, a name no sweep writes (packs/00 beside packs/0), a pack beyond the sweep's, a pack folder that is a file
    or a link (a link would count one pack's results twice, escape the digests' check, or be removed as a tree when
    the pack is written). The same for --resume and for every reader."""
    packs = out / "packs"
    if not packs.exists() and not packs.is_symlink():
        return None
    if not packs.is_dir():
        return f"{packs} is not a folder; delete it to retrain every pack"
    has = "" if count is None else f" (it has {count}: packs/0{f' … packs/{count - 1}' if count > 1 else ''})" \
        if count else " (it has none)"
    for path in sorted(packs.iterdir()):
        index = path.name.split(".")[0]
        if hidden(path.name):  # a killed writer's temporary file or folder is removed on --resume
            continue
        if not (PACK_NAME.fullmatch(index) and path.name in (index, f"{index}.checkpoint.pt", f"{index}.step")):
            return f"{path} is not one of this sweep's packs or checkpoints{has}; move it out of {packs}"
        if count is not None and int(index) >= count:
            return f"{path} is not a pack of this sweep{has}; move it out of {packs}"
        if path.name == index and path.is_symlink():
            return f"{path} is a link; a pack folder is the sweep's own: delete the link to retrain pack {index}"
        if path.name == index and not path.is_dir():
            return f"{path} is not a folder; delete it to retrain pack {index}"
    return None


def finished_packs(out: Path) -> set[int]:
    folder = out / "packs"
    return {int(p.name) for p in folder.iterdir() if PACK_NAME.fullmatch(p.name) and readable_table(p / RESULTS)} \
        if folder.is_dir() else set()


def save_checkpoint(out: Path, index: int, state: dict):
    path = checkpoint_path(out, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    # serialised in memory, then written as any file is: torch.save writing the file itself turns a full disk's
    # OSError into a RuntimeError of its own (a traceback, not the sweep's one line)
    serialised = io.BytesIO()
    torch.save(state, serialised)
    write_atomic(path, lambda file: file.write(serialised.getbuffer()), under=out)


class UnreadableCheckpoint(Exception):
    """A checkpoint that cannot be loaded safely: one line naming it and what to do."""


# numpy arrays and scalars as plain data (checkpoints from before 2026-11-26 hold the initial PE tables as
# arrays): rebuilding them calls numpy's constructors only, nothing named by the file
_NUMPY_DATA = [np._core.multiarray._reconstruct, np._core.multiarray.scalar, np.ndarray, np.dtype,
               *(type(np.dtype(t)) for t in (np.float32, np.float64, np.int64, np.bool_))]


def _items_within(value, limit: int) -> tuple[bool, list[torch.Tensor]]:
    """(whether value's containers and leaves, counted each time they are reached (as every walk over it does),
    number at most limit; the tensors reached): a pickle may refer to one list from two places at each of 30
    levels, 2**30 items from a few hundred bytes, or to a list from inside itself."""
    stack, count, tensors = [value], 0, []
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return False, tensors
        if isinstance(item, torch.Tensor):
            tensors.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
    return True, tensors


def _load_checkpoint(path: Path, index: int, mmap: bool) -> dict:
    try:
        with torch.serialization.safe_globals(_NUMPY_DATA):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # unpickling refused, truncated, or not a checkpoint at all
        # torch's message buries the cause ("unsupported GLOBAL posix.system ...") among advice
        advice = ("Weights only load failed", "Check the documentation", "Please file an issue")
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        cause = next((line for line in lines if not line.startswith(advice)), lines[0] if lines else "")
        raise UnreadableCheckpoint(f"{path} cannot be loaded safely ({type(error).__name__}: {cause[:160]}); "
                                   f"delete it to retrain pack {index} from its start")
    # a pickle spends at least a byte on each item it holds once: more items than bytes were reached twice
    within, tensors = _items_within(state, limit := max(2**20, path.stat().st_size))
    if not within:
        raise UnreadableCheckpoint(f"{path} holds more than {limit:,} values, more than its size can hold without "
                                   f"referring to some many times over; delete it to retrain pack {index} from its "
                                   f"start")
    # the bytes of its tensors as the load makes them contiguous: one expanded from a stored value may declare GBs
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors)
    if (problem := inflation(path, tensor_bytes, stored_bytes(path), "a checkpoint pe_fast writes")) is not None:
        raise UnreadableCheckpoint(f"{problem}; delete it to retrain pack {index} from its start")
    # what the checks after compare is a tensor's shape and dtype: a sparse one failed in the copy, a meta one
    # (no values) in the comparisons or, passing them, mid-training, one taking a gradient in the optimizer's step
    if (odd := next((t for t in tensors if t.is_meta or t.layout != torch.strided or t.requires_grad
                     or type(t) is not torch.Tensor), None)) is not None:
        kind = ("meta" if odd.is_meta else str(odd.layout) if odd.layout != torch.strided
                else "gradient-taking" if odd.requires_grad else type(odd).__name__)
        raise UnreadableCheckpoint(f"{path} holds a {kind} tensor, which no checkpoint pe_fast writes holds; delete "
                                   f"it to retrain pack {index} from its start")
    return state



def load_checkpoint(out: Path, index: int) -> dict | None:
    """The training state of pack `index`, or None. Loaded with weights_only=True: tensors and plain Python and
    numpy values only, so a crafted file (folders are shared) runs no code."""
    path = checkpoint_path(out, index)
    if not path.is_file():
        return None
    # each tensor its own contiguous storage: torch.save keeps views, and an expanded or shared one loaded into an
    # optimizer's state is written through in place (a traceback, or two moments that move as one)
    try:
        return migrate.checkpoint(torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda tensor: tensor.clone(memory_format=torch.contiguous_format),
            _load_checkpoint(path, index, mmap=False)))
    except ValueError as error:
        raise UnreadableCheckpoint(f"{path}: {error}; delete it to retrain pack {index} from its start") from None


MAX_TRAINING_SECONDS = 1e9  # a checkpoint's training time so far: 31 years is no pack's
CURVES_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # the columns an evaluation writes: names, not text


def _checkpoint_values_problem(state: dict, steps: int) -> str | None:
    """What in a checkpoint's training time and curves no sweep wrote, or None: they become the pack's
    train_seconds and curves.parquet, which the results folder's reader refuses beyond float32 (after training)."""
    seconds = state.get("seconds", 0.0)
    if not (isinstance(seconds, numbers.Real) and 0 <= seconds <= MAX_TRAINING_SECONDS):
        return f"seconds {seconds!r:.40}"
    curves = state.get("curves", [])
    if not isinstance(curves, list):
        return f"curves of type {type(curves).__name__}"
    for row in curves:
        step = row.get("step", 0) if isinstance(row, dict) else None
        if not (isinstance(step, numbers.Integral) and not isinstance(step, bool) and 0 <= step <= steps):
            return f"a curves row {str(row)[:60]}"
        for key, value in row.items():
            # a bool is not a score (parquet refused the mixed column after training); an int beyond int64 failed
            # there too, one beyond float's range in np.isfinite
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
                number = False
            elif isinstance(value, numbers.Integral):  # parquet stores ints in int64
                number = -2**63 <= int(value) < 2**63
            else:
                number = not (np.isfinite(value) and abs(value) > FLOAT32_MAX)
            if not (isinstance(key, str) and CURVES_KEY.fullmatch(key) and (number or value is None)):
                return f"curves value {key!r:.40}: {value!r:.40}"
    return None


def check_checkpoint(out: Path, index: int, keys: tuple[str, ...], steps: int) -> None:
    """Raise UnreadableCheckpoint unless pack `index`'s checkpoint (if any) loads safely, holds these keys and
    (if it has one) a step of at most `steps`, and training time and curves of the kinds a sweep writes;
    memory-mapped, so the check reads the pickle and not the tensors."""
    path = checkpoint_path(out, index)
    if path.exists() and not path.is_file():
        raise UnreadableCheckpoint(f"{path} is not a file; delete it to retrain pack {index} from its start")
    if not path.is_file():
        return
    state = _load_checkpoint(path, index, mmap=True)
    missing = [key for key in keys if key not in state] if isinstance(state, dict) else list(keys)
    step = state.get("step", 0) if isinstance(state, dict) else None
    if missing:
        what = f"lacks {', '.join(missing)}"
    elif not (type(step) is int and 0 <= step <= steps):
        what = f"has step {step!r}, not one of 0…{steps}"
    else:
        what = (problem := _checkpoint_values_problem(state, steps)) and f"holds {problem}"
    if what:
        raise UnreadableCheckpoint(f"{path} is not a checkpoint of this sweep ({what}); delete it to retrain "
                                   f"pack {index} from its start")


def write_pack(out: Path, index: int, results: pd.DataFrame, curves: pd.DataFrame,
               pe_tables: dict[str, np.ndarray], trained_with: dict,
               save_weights: Callable[[Path], None] | None = None):
    """DIR/packs/<index>/ appears whole or not at all; the pack's checkpoint and step file are removed after.
    trained_with: the settings it trained with (TRAINED_WITH). save_weights(path): writes the pack's trained models
    there (weights.py), unless --no-weights."""
    (out / "packs").mkdir(parents=True, exist_ok=True)
    # Assembled beside packs/, not in it: a reader of packs/*/ (the report) must never see a partial pack.
    tmp = Path(tempfile.mkdtemp(prefix=f".pack-{index}{PARTIAL}", dir=out))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the pack from the rest of a group
        for name, table in ((RESULTS, results), (CURVES, curves)):
            with open(tmp / name, "wb") as file:
                write_parquet(table, file)
        np.savez_compressed(tmp / PE_TABLES, **pe_tables)
        (tmp / TRAINED_WITH).write_text(json.dumps(trained_with, indent=2))
        if save_weights is not None:
            save_weights(tmp / WEIGHTS)
            os.chmod(tmp / WEIGHTS, 0o666 & ~_umask())  # safetensors writes 0600; results follow the umask
        write_digests(tmp)
        for file in tmp.iterdir():
            with open(file, "rb+") as handle:
                os.fsync(handle.fileno())
        if pack_folder(out, index).is_dir():  # a pack folder whose results did not parse (not finished)
            shutil.rmtree(pack_folder(out, index))
        os.replace(tmp, pack_folder(out, index))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    checkpoint_path(out, index).unlink(missing_ok=True)
    step_path(out, index).unlink(missing_ok=True)
