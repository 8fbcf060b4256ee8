"""The window's API server switch: Settings row, the server on the engine worker, the status line."""
from __future__ import annotations

import socket
import threading

import pytest

pytest.importorskip("pytestqt")
openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")

from PySide6.QtCore import QObject, Slot  # noqa: E402
from PySide6.QtWidgets import QLabel  # noqa: E402

from tramontane.app.config import AppSettings  # noqa: E402
from tramontane.app.dialogs.settings import SettingsDialog  # noqa: E402
from tramontane.app.serving import WindowServer  # noqa: E402
from tramontane.app.store import Store  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"


def test_the_settings_row_keeps_the_switch_and_the_port(qtbot, settings):
    assert settings.serve is False and settings.serve_port == 8080
    dialog = SettingsDialog(settings)
    qtbot.addWidget(dialog)
    assert not dialog.serve.isChecked() and "localhost" in dialog.serve.text()
    dialog.serve.setChecked(True)
    dialog.serve_port.setValue(8123)
    dialog.accept()
    assert settings.serve is True and settings.serve_port == 8123
    settings.store.set_setting("app.serve_port", 99999)  # a hand-edited database
    assert settings.serve_port == 8080


class Loaded(QObject):
    def __init__(self, worker):
        super().__init__()
        self.count = 0
        worker.loaded.connect(self.on_loaded)
        worker.unloaded.connect(self.on_loaded)

    @Slot()
    @Slot(object)
    def on_loaded(self, _info=None):
        self.count += 1


@pytest.fixture
def worker(worker):  # tests/app/conftest.py's, watched
    worker.watch = Loaded(worker)
    return worker


def test_the_switch_serves_the_windows_model_and_says_so(qtbot, worker):
    serving = WindowServer(worker)
    serving.apply(True, 0)
    try:
        assert serving.running and "no local model loaded" in serving.status
        client = openai.OpenAI(base_url=serving.server.url, api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.InternalServerError) as info:  # nothing loaded yet: 503
            client.models.list()
        assert info.value.status_code == 503 and info.value.body["code"] == "model_not_loaded"

        worker.load(MODEL, None, "cpu")
        qtbot.waitUntil(lambda: worker.watch.count == 1, timeout=60000)
        qtbot.waitUntil(lambda: "mistral3_tiny-f32" in serving.status, timeout=5000)
        done = threading.Event()
        threading.Thread(target=lambda: (client.chat.completions.create(
            model="mistral3_tiny-f32", messages=[{"role": "user", "content": "hi"}], max_tokens=2), done.set())).start()
        qtbot.waitUntil(done.is_set, timeout=60000)
        qtbot.waitUntil(lambda: serving.status.endswith("· 1 reply"), timeout=5000)
        assert serving.status.startswith("Serving mistral3_tiny-f32 at http://127.0.0.1:")

        worker.unload()
        qtbot.waitUntil(lambda: worker.watch.count == 2, timeout=30000)
        with pytest.raises(openai.InternalServerError):
            client.models.list()
    finally:
        serving.stop()
    assert serving.status == "" and not serving.running


def test_a_taken_port_is_said_in_the_status_line_and_the_app_goes_on(qtbot, worker):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serving = WindowServer(worker)
        with qtbot.waitSignal(serving.changed, timeout=5000):
            serving.apply(True, port)
        assert not serving.running
        assert serving.status.startswith(f"API server off: cannot serve on 127.0.0.1:{port}")
    serving.apply(False, port)
    assert serving.status == ""


def test_the_window_turns_the_server_on_from_settings_and_off_when_it_closes(qtbot, tmp_path):
    from support.app_window import close_window, make_window, send

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = Store(tmp_path / "data")
    AppSettings(store).serve, AppSettings(store).serve_port = True, port
    store.close()
    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    try:
        label = window.statusBar().findChild(QLabel, "apiServerStatus")
        qtbot.waitUntil(lambda: label.text().startswith(f"Serving mistral3_tiny-f32 at http://127.0.0.1:{port}/v1"),
                        timeout=5000)
        send(qtbot, window, "hello from the window")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        done = threading.Event()
        threading.Thread(target=lambda: (client.chat.completions.create(
            model="mistral3_tiny-f32", messages=[{"role": "user", "content": "hi"}], max_tokens=2), done.set())).start()
        qtbot.waitUntil(done.is_set, timeout=60000)
        qtbot.waitUntil(lambda: label.text().endswith("· 1 reply"), timeout=5000)
    finally:
        close_window(window)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
