"""What a user hit when trying the window again (issue 26): each test drives the real window
on the tiny model the way the report did."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QFileDialog  # noqa: E402

from support.app_window import MMPROJ, MODEL, send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def open_file(window, monkeypatch, path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), GGUF))
    window.open_model_file()


GGUF = "GGUF models (*.gguf)"


def test_opening_a_wrong_file_keeps_the_loaded_model(qtbot, window, monkeypatch, tmp_path):
    """Item 2: a text file or a projector picked in Open… is refused in words before anything
    is unloaded; the model that was working still answers."""
    text_file = tmp_path / "notes.gguf"
    text_file.write_text("this is not a model")
    for path, words in ((text_file, "is not a GGUF model file"), (MMPROJ, "is a vision projector")):
        open_file(window, monkeypatch, path)
        qtbot.wait(200)  # a load or unload would have reached the worker by now
        assert window.engine_info is not None and window.loading is None
        assert window.engine_info.model_path == str(MODEL)
        message = window.composer.message.text()
        assert words in message and f"{MODEL.name} stays loaded" in message, message
        assert "magic" not in message and "--mmproj" not in message
        assert MODEL.name in window.model_bar.model_label.text()
    assert window.store.get_message(send(qtbot, window, "still there?")).state == "complete"
