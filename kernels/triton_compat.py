"""Optional Triton import: the torch references must import on machines without Triton.

Without Triton, `triton.jit` is a no-op decorator and `HAVE_TRITON` is False; `linear` then
uses the torch reference path on every device. Triton is only imported where its kernels can
run (a CUDA GPU, the interpreter, or a process that imported Triton itself, e.g. to compile
them offline): on a CPU-only machine it would add ~70 MB of RSS for nothing.
"""
from __future__ import annotations

import os
import sys

import torch


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


def triton_usable(device: "torch.device") -> bool:  # noqa: F821
    """Can a Triton kernel run on tensors of this device?"""
    if not HAVE_TRITON:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreting()
