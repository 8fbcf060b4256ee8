"""Found by using View → Zoom: only the chat list grew. The window's style sheet stops Qt's
font inheritance at every styled widget (the conversation, each message, the message box), so
the messages and the text being typed kept the system size, now and after reopening."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication  # noqa: E402

from tramontane.app.store import Store  # noqa: E402
from tramontane.app.window import MainWindow  # noqa: E402


def open_window(qtbot, data_dir):
    store = Store(data_dir)
    w = MainWindow(store, autoload=False)
    qtbot.addWidget(w)
    w.show()
    return w, store


def sizes(window) -> set[int]:
    out = {window.composer.edit.font().pointSize()}
    for mw in window.view.widgets:
        out.add(mw.body.font().pointSize())
        out.add(mw.body.document().defaultFont().pointSize())
    return out


def test_zoom_reaches_messages_and_the_message_box(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAMONTANE_MODELS_DIR", str(tmp_path / "models"))
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

    w.close()
    store.close()
    w, store = open_window(qtbot, tmp_path / "data")  # the zoom is remembered
    qtbot.wait(20)
    assert w.view.widgets and sizes(w) == {base + 4}
    w.appearance.zoom(0)  # back to the system size
    assert sizes(w) == {base}
    w.close()
    store.close()
