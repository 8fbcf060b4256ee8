"""Found by using the Settings dialog: Top-p could be set to 0.00, which the engine refuses
("top_p must be in (0, 1]"), so every message failed until the user found the cause. Every
value the dialog lets the user pick must be one the engine accepts."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from tramontane.app.dialogs.settings import AppSettings, Sampling, SettingsDialog  # noqa: E402
from tramontane.app.store import Store  # noqa: E402
from tramontane.engine.runtime.generate import check_params  # noqa: E402


@pytest.fixture
def settings(tmp_path):
    store = Store(tmp_path / "data")
    yield AppSettings(store)
    store.close()


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


def test_a_stored_zero_top_p_falls_back_to_the_default():
    assert Sampling.from_dict({"top_p": 0.0}).top_p == Sampling().top_p
    check_params(Sampling.from_dict({"top_p": 0.0, "temperature": 0.0}).params())
