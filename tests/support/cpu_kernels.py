"""For tests that pick the CPU's matmul path: a native kernel variant or a thread count (the
fixture leaves the process as it was found: the kernels' choice is process-wide), or the float32
torch path (`cpu_exact`)."""
from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

from tramontane.env import variable
from tramontane.kernels import cpu_native
from tramontane.kernels.linear import is_cpu_exact


@contextmanager
def cpu_exact(on: bool = True):
    """CPU matmuls on the float32 torch path (on) or the native kernels (off) inside the block,
    in every thread: TRAMONTANE_CPU_EXACT set for the block and kernels.linear.is_cpu_exact read
    again, then both as they were."""
    name = variable("cpu_exact")
    before = os.environ.get(name)
    os.environ[name] = "1" if on else "0"
    is_cpu_exact.cache_clear()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
        is_cpu_exact.cache_clear()


@pytest.fixture
def restore_cpu_kernel_settings():
    if not cpu_native.AVAILABLE:  # nothing to pick, nothing to restore
        yield
        return
    variant, threads = cpu_native.variant(), cpu_native.threads()
    yield
    cpu_native.use_variant(variant)
    cpu_native.set_threads(threads)
