"""States that used to go stale or lie (issue 18's nine fixes), each through the real window on
the tiny fixture model."""
from __future__ import annotations

import re
import shutil
import time

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QInputDialog, QLabel  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.app_window import (MMPROJ, MODEL, close_window, load_and_wait, make_window, png_bytes,  # noqa: E402
                                send, wait_for_load)
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


# Folders and an idle window --------------------------------------------------------------------
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
