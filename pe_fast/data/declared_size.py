"""How much a file from outside may declare against what it holds on disk: a few MB may declare GBs once read (a
"bomb": a compressed archive member, a table's row count). One rule for every reader that would read such a file
whole, the data files' (user_data) and the results folders' (pe_fast.results.reading), checked before reading."""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

# Above this floor, what a table or array expands to may be at most EXPANSION times its bytes on disk: pe_fast's own
# files expand about 1x (floats compress little), a table of mostly empty (NaN) columns about 100x.
EXPANSION, EXPANSION_FLOOR = 256, 2**28
# Every reader computes in float64 (or float32 and float64 copies beside each other): an array of int8 declares 8
# bytes an element once read, not the 1 it stores.
BYTES_READ_PER_ELEMENT = 8


def stored_bytes(path: Path) -> int:
    """The bytes a file holds on disk: its size, less the holes of a sparse file (which read as zeros for free)."""
    status = path.stat()
    allocated = status.st_blocks * 512
    return min(status.st_size, allocated) if allocated else status.st_size  # 0 blocks: a file system that counts none


def inflation(path: Path, declared: int, stored: int, what: str) -> str | None:
    """Why `declared` bytes in memory from `stored` on disk cannot be `what`; None where they can."""
    if declared > max(EXPANSION * stored, EXPANSION_FLOOR):
        return (f"{path} declares {declared / 2**20:,.0f} MiB once read, from {stored / 2**20:,.1f} MiB on disk: "
                f"not {what}")
    return None


def elements_read_bytes(shape, dtype) -> int:
    """The bytes an array of this shape and dtype becomes once read: at least BYTES_READ_PER_ELEMENT an element."""
    return int(np.prod(shape, dtype=object)) * max(BYTES_READ_PER_ELEMENT, np.dtype(dtype).itemsize)


def npz_member_read_bytes(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> int:
    """elements_read_bytes of one .npz member, from its .npy header alone (the first bytes of its stream, however
    compressed); a member that is no .npy array counts its stored size, and its reader refuses it."""
    try:
        with archive.open(member) as stream:
            major, _ = np.lib.format.read_magic(stream)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(stream)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError):
        return member.file_size  # RuntimeError: an encrypted member (zipfile asks for its password)
    return max(member.file_size, elements_read_bytes(shape, dtype))
