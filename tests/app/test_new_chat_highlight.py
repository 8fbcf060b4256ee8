"""Issue 35, item 10: after Ctrl+N the chat opened before stayed highlighted in the chat list.
The list's selection was cleared with the selection model's signals blocked, so the view was
never told to repaint the row: the screen kept the old highlight until something else painted
it. Checked here on the paint events the list's viewport gets (a grab repaints everything, so
it cannot see a stale screen), and on the pixels of the rows."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QEvent, QObject, Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402


@pytest.fixture
def window(idle_window):
    return idle_window


class Paints(QObject):
    """The regions the viewport is asked to paint."""

    def __init__(self, widget):
        super().__init__()
        self.regions = []
        widget.installEventFilter(self)

    def eventFilter(self, _watched, event):  # noqa: N802
        if event.type() == QEvent.Type.Paint:
            self.regions.append(event.region())
        return False

    def painted(self, rect) -> bool:
        return any(region.intersects(rect) for region in self.regions)


def row_rect(window, chat_id):
    return window.chat_list.visualRect(window.chat_model.index(window.chat_model.row_of(chat_id)))


def row_painted_selected(window, chat_id) -> bool:
    """Whether the window paints the chat's row unlike the list's empty background (the theme's
    selection colour), sampled left of the title and low in the row (a day's heading may sit
    above the first row of the day)."""
    view = window.chat_list
    image = window.grab().toImage()  # the viewport's own grab has no background (transparent)
    rect = row_rect(window, chat_id)
    at = view.viewport().mapTo(window, rect.topLeft())
    blank = view.viewport().mapTo(window, view.viewport().rect().bottomLeft())
    return image.pixelColor(at.x() + 6, at.y() + rect.height() - 8) != image.pixelColor(blank.x() + 6, blank.y() - 3)


def test_ctrl_n_repaints_the_chat_it_leaves_unhighlighted(qtbot, window):
    alpha = window.store.create_chat("Alpha")
    beta = window.store.create_chat("Beta")
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(alpha)
    qtbot.waitExposed(window)
    qtbot.wait(50)
    assert row_painted_selected(window, alpha) and not row_painted_selected(window, beta)

    paints = Paints(window.chat_list.viewport())
    QTest.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.session.current_chat_id is None
    qtbot.waitUntil(lambda: paints.painted(row_rect(window, alpha)), timeout=2000)
    assert not window.chat_list.selectionModel().hasSelection()
    assert not row_painted_selected(window, alpha) and not row_painted_selected(window, beta)

    paints.regions.clear()
    window.navigation.open_chat(beta)  # e.g. from search: the highlight follows, on screen too
    qtbot.waitUntil(lambda: paints.painted(row_rect(window, beta)), timeout=2000)
    assert row_painted_selected(window, beta) and not row_painted_selected(window, alpha)
    assert window.navigation.selected_chat_id() == beta
