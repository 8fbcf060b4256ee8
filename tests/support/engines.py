"""One module-scoped `engine` fixture for the test files that share a loaded tiny model: each
file names its files and options, the fixture loads them once per module and closes them."""
from __future__ import annotations

import pytest

from tramontane.engine.runtime.local import LocalEngine


def local_engine_fixture(model, mmproj=None, **options):
    """An `engine` fixture: LocalEngine(model, mmproj, device="cpu", **options) for the whole
    module (`options`: context_length, kv_host_budget_mb, ...), closed after its last test."""

    @pytest.fixture(scope="module")
    def engine():
        eng = LocalEngine(model, mmproj, device="cpu", **options)
        yield eng
        eng.close()

    return engine
