"""Sizes for people: the one way bytes are written in the window, the Models dialog and the
CLI's lists."""
from __future__ import annotations


def size_text(n: int | float | None) -> str:
    """A byte count for people, in decimal units (as the hub and file managers list sizes:
    1 GB = 10^9 bytes); "?" when not known."""
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
