"""app/model_loading.py through the real window: a picked file is checked off the UI thread and
refused in words with the loaded model kept; a load clears what was said of the missing model."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QFileDialog  # noqa: E402

from support.app_window import MMPROJ, MODEL, open_stored_chat, send  # noqa: E402
from tramontane.app import model_files, model_loading  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def open_file(window, monkeypatch, path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), model_loading.GGUF_FILTER))
    window.model_loading.open_model_file()


def test_opening_a_wrong_file_keeps_the_loaded_model(qtbot, window, monkeypatch, tmp_path):
    """A text file or a projector picked in Open… is refused in words before anything
    is unloaded; the model that was working still answers (issue 26, item 2)."""
    text_file = tmp_path / "notes.gguf"
    text_file.write_text("this is not a model")
    read_on = []  # the header is read on a job, not on the UI thread

    def why_not_a_model(path):
        read_on.append(threading.current_thread())
        return model_files.why_not_a_model(path)

    monkeypatch.setattr(model_loading, "why_not_a_model", why_not_a_model)
    for path, words in ((text_file, "is not a GGUF file"), (MMPROJ, "is a vision projector")):
        open_file(window, monkeypatch, path)
        qtbot.waitUntil(lambda: window.model_loading.checking_model is None, timeout=30000)
        qtbot.wait(200)  # a load or unload would have reached the worker by now
        assert window.session.engine_info is not None and window.session.loading is None
        assert window.session.engine_info.model_path == str(MODEL)
        message = window.composer.message.text()
        assert words in message and f"{MODEL.name} stays loaded" in message, message
        assert "magic" not in message and "--mmproj" not in message
        assert MODEL.name in window.model_bar.model_label.text()
    assert window.store.get_message(send(qtbot, window, "still there?")).state == "complete"
    assert len(read_on) == 2 and threading.main_thread() not in read_on


def test_model_hints_go_when_a_model_loads(qtbot, idle_window):
    """After a successful load, what was said about the missing projector goes (issue 26, item 5)."""
    from support.app_window import png_bytes
    from tramontane.engine.api import ImagePart

    window = idle_window
    open_stored_chat(window, "Picture chat", "Look", "A cat.", [ImagePart(png_bytes(8, 8), "cat.png")])
    window.model_loading.load_model(str(MODEL), "")  # text only
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    window.composer.edit.setPlainText("And now?")
    window.composer.send_button.click()
    assert "no vision projector" in window.composer.message.text()
    window.model_loading.load_model(str(MODEL), str(MMPROJ))
    qtbot.waitUntil(lambda: window.session.engine_info is not None and window.session.engine_info.has_vision, timeout=30000)
    assert not window.composer.message.isVisible() and window.composer.message.text() == ""
    assert window.composer.edit.toPlainText() == "And now?"  # kept for the user to send
