"""The real window on the tiny fixture model, for the widget tests that need one."""
from __future__ import annotations

import pytest


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    from support.app_window import close_window, isolate, make_window

    isolate(tmp_path, monkeypatch)
    w = make_window(qtbot, tmp_path / "data")
    yield w
    close_window(w)
