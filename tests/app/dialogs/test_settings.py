"""Found by using the Settings dialog: Top-p could be set to 0.00, which the engine refuses
("top_p must be in (0, 1]"), so every message failed until the user found the cause. Every
value the dialog lets the user pick must be one the engine accepts."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from tramontane.app.config import Sampling  # noqa: E402
from tramontane.app.dialogs.settings import SettingsDialog  # noqa: E402
from tramontane.engine.runtime.generate import check_params  # noqa: E402


@pytest.mark.parametrize("end", ["minimum", "maximum"])
def test_every_sampling_value_the_dialog_allows_is_accepted_by_the_engine(qtbot, settings, end):
    dialog = SettingsDialog(settings)
    qtbot.addWidget(dialog)
    for box in (dialog.temperature, dialog.top_p, dialog.top_k, dialog.repetition_penalty,
                dialog.max_tokens):
        box.setValue(getattr(box, end)())
    dialog.accept()
    params = settings.sampling.params()
    assert params.top_p == dialog.top_p.value()
    check_params(params)  # raises EngineError for a value the engine refuses


def test_speculation_is_off_by_default_and_prompt_lookup_reaches_the_reply(qtbot, settings):
    """Settings ▸ Speculative decoding (issue 38): each choice is one the engine takes; a stored
    value the app does not know is off."""
    assert settings.sampling.speculation == "off"
    dialog = SettingsDialog(settings)
    qtbot.addWidget(dialog)
    assert [dialog.speculation.itemData(i) for i in range(dialog.speculation.count())] == ["off", "ngram", "draft"]
    dialog.speculation.setCurrentIndex(dialog.speculation.findData("ngram"))
    dialog.accept()
    params = settings.sampling.params()
    assert params.speculation == "ngram"
    check_params(params)
    again = SettingsDialog(settings)
    qtbot.addWidget(again)
    assert again.speculation.currentData() == "ngram"
    assert Sampling.from_dict({"speculation": "draft-model"}).speculation == "off"


def test_a_stored_zero_top_p_falls_back_to_the_default():
    assert Sampling.from_dict({"top_p": 0.0}).top_p == Sampling().top_p
    check_params(Sampling.from_dict({"top_p": 0.0, "temperature": 0.0}).params())


def test_gpu_layers_is_auto_by_default_and_kept_as_set(qtbot, settings):
    assert settings.gpu_layers is None
    dialog = SettingsDialog(settings)
    qtbot.addWidget(dialog)
    assert dialog.gpu_layers.text() == "auto" and dialog.gpu_layers.isEnabled()
    dialog.gpu_layers.setValue(20)
    dialog.accept()
    assert settings.gpu_layers == 20
    again = SettingsDialog(settings)
    qtbot.addWidget(again)
    assert again.gpu_layers.value() == 20
    again.gpu_layers.setValue(again.gpu_layers.minimum())  # back to auto
    again.device.setCurrentText("cpu")
    assert not again.gpu_layers.isEnabled()  # a CPU-only load has no GPU layers
    again.accept()
    assert settings.gpu_layers is None and settings.device == "cpu"


@pytest.mark.parametrize("stored", ["12", True, -5, 2.5, None])
def test_a_bad_stored_gpu_layers_is_auto(settings, stored):
    settings.store.set_setting("app.gpu_layers", stored)
    assert settings.gpu_layers is None


def test_loaded_models_are_remembered_newest_first(settings):
    for i in range(12):
        settings.last_model = (f"/models/m{i}.gguf", "")
    settings.last_model = ("/models/m5.gguf", "/models/mmproj.gguf")
    recent = settings.recent_models
    assert recent[:3] == ["/models/m5.gguf", "/models/m11.gguf", "/models/m10.gguf"]
    assert len(recent) == 10 and len(set(recent)) == 10
    settings.store.set_setting("app.recent_models", ["/a.gguf", 3, "", None])
    assert settings.recent_models == ["/a.gguf"]


def test_models_dialog_choices_round_trip(settings):
    assert (settings.models_tab, settings.import_copy) == (0, False)
    settings.models_tab, settings.import_copy = 2, True
    assert (settings.models_tab, settings.import_copy) == (2, True)
    settings.store.set_setting("app.models_tab", "two")
    settings.store.set_setting("app.import_copy", "yes")
    assert (settings.models_tab, settings.import_copy) == (0, False)


def test_cpu_threads_is_auto_by_default_and_reaches_the_cpu_kernels(qtbot, settings, monkeypatch):
    from tramontane.app.window import MainWindow
    from tramontane.kernels import cpu_native

    assert settings.cpu_threads is None
    before = cpu_native.threads()
    window = MainWindow(settings.store, autoload=False)
    qtbot.addWidget(window)
    chosen = []

    def user_sets(dialog) -> int:  # what a user does in the dialog, then OK
        assert dialog.cpu_threads.text() == ("auto" if not chosen else str(chosen[-1]))
        chosen.append(1 if not chosen else 0)
        dialog.cpu_threads.setValue(chosen[-1])
        dialog.accept()
        return 1

    monkeypatch.setattr(SettingsDialog, "exec", user_sets)
    try:
        window.dialogs.open_settings()
        assert window.settings.cpu_threads == 1
        assert cpu_native.threads() == 1 or not cpu_native.AVAILABLE
        window.dialogs.open_settings()  # back to auto: one thread per physical core
        assert window.settings.cpu_threads is None
        assert cpu_native.threads() == cpu_native.default_threads() or not cpu_native.AVAILABLE
    finally:
        window.close()
        cpu_native.set_threads(before)
