"""Shared fixtures of the kernel tests."""
from __future__ import annotations

import pytest

from tramontane.kernels import cpu_native


@pytest.fixture
def restore_cpu_kernel_settings():
    """Tests that pick a kernel variant or a thread count leave the process as they found it."""
    variant, threads = cpu_native.variant(), cpu_native.threads()
    yield
    cpu_native.use_variant(variant)
    cpu_native.set_threads(threads)
