"""Optional Triton import: the torch references must import on machines without Triton.

Without Triton, `triton.jit` is a no-op decorator and `HAVE_TRITON` is False; `linear` then
uses the torch reference path on every device. Triton is only imported where its kernels can
run (a CUDA GPU, the interpreter, or a process that imported Triton itself, e.g. to compile
them offline): on a CPU-only machine it would add ~70 MB of RSS for nothing.
"""
from __future__ import annotations

import functools
import os
import shutil
import sys
import sysconfig

import torch

from ..env import read_env


def _triton_wanted() -> bool:
    return ("triton" in sys.modules or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
            or torch.cuda.is_available())


try:
    if not _triton_wanted():
        raise ImportError("no device can run Triton kernels here")
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # e.g. Windows / macOS wheels of torch without Triton, or a CPU-only machine
    HAVE_TRITON = False

    class _NoTriton:
        @staticmethod
        def jit(fn=None, **_kwargs):
            return fn if fn is not None else (lambda f: f)

        @staticmethod
        def cdiv(a, b):
            return -(-a // b)

    class _NoTl:
        constexpr = object

    triton = _NoTriton()
    tl = _NoTl()


def interpreting() -> bool:
    """True when Triton runs kernels on CPU tensors (TRITON_INTERPRET=1, tests without a GPU)."""
    return HAVE_TRITON and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def sm_count(device: "torch.device") -> int:  # noqa: F821
    """Streaming multiprocessors of a CUDA device (cached: launch configs ask per call); 4 under
    the interpreter, small enough that tests take the split paths too."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


@functools.lru_cache(maxsize=1)
def _c_compiler_found() -> bool:
    """Could Triton build its launcher here? It needs a C compiler ($CC, cc, gcc or clang on
    PATH) and Python.h."""
    cc = os.environ.get("CC", "").split()
    if not (cc and shutil.which(cc[0])) and not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        return False
    return os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))


def aot_mode() -> bool:
    """Launch CUDA kernels from the ahead-of-time artifacts (kernels/aot.py) instead of Triton's JIT?
    TRAMONTANE_TRITON_AOT=1/0 decides; else yes in a frozen bundle or without a C compiler
    (Triton's JIT would fail at its first launch), no otherwise. Never under the interpreter."""
    if interpreting():
        return False
    choice = read_env().triton_aot
    if choice is not None:
        return choice
    return bool(getattr(sys, "frozen", False)) or not _c_compiler_found()


def triton_usable(device: "torch.device") -> bool:  # noqa: F821
    """Can a Triton kernel run on tensors of this device? On CUDA in AOT mode: when artifacts
    for the device's compute capability exist (else one log line, and callers take the torch path)."""
    if device.type == "cuda":
        if aot_mode():
            from . import aot

            return aot.available(device)
        return HAVE_TRITON
    return HAVE_TRITON and device.type == "cpu" and interpreting()


def launch(kernel, grid, *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)`: the one place kernels are launched. On CUDA in AOT mode
    through the precompiled cubins (no compiler); otherwise Triton's JIT (or interpreter)."""
    if _launch_hook is not None and _launch_hook(kernel, grid, args, kwargs):
        return  # the hook took the launch (tests recording launches without running them)
    if aot_mode():
        from . import aot

        aot.launch(kernel, grid, args, kwargs)
    else:
        kernel[grid](*args, **kwargs)


# Tests set this to see every launch (kernel, grid, args, kwargs) the kernels make; a true
# return skips the launch.
_launch_hook = None
