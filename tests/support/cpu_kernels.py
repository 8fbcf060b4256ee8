"""The fixture for tests that pick a native CPU kernel variant or a thread count: the process
is left as it was found (the kernels' choice is process-wide)."""
from __future__ import annotations

import pytest

from tramontane.kernels import cpu_native


@pytest.fixture
def restore_cpu_kernel_settings():
    if not cpu_native.AVAILABLE:  # nothing to pick, nothing to restore
        yield
        return
    variant, threads = cpu_native.variant(), cpu_native.threads()
    yield
    cpu_native.use_variant(variant)
    cpu_native.set_threads(threads)
