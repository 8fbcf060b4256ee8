"""app/widgets/undo_button.py: the status bar's Undo offer for a deleted chat."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from tramontane.app.widgets.undo_button import UNDO_DELETE_MS, UndoButton  # noqa: E402


def test_an_offer_names_the_chat_and_expires_once(qtbot):
    button = UndoButton()
    qtbot.addWidget(button)
    assert button.isHidden() and button.timer.interval() == UNDO_DELETE_MS
    long_title = "A chat about " + "lakes " * 20
    button.offer(long_title)
    assert not button.isHidden() and button.timer.isActive()
    assert button.text() == f"Undo: deleted “{long_title[:40]}”"
    expired = []
    button.expired.connect(lambda: expired.append(True))
    button.timer.setInterval(10)
    button.timer.start()
    qtbot.waitUntil(lambda: expired == [True], timeout=2000)
    qtbot.wait(50)
    assert expired == [True]  # single shot


def test_withdrawing_hides_it_and_nothing_expires(qtbot):
    button = UndoButton()
    qtbot.addWidget(button)
    expired = []
    button.expired.connect(lambda: expired.append(True))
    button.timer.setInterval(10)
    button.offer("Lakes")
    button.withdraw()
    qtbot.wait(50)
    assert button.isHidden() and not button.timer.isActive() and expired == []
