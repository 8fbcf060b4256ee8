"""Per-chat sampling settings (issue 35: "sampling settings per chat; today they are global"),
on the real window offscreen with the tiny model: set through Chat ▸ Chat settings, used by
the chat's replies (max tokens is counted in the saved reply, the rest read from the request
the worker got), kept over a restart, by Branch and by export/import; a chat without its own
values follows Settings, and "Use the defaults" gives them back."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from tramontane.app.config import Sampling  # noqa: E402
from tramontane.app.dialogs.chat_settings import ChatSettingsDialog  # noqa: E402
from tramontane.app.store import export  # noqa: E402
from support.app_window import close_window, make_window, send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

APP_DEFAULTS = Sampling(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0, max_tokens=9, seed=None)
CHAT_OWN = {"temperature": 0.7, "top_p": 0.85, "max_tokens": 5, "seed": 1234}


def prepare(window) -> list:
    """Settings' sampling is APP_DEFAULTS and nothing overrides it (the harness's greedy
    overrides would hide the chat's values); the params of every request, as the worker got them."""
    window.settings.sampling = APP_DEFAULTS
    window.session.param_overrides = {"ignore_eos": True}  # every reply runs to its max tokens
    seen = []
    chat = window.worker.chat

    def recording(request):
        seen.append(request.params)
        return chat(request)

    window.worker.chat = recording
    return seen


def through_menu(window, fill) -> None:
    """Chat ▸ Chat settings…, `fill(dialog)` then OK, as the user does."""
    done = []

    def answer():
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, ChatSettingsDialog)
        fill(dialog)
        dialog.accept()
        done.append(dialog.result())

    QTimer.singleShot(0, answer)
    window.chat_settings_action.trigger()
    assert done == [1]


def own_values(dialog) -> None:
    dialog.use_defaults.setChecked(False)
    dialog.temperature.setValue(CHAT_OWN["temperature"])
    dialog.top_p.setValue(CHAT_OWN["top_p"])
    dialog.max_tokens.setValue(CHAT_OWN["max_tokens"])
    dialog.seed.setText(str(CHAT_OWN["seed"]))


def used(params) -> dict:
    return {name: getattr(params, name) for name in CHAT_OWN}


def test_chat_settings_are_used_kept_branched_exported_and_reset(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data")
    seen = prepare(window)
    first = send(qtbot, window, "hello")
    plain_chat = window.session.current_chat_id
    assert window.store.get_message(first).generated_tokens == 9  # Settings' max tokens
    assert used(seen[-1]) == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 9, "seed": None}

    window.navigation.new_chat()
    send(qtbot, window, "first")
    chat_id = window.session.current_chat_id
    assert chat_id != plain_chat
    through_menu(window, own_values)
    reply = send(qtbot, window, "second")
    assert window.store.get_message(reply).generated_tokens == 5
    assert used(seen[-1]) == CHAT_OWN
    assert seen[-1].top_k == 0 and seen[-1].repetition_penalty == 1.0  # the rest stays Settings'

    window.navigation.open_chat(plain_chat)  # the other chat still follows Settings
    window.replies.regenerate(None)
    qtbot.waitUntil(lambda: window.session.pending is None, timeout=30000)
    assert used(seen[-1])["max_tokens"] == 9
    close_window(window)

    window = make_window(qtbot, tmp_path / "data")  # a restart: the chat keeps its values
    seen = prepare(window)
    assert window.session.chat_sampling(chat_id) == CHAT_OWN
    branch = window.store.branch_chat(chat_id)
    assert window.session.chat_sampling(branch) == CHAT_OWN
    path = export.export_json(window.store, chat_id, tmp_path / "chat.json")
    imported = export.import_json(window.store, path)
    assert window.session.chat_sampling(imported) == CHAT_OWN

    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    seen_in_dialog = []
    through_menu(window, lambda d: seen_in_dialog.append(
        (d.use_defaults.isChecked(), d.max_tokens.value(), d.seed.text())))
    assert seen_in_dialog == [(False, 5, "1234")]  # the dialog shows the chat's own values
    through_menu(window, lambda d: d.use_defaults.setChecked(True))  # "Use the defaults"
    assert window.session.chat_sampling(chat_id) is None
    assert window.session.chat_sampling(branch) == CHAT_OWN  # the branch keeps its own
    send(qtbot, window, "third")
    assert used(seen[-1]) == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 9, "seed": None}
    close_window(window)


def test_values_chosen_for_the_new_chat_are_saved_with_it(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data")
    seen = prepare(window)
    through_menu(window, own_values)  # no chat yet
    reply = send(qtbot, window, "hello")
    chat_id = window.session.current_chat_id
    assert used(seen[-1]) == CHAT_OWN and window.store.get_message(reply).generated_tokens == 5
    assert window.store.get_chat_info(chat_id).settings["sampling"] == CHAT_OWN
    window.navigation.new_chat()  # the next new chat starts from Settings again
    send(qtbot, window, "again")
    assert used(seen[-1])["max_tokens"] == 9
    close_window(window)


def test_a_stored_value_out_of_range_falls_back_to_settings(qtbot, tmp_path):
    """A hand-edited database: each bad value is Settings' one, the good ones stay."""
    window = make_window(qtbot, tmp_path / "data", load=False)
    prepare(window)
    chat_id = window.store.create_chat("Edited")
    window.store.update_chat_settings(chat_id, sampling={"temperature": 9.0, "top_p": 0.0, "max_tokens": 3,
                                                         "seed": -4})
    sampling = window.session.sampling_for(chat_id)
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed) == (0.0, 1.0, 3, None)
    close_window(window)


def test_a_seed_that_is_not_a_number_is_refused_with_a_sentence(qtbot):
    dialog = ChatSettingsDialog(None, APP_DEFAULTS)
    qtbot.addWidget(dialog)
    assert dialog.use_defaults.isChecked() and not dialog.seed.isEnabled()
    assert dialog.max_tokens.value() == 9  # the defaults shown
    dialog.use_defaults.setChecked(False)
    dialog.seed.setText("12ab")
    dialog.accept()
    assert dialog.result() == 0 and "Seed '12ab'" in dialog.error.text()
    dialog.seed.setText("")
    dialog.accept()
    assert dialog.result() == 1 and dialog.values()["seed"] is None
