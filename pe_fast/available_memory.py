"""The memory free for a new allocation on the CPU, one rule for every check that compares a size with it (the
op's attention maps, a layer's weights, a pack's models, a data file's declared size)."""
from __future__ import annotations

import os
import resource


def available_bytes() -> int:
    """The memory free for a new allocation: Linux's MemAvailable (else the pages the system counts free), within
    the process's address-space limit (ulimit -v), where it has one."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/meminfo") as meminfo:
            available = next((int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")),
                             available)
    except (OSError, ValueError, IndexError):
        pass
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    return available if limit == resource.RLIM_INFINITY else min(available, limit)
