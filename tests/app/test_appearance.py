"""app/appearance.py: zoom and theme. Found by using View → Zoom: only the chat list grew. The
window's style sheet stops Qt's font inheritance at every styled widget (the conversation, each
message, the message box), so the messages and the text being typed kept the system size, now
and after reopening."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication  # noqa: E402

from support.app_window import close_window, make_window  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def open_window(qtbot, data_dir):
    w = make_window(qtbot, data_dir, load=False)
    return w, w.store


def sizes(window) -> set[int]:
    out = {window.composer.edit.font().pointSize()}
    for mw in window.view.widgets:
        out.add(mw.body.font().pointSize())
        out.add(mw.body.document().defaultFont().pointSize())
    return out


def test_zoom_reaches_messages_and_the_message_box(qtbot, tmp_path):
    base = QApplication.font().pointSize()
    w, store = open_window(qtbot, tmp_path / "data")
    chat = store.create_chat("Zoom")
    store.add_message(chat, "user", "hello", [])
    reply = store.begin_reply(chat)
    store.finish_reply(reply, "a **reply**\n\n```python\nx = 1\n```", None)
    w.navigation.refresh_chat_list()
    w.navigation.open_chat(chat)
    qtbot.wait(20)
    assert sizes(w) == {base}
    height = w.view.widgets[1].body.height()

    w.appearance.zoom(+4)
    qtbot.wait(20)
    assert sizes(w) == {base + 4}
    assert w.view.widgets[1].body.height() > height  # re-fitted to the bigger text

    # Messages built after the zoom (another chat, an edit box) get it too.
    other = store.create_chat("Other")
    store.add_message(other, "user", "second chat", [])
    w.navigation.refresh_chat_list()
    w.navigation.open_chat(other)
    qtbot.wait(20)
    assert sizes(w) == {base + 4}
    w.view.widgets[0]._start_edit()
    assert w.view.widgets[0].editor.font().pointSize() == base + 4

    close_window(w)
    w, store = open_window(qtbot, tmp_path / "data")  # the zoom is remembered
    qtbot.wait(20)
    assert w.view.widgets and sizes(w) == {base + 4}
    w.appearance.zoom(0)  # back to the system size
    assert sizes(w) == {base}
    close_window(w)


def test_theme_switch_in_the_app_is_kept(qtbot, tmp_path):
    app = QApplication.instance()
    old = app.palette()
    data = tmp_path / "data"
    window = make_window(qtbot, data, load=False)
    try:
        start_dark = window.appearance.dark
        window.theme_actions["light" if start_dark else "dark"].trigger()
        qtbot.waitUntil(lambda: window.appearance.dark != start_dark, timeout=5000)
        assert window.theme_actions["light" if start_dark else "dark"].isChecked()
        assert not window.theme_actions["system"].isChecked()
    finally:
        close_window(window)
        app.setPalette(old)
    window = make_window(qtbot, data, load=False)  # restarted: the choice holds
    try:
        qtbot.waitUntil(lambda: window.appearance.dark != start_dark, timeout=5000)
        window.theme_actions["system"].trigger()
    finally:
        close_window(window)
        app.setPalette(old)
        app.setProperty("tramontane-theme", None)
