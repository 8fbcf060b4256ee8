"""app/window.py: what the window composes (the chat list's menu and its Del key) and its
one-instance server (a second launch raises it; a crashed run's socket does not block it)."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from support.app_window import close_window, make_window, send  # noqa: E402
from tramontane.app import main as app_main  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def test_the_chat_list_menu_has_no_unlabelled_entry_and_del_still_deletes(qtbot, window, monkeypatch):
    send(qtbot, window, "Hi")
    assert [a.text() for a in window.chat_list.actions() if not a.text()] == []
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    chat = window.session.current_chat_id
    window.chat_list.setFocus()
    qtbot.keyClick(window.chat_list, Qt.Key.Key_Delete)
    assert window.chat_model.row_of(chat) < 0


def test_a_second_launch_brings_the_running_window_to_the_front(qtbot, tmp_path, monkeypatch):
    data = tmp_path / "data"
    window = make_window(qtbot, data, load=False)
    try:
        errors = []
        monkeypatch.setattr(QMessageBox, "critical", lambda *a, **k: errors.append(a))
        window.showMinimized()
        qtbot.waitUntil(window.isMinimized, timeout=5000)
        args = app_main.parse_args(["--data-dir", str(data)])
        assert app_main.run_app(args, ["tramontane"]) == 0
        assert errors == []
        qtbot.waitUntil(lambda: not window.isMinimized() and window.isVisible(), timeout=5000)
    finally:
        close_window(window)


def test_a_leftover_socket_of_a_crashed_run_does_not_block_the_next(qtbot, tmp_path):
    from PySide6.QtNetwork import QLocalServer

    from tramontane.app.single_instance import ask_running_instance, server_name

    data = tmp_path / "data"
    data.mkdir()
    assert not ask_running_instance(data)  # nobody runs there
    stale = QLocalServer()
    assert stale.listen(server_name(data))
    socket_path = stale.fullServerName()
    stale.close()
    if socket_path and not shutil.os.path.exists(socket_path):
        open(socket_path, "w").close()  # what a killed process leaves behind
    window = make_window(qtbot, data, load=False)  # its InstanceServer takes the name over
    try:
        assert window.instance_server.listening
        with qtbot.waitSignal(window.instance_server.raiseRequested, timeout=5000):
            assert ask_running_instance(data)
    finally:
        close_window(window)
