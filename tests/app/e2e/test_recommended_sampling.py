"""The sampling Mistral recommends for a catalogue model (issue 36 item 1: the catalogue's
temperature / top_p, from the model's card), on the real window with the tiny model filed as a
downloaded Magistral Small 1.2 (temperature 0.7, top_p 0.95): a reply samples with it while Settings
leaves those knobs at their defaults, as LM Studio applies a model's preset; a value the user set in
Settings, or the chat's own, wins; Settings and Chat settings say which values are the model's
recommended. A file the catalogue does not know, and a server, get the app's own defaults."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from tramontane.app.config import Sampling  # noqa: E402
from tramontane.app.dialogs.chat_settings import ChatSettingsDialog  # noqa: E402
from tramontane.app.dialogs.settings import SettingsDialog  # noqa: E402
from tramontane.app.engine_info import EngineInfo  # noqa: E402
from tramontane.engine.library.catalog import Sampling as CardSampling  # noqa: E402

from support.app_window import MODEL, close_window, load_and_wait, make_window, send  # noqa: E402
from support.thinking import as_magistral_download  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

SHOTS = os.environ.get("TRAMONTANE_SHOTS")  # a folder: the dialogs' screenshots are saved there


def test_the_models_values_fill_only_the_knobs_left_at_their_defaults():
    card = CardSampling(temperature=0.7, top_p=0.95)
    assert Sampling().with_recommended(card) == Sampling(temperature=0.7, top_p=0.95)
    assert Sampling(temperature=0.3).with_recommended(card) == Sampling(temperature=0.3, top_p=0.95)
    assert Sampling(top_p=0.5).recommended_values(card) == {"temperature": 0.7}
    # Ministral 3 Reasoning's card names a temperature only: top_p stays the app's
    assert Sampling().with_recommended(CardSampling(temperature=0.7)) == Sampling(temperature=0.7)
    assert Sampling().with_recommended(None) == Sampling()


@pytest.fixture
def magistral(tmp_path):
    path = as_magistral_download(MODEL, tmp_path)
    return path


def record_params(window) -> list:
    """The SamplingParams each reply is generated with."""
    engine, seen = window.worker.engine, []
    generate_from = engine.generate_from

    def recording(prompt, params, *args, **kwargs):
        seen.append(params)
        return generate_from(prompt, params, *args, **kwargs)

    engine.generate_from = recording
    return seen


def save(widget, name: str) -> None:
    if SHOTS:
        widget.grab().save(os.path.join(SHOTS, name))


def chat_settings(window, fill=None):
    """Chat ▸ Chat settings…: (the "Use the defaults" box's text, the temperature and top-p shown),
    `fill(dialog)` before OK."""
    got = []

    def answer():
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, ChatSettingsDialog)
        save(dialog, "chat-settings-recommended.png")
        got.append((dialog.use_defaults.text(), dialog.temperature.value(), dialog.top_p.value()))
        if fill is not None:
            fill(dialog)
        dialog.accept()

    QTimer.singleShot(0, answer)
    window.chat_settings_action.trigger()
    return got[0]


def settings_note(window, monkeypatch, fill=None) -> str | None:
    """Settings…: the note under Top-p (None where hidden), `fill(dialog)` before OK."""
    got = []

    def user_sets(dialog) -> int:
        save(dialog, "settings-recommended.png")
        got.append(dialog.recommended.text() if not dialog.recommended.isHidden() else None)
        if fill is not None:
            fill(dialog)
        dialog.accept()
        return 1

    monkeypatch.setattr(SettingsDialog, "exec", user_sets)
    window.dialogs.open_settings()
    return got[0]


def test_a_catalogue_model_replies_with_its_recommended_sampling(qtbot, tmp_path, magistral, monkeypatch):
    window = make_window(qtbot, tmp_path / "data", load=False)
    load_and_wait(qtbot, window, magistral)
    window.session.param_overrides = {"max_tokens": 2, "ignore_eos": True}  # not the test windows' greedy
    params = record_params(window)

    send(qtbot, window, "hello")
    assert (params[-1].temperature, params[-1].top_p) == (0.7, 0.95)
    words, temperature, top_p = chat_settings(window)
    assert "temperature 0.7 and top-p 0.95: the model's recommended" in words and (temperature, top_p) == (0.7, 0.95)
    note = settings_note(window, monkeypatch, fill=lambda d: d.temperature.setValue(0.3))
    assert note.startswith("In use: temperature 0.7 and top-p 0.95, the model's recommended (Magistral Small 1.2")
    assert window.settings.sampling.temperature == 0.3  # what the user set: stored as set, not the model's

    send(qtbot, window, "again")  # the user's temperature wins; top-p is still left at its default
    assert (params[-1].temperature, params[-1].top_p) == (0.3, 0.95)
    assert settings_note(window, monkeypatch).startswith("In use: top-p 0.95, the model's recommended")

    chat_settings(window, fill=lambda d: (d.use_defaults.setChecked(False), d.top_p.setValue(0.5)))
    send(qtbot, window, "and the chat's own")  # the chat's own values win over both
    assert (params[-1].temperature, params[-1].top_p) == (0.3, 0.5)

    settings_note(window, monkeypatch, fill=lambda d: (d.temperature.setValue(0.15), d.top_p.setValue(0.8)))
    assert settings_note(window, monkeypatch).startswith("In use: temperature 0.7, the model's recommended")
    window.settings.sampling = Sampling(top_p=0.8, temperature=0.2)
    assert settings_note(window, monkeypatch).startswith(
        "The model's recommended: temperature 0.7 and top-p 0.95 (Magistral Small 1.2")
    close_window(window)


def test_a_file_the_catalogue_does_not_know_and_a_server_get_the_apps_defaults(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path / "data", load=False)
    load_and_wait(qtbot, window, MODEL)  # mistral3_tiny-f32.gguf: no catalogue entry
    assert window.session.default_sampling() == window.settings.sampling == Sampling()
    assert settings_note(window, monkeypatch) is None
    assert chat_settings(window)[0] == "Use the defaults (Settings)"
    # a server's model, even one named as a catalogue file, is the server's to sample
    window.session.engine_info = EngineInfo("magistral on a server", False, device="remote", remote=True,
                                            model_path="/m/unsloth__Magistral-Small-2509-GGUF/x.gguf")
    assert window.session.model_sampling() is None and window.session.default_sampling() == Sampling()
    close_window(window)
