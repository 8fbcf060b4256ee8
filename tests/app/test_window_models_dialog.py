"""The Models dialog opened from the real window: it knows the loaded model and the window's
settings, lists a file opened from elsewhere, and a double-click there loads it; Settings'
GPU layers reach the engine. The real engine on the tiny fixture model; no network (offline)."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("pytestqt")

from support.app_window import MODEL  # noqa: E402

TIMEOUT = 30_000


@pytest.fixture
def window(idle_window, tmp_path):
    idle_window.settings.models_dir = str(tmp_path / "models")
    return idle_window


def _row_of(table, name: str) -> int:
    return next(r for r in range(table.rowCount()) if table.item(r, 0).text().startswith(name))


def test_a_file_opened_from_elsewhere_is_listed_marked_and_double_click_loads_it(qtbot, window, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model = elsewhere / "mine.gguf"
    shutil.copyfile(MODEL, model)
    window.load_model(str(model))  # what File → Open model does once a file is picked
    qtbot.waitUntil(lambda: window.engine_info is not None, timeout=TIMEOUT)
    assert window.settings.recent_models[0] == str(model)

    window.open_model_manager()
    dialog = window.model_manager
    assert dialog.settings is window.settings
    table = dialog.local_table
    row = _row_of(table, "mine.gguf")
    assert table.item(row, 0).text() == "mine.gguf  (loaded)"
    assert table.item(row, 7).text() == f"opened from: {elsewhere.resolve()}"
    qtbot.waitUntil(lambda: table.item(row, 5).text() != "", timeout=TIMEOUT)
    assert table.item(row, 5).text() in ("on the CPU", "on the GPU", "partly on the CPU")

    # another model, then back by a double-click in the dialog
    window.load_model(str(MODEL))
    qtbot.waitUntil(lambda: window.engine_info is not None and window.engine_info.model_path == str(MODEL),
                    timeout=TIMEOUT)
    window.open_model_manager()
    dialog = window.model_manager
    table = dialog.local_table
    row = _row_of(table, "mine.gguf")
    assert table.item(row, 0).text() == "mine.gguf"  # no longer the loaded one
    from PySide6.QtCore import Qt
    rect = table.visualRect(table.model().index(row, 0))
    qtbot.mouseClick(table.viewport(), Qt.LeftButton, pos=rect.center())
    qtbot.mouseDClick(table.viewport(), Qt.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: window.engine_info is not None and window.engine_info.model_path == str(model.resolve()),
                    timeout=TIMEOUT)
    import shiboken6
    assert not shiboken6.isValid(dialog) or not dialog.isVisible()  # loading from it closes the dialog


def test_gpu_layers_setting_reaches_the_engine(qtbot, window):
    window.settings.gpu_layers = 0
    window.load_model(str(MODEL))
    qtbot.waitUntil(lambda: window.engine_info is not None, timeout=TIMEOUT)
    placement = window.worker.engine.placement
    assert placement["manual"] and placement["gpu_layers"] == 0
    window.settings.gpu_layers = None
    window.load_model(str(MODEL))
    qtbot.waitUntil(lambda: window.engine_info is not None and not window.worker.engine.placement["manual"],
                    timeout=TIMEOUT)
