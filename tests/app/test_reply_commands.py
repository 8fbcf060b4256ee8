"""Found by using the window with the mouse: after clicking Send (or Save & resend, Regenerate,
Stop) the clicked button was disabled while the reply was written, and Qt moved the keyboard
focus to the first widget in the window, the chat search box, so the next message typed went
into the search and filtered the chat list away. The focus now goes back to the composer."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


from support.app_window import GREEDY, MMPROJ, MODEL  # noqa: E402


@pytest.fixture
def window(qtbot, idle_window):
    w = idle_window
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is not None)
    w.session.param_overrides = dict(GREEDY, max_tokens=6, ignore_eos=True)
    w.model_loading.load_model(str(MODEL), str(MMPROJ))
    qtbot.waitUntil(lambda: w.session.engine_info is not None, timeout=30000)
    return w


def click_and_wait(qtbot, window, button):
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.wait(50)


def test_focus_returns_to_the_composer_after_a_click_starts_a_reply(qtbot, window):
    composer = window.composer
    composer.edit.setPlainText("Hello")
    click_and_wait(qtbot, window, composer.send_button)
    assert QApplication.focusWidget() is composer.edit

    click_and_wait(qtbot, window, composer.regenerate_button)
    assert QApplication.focusWidget() is composer.edit

    click_and_wait(qtbot, window, window.view.widgets[-1].buttons["regenerate"])
    assert QApplication.focusWidget() is composer.edit

    first = window.view.widgets[0]
    qtbot.mouseClick(first.buttons["edit"], Qt.MouseButton.LeftButton)
    assert QApplication.focusWidget() is first.editor
    first.editor.setPlainText("Hello again")
    click_and_wait(qtbot, window, first.edit_send)
    assert QApplication.focusWidget() is composer.edit

    # Typing now writes the next message, not a search.
    qtbot.keyClicks(QApplication.focusWidget(), "next")
    assert composer.edit.toPlainText() == "next" and window.search.text() == ""


def test_focus_returns_to_the_composer_after_stop(qtbot, window):
    window.session.param_overrides["max_tokens"] = 480
    composer = window.composer
    composer.edit.setPlainText("Hello")
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        qtbot.mouseClick(composer.send_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: composer.stop_button.isEnabled())
        qtbot.mouseClick(composer.stop_button, Qt.MouseButton.LeftButton)
    qtbot.wait(50)
    assert QApplication.focusWidget() is composer.edit
