"""app/warm_up.py: the window's first turn on screen."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

pytestmark = pytest.mark.usefixtures("isolated")


def test_missing_cpu_kernels_are_said_at_start(qtbot, idle_window, monkeypatch):
    """First run: without a C compiler the CPU kernels are not built; the window says so once
    the engine is imported instead of running slowly in silence."""
    from tramontane.kernels import cpu_native

    monkeypatch.setattr(cpu_native, "AVAILABLE", False)
    idle_window.worker.warmedUp.emit(0.5)
    text = idle_window.status_label.text()
    assert "CPU kernels are not built" in text and "C compiler" in text and "TRAMONTANE_REINSTALL=1" in text
