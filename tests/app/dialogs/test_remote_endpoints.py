"""The servers settings page and the per-chat model picker (pytest-qt, offscreen)."""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QLineEdit  # noqa: E402

from tramontane.app.dialogs.remote_endpoints import (  # noqa: E402
    LOCAL_LABEL, EngineChoiceCombo, RemoteEndpointsDialog, RemoteEndpointsWidget)
from tramontane.app.remote_endpoints import (  # noqa: E402
    SETTINGS_KEY, EngineChoice, RemoteEndpointList, engine_for_choice)
from tramontane.engine.api import ChatMessage, SamplingParams  # noqa: E402
from tramontane.engine.remote.client import RemoteEngine  # noqa: E402

from support.fakevllm import FakeVLLM  # noqa: E402

KEY = "sk-gui-55c0ffee-SECRET"


@pytest.fixture
def server():
    with FakeVLLM(api_key=KEY, models=["mistral-small", "ministral-8b"],
                  reply="Hi from the server.") as fake:
        yield fake


def fill(qtbot, edit: QLineEdit, text: str) -> None:
    edit.setFocus()
    edit.selectAll()
    qtbot.keyClicks(edit, text)
    edit.editingFinished.emit()


def test_add_server_and_test_connection(qtbot, server):
    settings: dict = {}
    widget = RemoteEndpointsWidget(settings)
    qtbot.addWidget(widget)
    assert widget.list.count() == 0 and not widget.form_box.isEnabled()

    qtbot.mouseClick(widget.add_button, Qt.MouseButton.LeftButton)
    assert widget.list.count() == 1 and widget.form_box.isEnabled()
    fill(qtbot, widget.name_edit, "GPU box")
    fill(qtbot, widget.url_edit, server.url)
    fill(qtbot, widget.key_edit, KEY)
    assert widget.key_edit.echoMode() == QLineEdit.EchoMode.Password
    assert widget.list.item(0).text() == "GPU box"

    server.models_delay_s = 0.5  # the GUI thread must not wait for the network
    with qtbot.waitSignal(widget.testFinished, timeout=5000) as signal:
        t0 = time.perf_counter()
        qtbot.mouseClick(widget.test_button, Qt.MouseButton.LeftButton)
        assert time.perf_counter() - t0 < 0.3
        assert not widget.test_button.isEnabled()
    ok, message = signal.args
    assert ok, message
    assert "2 model(s): mistral-small, ministral-8b" in widget.status.text()
    assert widget.test_button.isEnabled()
    assert [widget.model_combo.itemText(i) for i in range(widget.model_combo.count())] == [
        "mistral-small", "ministral-8b"]
    assert widget.model_combo.currentText() == "mistral-small"

    saved = settings[SETTINGS_KEY]
    assert saved == [{"name": "GPU box", "base_url": server.url, "api_key": KEY,
                      "default_model": "mistral-small",
                      "models": ["mistral-small", "ministral-8b"]}]
    json.dumps(saved)  # storable in the settings table as JSON
    auth = [r.headers.get("Authorization") for r in server.requests]
    assert auth == [f"Bearer {KEY}"]

    widget.model_combo.setCurrentText("ministral-8b")
    assert settings[SETTINGS_KEY][0]["default_model"] == "ministral-8b"


def test_failed_connection_says_why_without_the_key(qtbot, server):
    settings = {SETTINGS_KEY: [{"name": "box", "base_url": server.url, "api_key": "sk-wrong-55c0ffee"}]}
    widget = RemoteEndpointsWidget(settings)
    qtbot.addWidget(widget)
    assert widget.url_edit.text() == server.url
    with qtbot.waitSignal(widget.testFinished, timeout=5000) as signal:
        widget.test_button.click()
    ok, message = signal.args
    assert not ok and "refused the API key (401" in message
    assert "55c0ffee" not in message and "55c0ffee" not in widget.status.text()
    assert "55c0ffee" not in repr(widget.configs())


def test_bad_url_and_duplicate_name_are_refused(qtbot):
    settings: dict = {}
    widget = RemoteEndpointsWidget(settings)
    qtbot.addWidget(widget)
    widget.add_server("one")
    widget.add_server("two")
    fill(qtbot, widget.name_edit, "one")
    assert "already used" in widget.status.text()
    assert [c.name for c in widget.configs()] == ["one", "two"]

    fill(qtbot, widget.url_edit, "ftp://nowhere")
    assert "expected http" in widget.status.text()
    with qtbot.waitSignal(widget.testFinished, timeout=2000) as signal:
        widget.test_button.click()
    assert signal.args[0] is False

    widget.list.setCurrentRow(0)
    widget.remove_button.click()
    assert [s["name"] for s in settings[SETTINGS_KEY]] == ["two"]


def test_dialog_wraps_the_widget(qtbot):
    dialog = RemoteEndpointsDialog({})
    qtbot.addWidget(dialog)
    dialog.widget.add_server()
    assert dialog.widget.configs()[0].name == "Server 1"


def test_model_combo_fills_and_picks_an_engine(qtbot, server):
    settings = {SETTINGS_KEY: [{"name": "GPU box", "base_url": server.url, "api_key": KEY,
                                "default_model": "mistral-small"}]}
    combo = EngineChoiceCombo(settings)
    qtbot.addWidget(combo)
    # before any refresh: local + the saved default model
    assert [combo.itemText(i) for i in range(combo.count()) if combo.itemText(i)] == [
        LOCAL_LABEL, "mistral-small — GPU box"]
    assert combo.current_choice().is_local

    with qtbot.waitSignal(combo.modelsRefreshed, timeout=5000):
        combo.refresh_models()
    assert combo.choices() == [EngineChoice(), EngineChoice("GPU box", "mistral-small"),
                               EngineChoice("GPU box", "ministral-8b")]

    with qtbot.waitSignal(combo.choiceChanged, timeout=1000) as signal:
        assert combo.set_choice(EngineChoice("GPU box", "ministral-8b"))
    assert signal.args == [EngineChoice("GPU box", "ministral-8b")]

    engine = engine_for_choice(combo.current_choice(), RemoteEndpointList(settings), read_timeout=5)
    assert isinstance(engine, RemoteEngine) and engine.model == "ministral-8b"
    result = engine.chat([ChatMessage.text("user", "hello")], SamplingParams())
    assert result.text == "Hi from the server."
    assert engine_for_choice(EngineChoice(), RemoteEndpointList(settings)) is None

    # the server is removed from the settings: the combo falls back to the local model
    with qtbot.waitSignal(combo.choiceChanged, timeout=1000) as signal:
        settings[SETTINGS_KEY] = []
        combo.reload()
    assert signal.args == [EngineChoice()] and combo.count() == 1


def test_refresh_error_is_kept_per_server(qtbot):
    settings = {SETTINGS_KEY: [{"name": "down", "base_url": "http://127.0.0.1:9/v1",
                                "default_model": "m"}]}
    combo = EngineChoiceCombo(settings)
    qtbot.addWidget(combo)
    with qtbot.waitSignal(combo.modelsRefreshed, timeout=5000):
        combo.refresh_models()
    assert "cannot reach" in combo.errors["down"]
    assert combo.choices() == [EngineChoice(), EngineChoice("down", "m")]
