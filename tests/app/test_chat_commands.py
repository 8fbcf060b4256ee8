"""Found by using the window: after "New chat" the sidebar's Rename/Branch/Delete acted on the
chat opened before, which is neither shown nor highlighted any more."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QInputDialog, QMessageBox  # noqa: E402


@pytest.fixture
def window(idle_window):
    return idle_window


def test_new_chat_leaves_no_hidden_target_for_chat_actions(qtbot, window, monkeypatch):
    alpha = window.store.create_chat("Alpha")
    beta = window.store.create_chat("Beta")
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(alpha)
    assert window.navigation.selected_chat_id() == alpha and window.delete_button.isEnabled()

    window.navigation.new_chat()
    assert window.session.current_chat_id is None
    assert window.navigation.selected_chat_id() is None
    for button in (window.rename_button, window.branch_button, window.delete_button):
        assert not button.isEnabled(), button.text()

    # Even when triggered (shortcut, menu), nothing happens to a chat the user cannot see.
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    monkeypatch.setattr(QInputDialog, "exec", lambda self: (self.setTextValue("Renamed"), 1)[1])
    window.chats.delete_selected()
    window.chats.rename_selected()
    window.chats.branch_selected()
    titles = sorted(c.title for c in window.store.list_chats())
    assert titles == ["Alpha", "Beta"]

    # Clicking a chat in the list makes it the target again.
    window.chat_list.setCurrentIndex(window.chat_model.index(window.chat_model.row_of(beta)))
    assert window.session.current_chat_id == beta and window.navigation.selected_chat_id() == beta
    assert window.delete_button.isEnabled()
    window.chats.rename_selected()
    assert window.store.get_chat_info(beta).title == "Renamed"


def test_system_prompt_dialog_says_what_it_changes(qtbot, window):
    """On "New chat" the System prompt… button edits the default for every new chat (there is
    no chat yet); the dialog said "before this chat"."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QDialog, QLabel

    seen = []

    def read_and_close():
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, QDialog)
        seen.append((dialog.windowTitle(), " ".join(l.text() for l in dialog.findChildren(QLabel))))
        dialog.reject()

    QTimer.singleShot(0, read_and_close)
    window.chats.edit_system_prompt()
    chat_id = window.store.create_chat("Alpha")
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    QTimer.singleShot(0, read_and_close)
    window.chats.edit_system_prompt()

    (new_title, new_text), (chat_title, chat_text) = seen
    assert "Default" in new_title and "every new chat" in new_text and "this chat" not in new_text
    assert chat_title == "System prompt" and "this chat" in chat_text
