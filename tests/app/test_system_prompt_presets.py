"""System-prompt presets (issue 35: LM Studio's Presets, Jan's Assistants), through the System
prompt dialog of the real window: save the chat's prompt as a named preset, pick one for
another chat, replace and delete one; the presets live in the app's settings, so they survive a
restart, and a hand-edited list loses only its bad entries."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from tramontane.app.config import AppSettings  # noqa: E402
from tramontane.app.dialogs.system_prompt import SystemPromptDialog  # noqa: E402
from support.app_window import close_window, make_window  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def through_button(window, act, ok=True) -> None:
    """The header's System prompt… button, `act(dialog)`, then OK (or Cancel)."""
    done = []

    def answer():
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, SystemPromptDialog)
        act(dialog)
        dialog.accept() if ok else dialog.reject()
        done.append(True)

    QTimer.singleShot(0, answer)
    window.system_button.click()
    assert done == [True]


def pick(dialog, name: str) -> None:
    index = dialog.presets.findText(name)
    assert index > 0, [dialog.presets.itemText(i) for i in range(dialog.presets.count())]
    dialog.presets.setCurrentIndex(index)
    dialog.presets.activated.emit(index)  # what a click on the item sends


def save_as(dialog, name: str, text: str) -> None:
    dialog.edit.setPlainText(text)
    dialog.name.setText(name)
    dialog.save_button.click()


def open_new_chat(window, title: str) -> int:
    chat_id = window.store.create_chat(title)
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    return chat_id


def test_save_pick_replace_delete_and_keep_over_a_restart(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", load=False)
    first = open_new_chat(window, "First")
    through_button(window, lambda d: (save_as(d, "Pirate", "Answer as a pirate."),
                                      save_as(d, "Terse", "One sentence at most.")))
    assert window.settings.system_prompt_presets == [("Pirate", "Answer as a pirate."),
                                                     ("Terse", "One sentence at most.")]
    assert window.store.get_chat_info(first).system_prompt == "One sentence at most."

    second = open_new_chat(window, "Second")
    through_button(window, lambda d: pick(d, "Pirate"))
    assert window.store.get_chat_info(second).system_prompt == "Answer as a pirate."
    assert window.store.get_chat_info(first).system_prompt == "One sentence at most."  # its own copy

    # Saving under a name that exists replaces that preset in place; Cancel keeps the chat's prompt.
    through_button(window, lambda d: save_as(d, " Pirate ", "Arr, briefly."), ok=False)
    assert window.settings.system_prompt_presets[0] == ("Pirate", "Arr, briefly.")
    assert len(window.settings.system_prompt_presets) == 2
    assert window.store.get_chat_info(second).system_prompt == "Answer as a pirate."
    close_window(window)

    window = make_window(qtbot, tmp_path / "data", load=False)
    assert [n for n, _ in window.settings.system_prompt_presets] == ["Pirate", "Terse"]
    window.navigation.open_chat(second)

    def delete_terse(dialog):
        assert not dialog.delete_button.isEnabled()  # nothing chosen yet
        pick(dialog, "Terse")
        assert dialog.edit.toPlainText() == "One sentence at most." and dialog.delete_button.isEnabled()
        dialog.delete_button.click()
        assert dialog.presets.findText("Terse") < 0 and dialog.presets.currentIndex() == 0

    through_button(window, delete_terse, ok=False)
    assert window.settings.system_prompt_presets == [("Pirate", "Arr, briefly.")]
    assert window.store.get_chat_info(second).system_prompt == "Answer as a pirate."
    close_window(window)


def test_on_the_new_chat_a_preset_becomes_the_default(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", load=False)
    window.settings.save_preset("Coder", "You write Python.")
    through_button(window, lambda d: pick(d, "Coder"))
    assert window.settings.default_system_prompt == "You write Python."
    close_window(window)


def test_save_needs_a_name_and_bad_stored_entries_are_left_out(qtbot, settings):
    dialog = SystemPromptDialog("text", settings, new_chat=False)
    qtbot.addWidget(dialog)
    assert not dialog.save_button.isEnabled() and not dialog.presets.isEnabled()
    dialog.name.setText("   ")
    assert not dialog.save_button.isEnabled()
    with pytest.raises(ValueError, match="needs a name"):
        settings.save_preset(" ", "x")
    settings.store.set_setting("app.system_prompt_presets", [
        {"name": "Good", "text": "kept"}, {"name": "", "text": "no name"}, {"name": "No text"},
        ["not", "a", "dict"], {"name": 3, "text": "x"}])
    assert AppSettings(settings.store).system_prompt_presets == [("Good", "kept")]
    settings.store.set_setting("app.system_prompt_presets", "garbage")
    assert settings.system_prompt_presets == []
