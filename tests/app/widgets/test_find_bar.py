"""Find in the open chat (issue 35, what LM Studio and Jan users miss): Chat ▸ Find in chat marks
every match in the shown messages, "n of m", Enter / Shift+Enter step and scroll, Esc closes and
unmarks; a reply that came in meanwhile is found at the next step."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402

from tramontane.app.widgets.theme import ACCENT  # noqa: E402


def chat_with(window, texts):
    store = window.store
    chat_id = store.create_chat("winds")
    for i, text in enumerate(texts):
        if i % 2 == 0:
            store.add_message(chat_id, "user", text)
        else:
            store.finish_reply(store.begin_reply(chat_id), text, None)
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    return chat_id


def marks(window):
    """(message index, marked text, background) of every mark in the view."""
    out = []
    for i, w in enumerate(window.view.widgets):
        for sel in w.body.extraSelections():
            out.append((i, sel.cursor.selectedText(), sel.format.background().color().name()))
    return out


def test_find_marks_steps_and_closes(qtbot, idle_window):
    window = idle_window
    filler = "\n\n".join(f"Line {n} about nothing." for n in range(60))
    chat_with(window, ["Which wind is the Mistral?", f"{filler}\n\nThe mistral blows down the Rhône.",
                       "And the tramontane?", "The Tramontane comes from the north-west, like the MISTRAL."])
    window.resize(1100, 500)
    qtbot.wait(50)
    bar = window.find_bar
    find = next(a for a in window.findChildren(type(window.projector_action)) if a.text() == "&Find in chat")
    assert find.shortcut().toString() == "Ctrl+Shift+F"
    find.trigger()
    assert bar.isVisible() and bar.edit.hasFocus()
    qtbot.keyClicks(bar.edit, "mistral")
    accent, other = QColor(ACCENT).name(), "#f6d365"
    assert bar.count.text() == "1 of 3"
    assert marks(window) == [(0, "Mistral", accent), (1, "mistral", other), (3, "MISTRAL", other)]

    scroll = window.view.verticalScrollBar()
    top = scroll.value()
    qtbot.keyClick(bar.edit, Qt.Key.Key_Return)  # the next one, far down the long reply
    assert bar.count.text() == "2 of 3" and marks(window)[1][2] == accent
    assert scroll.value() > top
    qtbot.keyClick(bar.edit, Qt.Key.Key_Return)
    qtbot.keyClick(bar.edit, Qt.Key.Key_Return)  # round to the first
    assert bar.count.text() == "1 of 3"
    qtbot.keyClick(bar.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)  # back to the last
    assert bar.count.text() == "3 of 3" and marks(window)[2][2] == accent

    bar.edit.setText("sirocco")
    assert bar.count.text() == "No match" and marks(window) == []
    bar.edit.setText("tramontane")
    assert bar.count.text() == "1 of 2"
    qtbot.keyClick(bar.edit, Qt.Key.Key_Escape)
    assert not bar.isVisible() and marks(window) == [] and window.composer.edit.hasFocus()


def test_an_open_bar_finds_again_in_the_chat_opened(qtbot, idle_window):
    """Opening another chat while the bar is open: its count and marks are the new chat's, not
    the previous chat's "1 of 3" over an unmarked view."""
    window = idle_window
    first = chat_with(window, ["Is the mistral cold?", "The mistral is cold and dry.", "Mistral again?"])
    window.find_bar.open_bar()
    qtbot.keyClicks(window.find_bar.edit, "mistral")
    assert window.find_bar.count.text() == "1 of 3"
    second = chat_with(window, ["And the bora?", "The bora blows on the Adriatic, unlike the mistral."])
    assert window.session.current_chat_id == second != first
    qtbot.waitUntil(lambda: window.find_bar.count.text() == "1 of 1", timeout=2000)
    assert [(i, text) for i, text, _ in marks(window)] == [(1, "mistral")]
    window.navigation.new_chat()  # an empty chat: nothing to find
    qtbot.waitUntil(lambda: window.find_bar.count.text() == "No match", timeout=2000)
    assert marks(window) == []
