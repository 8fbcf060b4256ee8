"""The window's API server offers the three API families (OpenAI's, Anthropic's, Ollama's): Settings
lets the user choose them and Ollama's port, and shows the URL each family's clients take; the
real window serves only the chosen ones, on the chosen ports, and its status line says where."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

pytest.importorskip("pytestqt")
openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")
ollama = pytest.importorskip("ollama", reason="the official client is the reference (test extra)")

from PySide6.QtWidgets import QLabel  # noqa: E402

from tramontane.app.config import AppSettings  # noqa: E402
from tramontane.app.dialogs.settings import SettingsDialog  # noqa: E402
from tramontane.app.store import Store  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_settings_choose_the_api_families_and_show_their_urls(qtbot, settings):
    assert settings.serve_apis == ("openai", "anthropic", "ollama") and settings.serve_ollama_port == 0
    dialog = SettingsDialog(settings)
    qtbot.addWidget(dialog)
    assert all(box.isChecked() for box in dialog.serve_apis.values())
    dialog.serve_port.setValue(8123)
    assert dialog.serve_urls.text().splitlines() == [
        "OpenAI clients: http://127.0.0.1:8123/v1", "Anthropic clients: http://127.0.0.1:8123",
        "Ollama clients: http://127.0.0.1:8123"]
    dialog.serve_apis["anthropic"].setChecked(False)
    dialog.serve_ollama_port.setValue(11434)
    assert dialog.serve_urls.text().splitlines() == [
        "OpenAI clients: http://127.0.0.1:8123/v1", "Ollama clients: http://127.0.0.1:11434"]
    dialog.serve.setChecked(True)
    dialog.accept()
    assert settings.serve_apis == ("openai", "ollama") and settings.serve_ollama_port == 11434

    again = SettingsDialog(settings)
    qtbot.addWidget(again)
    assert not again.serve_apis["anthropic"].isChecked() and again.serve_ollama_port.value() == 11434
    for box in again.serve_apis.values():
        box.setChecked(False)
    assert again.serve_urls.text() == "Choose at least one API."
    again.accept()  # serving nothing is refused in words, nothing saved
    assert "at least one API" in again.error.text() and settings.serve_apis == ("openai", "ollama")
    settings.store.set_setting("app.serve_apis", ["gopher"])  # a hand-edited database: every family
    assert settings.serve_apis == ("openai", "anthropic", "ollama")


def test_the_window_serves_only_the_chosen_families_on_their_ports(qtbot, tmp_path):
    from support.app_window import close_window, make_window

    port, ollama_port = free_port(), free_port()
    store = Store(tmp_path / "data")
    settings = AppSettings(store)
    settings.serve, settings.serve_port = True, port
    settings.serve_apis, settings.serve_ollama_port = ("openai", "ollama"), ollama_port
    store.close()
    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    try:
        label = window.statusBar().findChild(QLabel, "apiServerStatus")
        qtbot.waitUntil(lambda: label.text().startswith(
            f"Serving mistral3_tiny-f32 at http://127.0.0.1:{port}/v1 · Ollama http://127.0.0.1:{ollama_port}"),
            timeout=5000)
        assert "Anthropic" not in label.text()
        assert [m.id for m in openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                                            max_retries=0, timeout=30).models.list()][0] == "mistral3_tiny-f32"
        tags = ollama.Client(host=f"http://127.0.0.1:{ollama_port}", timeout=30).list()
        assert [m.model for m in tags.models][0].startswith("mistral3_tiny-f32")
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/messages", method="POST",
                                         data=json.dumps({"model": "m", "max_tokens": 2, "messages": []}).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        assert info.value.code == 404
        assert "Anthropic's API is not served here" in json.loads(info.value.read())["error"]["message"]
    finally:
        close_window(window)
