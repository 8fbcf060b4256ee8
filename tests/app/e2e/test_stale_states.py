"""States that used to go stale or lie (issue 18's nine fixes), each through the real window on
the tiny fixture model."""
from __future__ import annotations

import re
import shutil
import time

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QInputDialog, QLabel, QMessageBox  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.app_window import (MMPROJ, MODEL, close_window, load_and_wait, make_window, png_bytes,  # noqa: E402
                                send, wait_for_load)
from tramontane.app import main as app_main  # noqa: E402
from tramontane.app.chat_session import LOAD_FIRST_HINT  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

OTHER_MODEL = FIXTURES / "mistral3_q256-Q4_K_M.gguf"  # hidden size 256: the tiny projector is foreign


def shown(label) -> str:
    """What an ElidedLabel shows on screen (its text() is the whole text)."""
    return QLabel.text(label)


def context_count(status: str) -> int:
    return int(re.search(r"context (\d+)", status).group(1))


# 1 -------------------------------------------------------------------------------------------
def test_a_failed_load_leaves_no_stale_header(qtbot, window, tmp_path):
    assert window.model_bar.projector_label.text() and window.model_bar.device_label.text()
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00 truncated")
    load_and_wait(qtbot, window, bad)  # refused before anything is unloaded (issue 26, item 2)
    assert window.session.engine_info is not None and "broken.gguf" in window.composer.message.text()
    load_and_wait(qtbot, window, OTHER_MODEL, MMPROJ)  # a load that fails on the worker
    bar = window.model_bar
    assert window.session.engine_info is None
    assert "projector" in bar.model_label.text()
    assert bar.projector_label.text() == "" and bar.device_label.text() == ""
    assert not bar.unload_button.isEnabled() and not window.unload_action.isEnabled()
    window.composer.edit.setPlainText("hello?")
    window.composer.submit()
    assert window.composer.message.text() == LOAD_FIRST_HINT


# 2 -------------------------------------------------------------------------------------------
def test_a_load_error_in_the_chat_goes_once_a_model_loads(qtbot, window):
    send(qtbot, window, "Hi")
    load_and_wait(qtbot, window, OTHER_MODEL, MMPROJ)  # a projector of another model: refused
    assert window.session.engine_info is None
    assert window.view.notice.isVisible() and "projector" in window.view.notice.text()
    load_and_wait(qtbot, window, MODEL, MMPROJ)
    assert window.session.engine_info is not None
    assert not window.view.notice.isVisible() and window.session.notices == {}


def test_the_composer_hint_does_not_outlive_a_chat_action(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    try:
        image = tmp_path / "photo.png"
        image.write_bytes(png_bytes(16, 16))
        first = (send(qtbot, window, "Hi"), window.session.current_chat_id)[1]
        window.navigation.new_chat()
        send(qtbot, window, "Hello")

        def hint_shown() -> bool:
            window.composer.add_files([str(image)])  # no projector: refused with a hint
            return "projector" in window.composer.message.text()

        monkeypatch.setattr(QInputDialog, "exec", lambda self: (self.setTextValue("Renamed"), 1)[1])
        actions = {
            "switch chat": lambda: window.navigation.open_chat(first),
            "new chat": window.navigation.new_chat,
            "rename": window.chats.rename_selected,
            "branch": window.chats.branch_selected,
            "export": lambda: window.chats.export_chat(window.session.current_chat_id, tmp_path / "chat.json"),
        }
        for what, act in actions.items():
            if window.session.current_chat_id is None:
                window.navigation.open_chat(first)
            assert hint_shown(), what
            act()
            assert window.composer.message.text() == "", what
    finally:
        close_window(window)


# 3 -------------------------------------------------------------------------------------------
def test_the_chat_list_menu_has_no_unlabelled_entry_and_del_still_deletes(qtbot, window, monkeypatch):
    send(qtbot, window, "Hi")
    assert [a.text() for a in window.chat_list.actions() if not a.text()] == []
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    chat = window.session.current_chat_id
    window.chat_list.setFocus()
    qtbot.keyClick(window.chat_list, Qt.Key.Key_Delete)
    assert window.chat_model.row_of(chat) < 0


# 4 -------------------------------------------------------------------------------------------
def test_the_device_line_is_whole_at_the_default_width(qtbot, window):
    window.resize(1100, 760)
    qtbot.wait(50)
    label = window.model_bar.device_label
    assert "cpu" in label.text() and "context 512" in label.text()
    assert shown(label) == label.text(), "the device line is cut at 1100 px"
    assert label.text() in label.toolTip()


# 5 and 6 -------------------------------------------------------------------------------------
def test_context_count_and_context_full_are_the_same_live_and_reopened(qtbot, tmp_path):
    data = tmp_path / "data"
    window = make_window(qtbot, data, load=False)
    try:
        window.settings.context_length = 48
        load_and_wait(qtbot, window, MODEL, MMPROJ)
        window.session.param_overrides = dict(window.session.param_overrides, max_tokens=1024)
        send(qtbot, window, "Hi")  # ignore_eos: it writes until the context is full
        live = window.view.widgets[-1].status.text()
        assert "context full" in live and "max tokens" not in live
        assert "/ 48" in live
        window.session.param_overrides = dict(window.session.param_overrides, max_tokens=3)
        window.navigation.new_chat()
        send(qtbot, window, "Hi")
        live_short = window.view.widgets[-1].status.text()
        assert "max tokens reached" in live_short
        chats = [c.id for c in window.store.list_chats()]
    finally:
        close_window(window)
    window = make_window(qtbot, data)  # a restart: no live numbers; the same model and context
    try:
        assert window.session.engine_info.context_size == 48
        reopened = {}
        for chat_id in chats:
            window.navigation.open_chat(chat_id)
            reopened[chat_id] = window.view.widgets[-1].status.text()
        full, short = (reopened[c] for c in sorted(reopened, key=lambda c: "context full" not in reopened[c]))
        assert context_count(full) == context_count(live) and "context full" in full
        assert context_count(short) == context_count(live_short)
    finally:
        close_window(window)


# 7 -------------------------------------------------------------------------------------------
def test_a_context_length_above_the_files_limit_is_said(qtbot, window):
    window.settings.context_length = 4096
    load_and_wait(qtbot, window, MODEL, MMPROJ)
    label = window.model_bar.device_label
    assert window.session.engine_info.context_size == 512
    assert "context 512" in label.text() and "limit" in label.text()
    assert "4096" in label.toolTip() and "512" in label.toolTip()


# 8 -------------------------------------------------------------------------------------------
def test_unload_and_regenerate_are_enabled_only_when_they_can_act(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", load=False)
    try:
        assert not window.unload_action.isEnabled()
        assert not window.regenerate_action.isEnabled()
        load_and_wait(qtbot, window, MODEL, MMPROJ)
        assert window.unload_action.isEnabled()
        assert not window.regenerate_action.isEnabled()  # an empty chat: nothing to regenerate
        send(qtbot, window, "Hi")
        assert window.regenerate_action.isEnabled()
        window.navigation.new_chat()
        assert not window.regenerate_action.isEnabled()
        window.unload_action.trigger()
        qtbot.waitUntil(lambda: window.session.engine_info is None, timeout=30000)
        assert not window.unload_action.isEnabled()
    finally:
        close_window(window)


# 9 -------------------------------------------------------------------------------------------
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


# Help, theme and folders ---------------------------------------------------------------------
def test_help_lists_the_shortcuts_and_about_says_where_things_are(qtbot, window):
    dialog = window.dialogs.show_shortcuts()
    text = dialog.findChild(QLabel).text()
    for keys, what in (("Ctrl+N", "New chat"), ("Ctrl+R", "Regenerate the last reply"), ("F1", "Keyboard shortcuts")):
        assert keys in text and what in text
    dialog.close()
    dialog = window.dialogs.show_about()
    text = dialog.findChild(QLabel).text()
    assert str(window.store.data_dir) in text and MODEL.name in text and "Apache-2.0" in text
    dialog.close()


def test_theme_switch_in_the_app_is_kept(qtbot, tmp_path):
    from PySide6.QtWidgets import QApplication

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


def test_file_dialogs_start_in_the_last_folder(qtbot, window, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    pictures = tmp_path / "pictures"
    pictures.mkdir()
    (pictures / "a.png").write_bytes(png_bytes(8, 8))
    starts = []

    def pick(_parent, _title, start, _filter):
        starts.append(start)
        return [str(pictures / "a.png")], ""

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", pick)
    window.composer.choose_files()
    window.composer.choose_files()
    assert starts[1] == str(pictures)
    assert window.settings.last_folder("images") == str(pictures)
    models = tmp_path / "elsewhere"
    models.mkdir()
    shutil.copy(MODEL, models / MODEL.name)
    opened = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        lambda _p, _t, start, _f: (opened.append(start), (str(models / MODEL.name), ""))[1])
    window.model_loading.open_model_file()
    wait_for_load(qtbot, window)
    window.model_loading.open_model_file()
    wait_for_load(qtbot, window)
    assert opened[1] == str(models)


def test_an_idle_window_uses_no_cpu(qtbot, window):
    """Loaded, with a chat on screen and nothing happening: no timers spinning (~0 % CPU)."""
    send(qtbot, window, "Hello")
    qtbot.wait(1500)  # let the copy feedback, backlog and render timers finish
    start_cpu, start = time.process_time(), time.perf_counter()
    qtbot.wait(3000)
    cpu = (time.process_time() - start_cpu) / (time.perf_counter() - start)
    print(f"idle CPU: {cpu:.2%} of a core")
    assert cpu < 0.03, f"{cpu:.1%} of a core while idle"
