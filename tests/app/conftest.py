"""The real window on the tiny fixture model, and the isolation every window test runs in."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_usual_model_places(monkeypatch):
    """The Models dialog looks for GGUF files in Downloads, other apps' folders...: not the
    machine's own in tests (a test that wants some sets TRAMONTANE_MODEL_PLACES)."""
    monkeypatch.setenv("TRAMONTANE_MODEL_PLACES", "")


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No user data or models folder, no network (support.app_window.isolate); a module whose
    every test opens windows takes it with `pytest.mark.usefixtures("isolated")`."""
    from support.app_window import isolate

    isolate(tmp_path, monkeypatch)


@pytest.fixture
def window(qtbot, tmp_path, isolated):
    """The real window with the tiny model and its projector loaded."""
    from support.app_window import close_window, make_window

    w = make_window(qtbot, tmp_path / "data")
    yield w
    close_window(w)


@pytest.fixture
def idle_window(qtbot, tmp_path, isolated):
    """The real window with no model loaded."""
    from support.app_window import close_window, make_window

    w = make_window(qtbot, tmp_path / "data", load=False)
    yield w
    close_window(w)


@pytest.fixture
def worker(qtbot):
    """A running engine worker (a real QThread owning the engine), stopped after the test."""
    from tramontane.app.worker import EngineWorker

    w = EngineWorker()
    w.start()
    yield w
    w.stop()


@pytest.fixture
def settings(tmp_path):
    """The app's settings in a fresh data folder."""
    from tramontane.app.config import AppSettings
    from tramontane.app.store import Store

    store = Store(tmp_path / "data")
    yield AppSettings(store)
    store.close()
