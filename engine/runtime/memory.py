"""Giving freed heap memory back to the OS after a load (glibc keeps it otherwise)."""
from __future__ import annotations

import ctypes
import ctypes.util
import sys


def release_freed_heap() -> bool:
    """malloc_trim(0) where the C library is glibc: the temporaries of building a tokenizer and
    loading a model (tens of MB, freed but held by malloc) stop counting as resident. A no-op
    elsewhere; True when it ran."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # glibc only (not musl)
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
