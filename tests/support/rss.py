"""Memory of this process on Linux, for tests that bound it: reset the peak RSS, read it; which
pages of a mapping are resident."""
from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def helper_env(**extra: str) -> dict[str, str]:
    """The environment for a test file run as a helper script: `support` importable."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(TESTS) + (os.pathsep + path if path else ""), **extra}


def status_bytes(field: str) -> int:
    """A /proc/self/status size field ("VmRSS", "VmHWM", "VmData") in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> int:
    """Reset the peak RSS (VmHWM) to the current RSS (Linux ≥ 4.0) and return that RSS."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return status_bytes("VmRSS")


def peak_since(base: int) -> int:
    """Bytes the peak RSS rose above `base` (what reset_peak returned)."""
    return status_bytes("VmHWM") - base


def pages_present(view) -> list[bool]:
    """Whether each whole page inside a numpy array's bytes is mapped in this process now
    (/proc/self/pagemap, bit 63: present; readable without privileges). A file page given
    back with madvise(DONTNEED) is not present until it is read again."""
    import numpy as np

    page = os.sysconf("SC_PAGE_SIZE")
    first, end = -(-view.ctypes.data // page), (view.ctypes.data + view.nbytes) // page
    with open("/proc/self/pagemap", "rb") as fh:
        fh.seek(first * 8)
        entries = np.frombuffer(fh.read((end - first) * 8), dtype="<u8")
    return [bool(e >> 63) for e in entries]
