"""Issue 35, item 10: no Cancel while a model loads (the 24B took ~60 s with Unload greyed). The
model bar's Cancel stops the load at its next layer, on the real window: the model loaded
before comes back; with none before, the window is back to no model."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, Qt, Slot  # noqa: E402

from support.app_window import MMPROJ, MODEL, send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


class HoldAtFirstLayer(QObject):
    """Runs on the worker as it reports its first layer and waits there until the test lets it
    go: the load is under way, for as long as the test needs, as a large model's is."""

    def __init__(self, worker):
        super().__init__()
        self.reached, self.go = threading.Event(), threading.Event()
        self.reports: list[float] = []
        worker.loadProgress.connect(self.on_progress, Qt.ConnectionType.DirectConnection)

    @Slot(float, str)
    def on_progress(self, frac, _what):
        self.reports.append(frac)
        if len(self.reports) == 1:
            self.reached.set()
            self.go.wait(30)


def cancel_during_load(qtbot, window, model, mmproj):
    hold = HoldAtFirstLayer(window.worker)
    window.model_loading.load_model(str(model), str(mmproj), check=False)
    qtbot.waitUntil(hold.reached.is_set, timeout=30000)
    bar = window.model_bar
    qtbot.waitUntil(lambda: bar.cancel_button.isVisible(), timeout=5000)
    assert bar.cancel_button.isEnabled() and not bar.unload_button.isEnabled()
    with qtbot.waitSignal(window.worker.loadCancelled, timeout=30000) as cancelled:
        qtbot.mouseClick(bar.cancel_button, Qt.MouseButton.LeftButton)
        assert not bar.cancel_button.isEnabled() and "Cancelling" in bar.model_label.text()
        hold.go.set()
    assert cancelled.args == [str(model)]
    assert all(f < 1.0 for f in hold.reports) and len(hold.reports) == 1  # stopped at the next layer
    return hold


def test_cancel_brings_back_the_model_loaded_before(qtbot, window):
    before = window.session.engine_info
    assert before.mmproj_path == str(MMPROJ)
    cancel_during_load(qtbot, window, MODEL, "")  # the same model, text only: another state
    qtbot.waitUntil(lambda: window.session.engine_info is not None and window.session.loading is None,
                    timeout=30000)
    info = window.session.engine_info
    assert (info.model_path, info.mmproj_path) == (before.model_path, before.mmproj_path)
    assert not window.model_bar.cancel_button.isVisible() and window.model_bar.unload_button.isEnabled()
    assert "was cancelled" in window.statusBar().currentMessage()
    assert window.store.get_message(send(qtbot, window, "still there?")).state == "complete"


def test_cancel_with_no_model_before_leaves_none(qtbot, idle_window):
    window = idle_window
    cancel_during_load(qtbot, window, MODEL, MMPROJ)
    qtbot.waitUntil(lambda: window.session.loading is None, timeout=5000)
    qtbot.wait(300)  # nothing else is on its way to the worker
    assert window.session.engine_info is None and window.worker.engine is None
    bar = window.model_bar
    assert bar.model_label.text() == "No model loaded" and not bar.cancel_button.isVisible()
    assert not window.unload_action.isEnabled()
    assert window.stack.currentWidget() is window.empty
