"""Found by using the window: long texts in the model bar or the chat header must not force the
window wider than the screen (a real model's file names are ~50 characters each)."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QLabel  # noqa: E402

from tramontane.app.engine_info import EngineInfo  # noqa: E402

LONG_MODEL = "/models/Mistral-Small-3.1-24B-Instruct-2503-UD-Q4_K_XL-with-a-long-suffix.gguf"
LONG_MMPROJ = "/models/mmproj-Mistral-Small-3.1-24B-Instruct-2503-F16-with-a-long-suffix.gguf"


@pytest.fixture
def window(idle_window):
    return idle_window


def _shrink_to_laptop(qtbot, window, name: str) -> None:
    window.resize(800, 500)
    qtbot.wait(50)
    out = os.environ.get("TRAMONTANE_REVIEW_SHOTS")
    if out:
        window.grab().save(os.path.join(out, name))


def test_long_model_names_do_not_widen_the_window(qtbot, window):
    window.worker.loaded.emit(EngineInfo("x", True, LONG_MODEL, LONG_MMPROJ, "cuda", "17.5 GB GPU", 131072))
    window.resize(1900, 700)
    qtbot.wait(50)
    bar = window.model_bar
    shown = {label: QLabel.text(label) for label in (bar.model_label, bar.projector_label, bar.device_label)}
    assert shown[bar.model_label] == LONG_MODEL.rsplit("/", 1)[1]  # room enough: whole, not cut
    assert shown[bar.projector_label] == "vision"  # a chip; the file in its tooltip
    assert bar.projector_label.accessibleName() == "Projector " + LONG_MMPROJ.rsplit("/", 1)[1]
    assert shown[bar.device_label] == "cuda · 17.5 GB GPU · context 131072"
    _shrink_to_laptop(qtbot, window, "model_bar_800.png")
    assert window.minimumSizeHint().width() <= 800
    assert window.width() == 800
    # Cut to fit, with the whole paths in the tooltips.
    assert QLabel.text(bar.model_label).startswith("Mistral") and "…" in QLabel.text(bar.model_label)
    assert window.model_bar.model_label.toolTip() == LONG_MODEL
    assert window.model_bar.projector_label.toolTip() == LONG_MMPROJ


def test_long_chat_title_does_not_widen_the_window(qtbot, window):
    chat_id = window.store.create_chat("A very long chat title that goes on and on " * 6)
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    _shrink_to_laptop(qtbot, window, "title_800.png")
    assert window.minimumSizeHint().width() <= 800
    assert window.width() == 800
    header = window.chat_title
    assert header.geometry().right() < window.system_button.geometry().left()  # no overlap
    assert "goes on" in header.toolTip()  # the whole title on hover
    assert QLabel.text(header).endswith("…")  # cut with an ellipsis (issue 35), not clipped


def test_long_load_error_does_not_widen_the_window(qtbot, window):
    window.worker.loadFailed.emit("/very/long/path/" + "x" * 150 + ".gguf: not a GGUF file (bad magic)")
    _shrink_to_laptop(qtbot, window, "error_800.png")
    assert window.minimumSizeHint().width() <= 800
    assert window.width() == 800


def test_the_headers_buttons_stand_apart(qtbot, window):
    """In the README's screenshots the Tools switch and System prompt… touched, reading as one
    button of two halves of different heights (no spacing in the header's layout; only the
    switch was styled)."""
    window.resize(1100, 700)
    qtbot.wait(50)
    tools, system = window.tools_button.geometry(), window.system_button.geometry()
    assert system.left() - tools.right() > 4, (tools, system)
    assert (tools.top(), tools.height()) == (system.top(), system.height())
