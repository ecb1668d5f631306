"""How much a file from outside may declare against what it holds on disk: a few MB may declare GBs once read (a
"bomb": a compressed archive member, a table's row count). One rule for every reader that would read such a file
whole, the data files' (user_data) and the results folders' (pe_fast.results.reading), checked before reading."""
from __future__ import annotations

from pathlib import Path

# Above this floor, what a table or array expands to may be at most EXPANSION times its bytes on disk: pe_fast's own
# files expand about 1x (floats compress little), a table of mostly empty (NaN) columns about 100x.
EXPANSION, EXPANSION_FLOOR = 256, 2**28


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
