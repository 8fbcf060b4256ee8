"""Work around a PySide6 6.12 bug on CPython < 3.12: every wrapped C++ method that returns
void (setText, setMarkdown, ...) and a few that return an empty QVariant drop one reference to
`None` without taking it (3.12+ makes None immortal, so the bug is invisible there). After some
thousands of calls None's count reaches zero and the interpreter aborts with
"none_dealloc: deallocating None". `True`/`False` are hit the same way.

On those versions we give the singletons a very large reference count once, which makes them
effectively immortal, as they are on 3.12+. Importing this module is enough; it is idempotent.
"""
from __future__ import annotations

import ctypes
import sys

_MARGIN = 1 << 40  # far more calls than a process can make, far below Py_ssize_t overflow
_applied = False


def apply() -> bool:
    """Make None/True/False/Ellipsis/NotImplemented effectively immortal; True if done."""
    global _applied
    if _applied or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    if hasattr(sys, "gettotalrefcount"):  # a debug build: the object header is laid out differently
        return False
    for obj in (None, True, False, Ellipsis, NotImplemented):
        # ob_refcnt is the first field of every PyObject in release builds.
        ref = ctypes.c_ssize_t.from_address(id(obj))
        if ref.value < _MARGIN:
            ref.value += _MARGIN
    _applied = True
    return True


apply()
