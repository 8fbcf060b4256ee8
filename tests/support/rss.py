"""Peak memory of this process on Linux, for tests that bound it: reset the peak, read it."""
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
