"""What this machine can give us now: free RAM. Read by the model's loader (mistral3: whether
float32 weight copies fit), the planner and the KV cache's check (runtime), so it sits below both."""
from __future__ import annotations

import os


def available_ram() -> int:
    """Bytes the system could give us now; 0 when unknown. MemAvailable counts reclaimable page
    cache, which matters: the memory-mapped model file itself fills the page cache."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: unknown
        return 0
