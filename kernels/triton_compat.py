"""Optional Triton import: the torch references must import on machines without Triton.

Without Triton, `triton.jit` is a no-op decorator and `HAVE_TRITON` is False; `linear` then
uses the torch reference path on every device.
"""
from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # e.g. Windows / macOS wheels of torch without Triton
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
