"""The chat actions of the Chat menu and the chat list: rename, delete (with Undo), branch, pin,
export, import, the system prompt (and its presets), the chat's own sampling settings. Each asks what it needs (a title, a confirmation, a file)
and hands the change to `ChatSession`.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QDialog, QFileDialog, QInputDialog, QMessageBox

from .dialogs.chat_settings import ChatSettingsDialog
from .dialogs.system_prompt import SystemPromptDialog
from .model_prompt import recommended_words
from .store import StoreError
from .tools import chat_tools_on


class ChatCommands(QObject):
    """The highlighted chat's actions; a deleted chat stays undoable until the Undo offer ends."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.store = window.store
        self.session = window.session
        self.doomed: int | None = None  # a deleted chat that Undo can still bring back

    def rename_chat(self, chat_id: int, title: str) -> None:
        self.session.rename_chat(chat_id, title)
        self.window.conversation.update_header()

    def rename_selected(self) -> None:
        chat_id = self.window.navigation.selected_chat_id()
        if chat_id is None:
            return
        old = self.store.get_chat_info(chat_id).title
        dialog = QInputDialog(self.window)
        dialog.setWindowTitle("Rename chat")
        dialog.setLabelText("Title:")
        dialog.setTextValue(old)
        dialog.setMinimumWidth(460)  # a title of a few words fits without scrolling
        self.rename_dialog = dialog
        if dialog.exec():
            self.rename_chat(chat_id, dialog.textValue())

    def delete_chat(self, chat_id: int) -> None:
        """Gone from the list at once; deleted from the store when the Undo offer ends (after
        UNDO_DELETE_MS, at the next delete, or at quit)."""
        w = self.window
        self.commit_deletes()  # one undo at a time: the one before goes for good
        try:
            title = self.store.get_chat_info(chat_id).title
        except StoreError as exc:
            w.conversation.show_status(str(exc))
            return
        pending = self.session.pending
        if pending is not None and pending.chat_id == chat_id:
            pending.cancel.set()
        self.doomed = chat_id
        w.chat_model.hidden = {chat_id}
        if self.session.current_chat_id == chat_id:
            w.navigation.open_chat(None)
        w.navigation.refresh_chat_list()
        w.undo_button.offer(title)

    def undo_delete(self) -> None:
        """Bring the chat deleted last back, as it was."""
        chat_id, self.doomed = self.doomed, None
        self.window.undo_button.withdraw()
        self.window.chat_model.hidden = set()
        if chat_id is not None:
            self.window.navigation.refresh_chat_list()
            self.window.navigation.open_chat(chat_id)

    def commit_deletes(self) -> None:
        chat_id, self.doomed = self.doomed, None
        self.window.undo_button.withdraw()
        self.window.chat_model.hidden = set()
        if chat_id is not None and self.session.delete_chat(chat_id):
            self.window.conversation.refresh_view()

    def delete_selected(self) -> None:
        chat_id = self.window.navigation.selected_chat_id()
        if chat_id is None:
            return
        title = self.store.get_chat_info(chat_id).title
        answer = QMessageBox.question(self.window, "Delete chat", f"Delete “{title}” and its messages?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_chat(chat_id)

    def branch_at(self, message_id: int | None = None, chat_id: int | None = None) -> int | None:
        chat_id = chat_id if chat_id is not None else self.session.current_chat_id
        if chat_id is None:
            return None
        new_id = self.session.branch(chat_id, message_id)
        if new_id is not None:
            self.window.navigation.open_chat(new_id)
        return new_id

    def branch_selected(self) -> None:
        chat_id = self.window.navigation.selected_chat_id()
        if chat_id is not None:
            self.branch_at(None, chat_id)

    def set_pinned(self, chat_id: int, pinned: bool) -> None:
        self.session.set_pinned(chat_id, pinned)

    def toggle_pin_selected(self) -> None:
        chat_id = self.window.navigation.selected_chat_id()
        if chat_id is not None:
            self.session.toggle_pin(chat_id)

    def export_chat(self, chat_id: int, path: str | Path) -> Path | None:
        """JSON (re-importable) or, for a .md path, Markdown with the images beside it."""
        result = self.session.export_chat(chat_id, path)
        self.window.composer.show_message("")
        if result is not None:
            self.window.conversation.show_status(f"Saved {result}")
        return result

    def import_chat(self, path: str | Path) -> int | None:
        chat_id = self.session.import_chat(path)
        if chat_id is not None:
            self.window.navigation.open_chat(chat_id)
        return chat_id

    def export_selected(self) -> None:
        chat_id = self.window.navigation.selected_chat_id()
        if chat_id is None:
            return
        title = self.store.get_chat_info(chat_id).title
        safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "chat"
        start = Path(self.window.settings.last_folder("chats") or Path.home())
        path, _ = QFileDialog.getSaveFileName(self.window, "Export chat", str(start / f"{safe}.json"),
                                              "Chat JSON (*.json);;Markdown (*.md)")
        if path:
            self.window.conversation.remember_folder("chats", path)
            self.export_chat(chat_id, path)

    def import_selected(self) -> None:
        start = self.window.settings.last_folder("chats") or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self.window, "Import chat", start, "Chat JSON (*.json)")
        if path:
            self.window.conversation.remember_folder("chats", path)
            self.import_chat(path)

    def edit_system_prompt(self) -> None:
        """The chat's system prompt (the default on the new chat), picked from or saved as a preset."""
        dialog = SystemPromptDialog(self.session.system_prompt(), self.window.settings, self.window,
                                    new_chat=self.session.current_chat_id is None)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.set_system_prompt(dialog.text())

    def set_system_prompt(self, text: str) -> None:
        self.session.set_system_prompt(text)

    def edit_chat_settings(self) -> None:
        """Chat ▸ Chat settings: the open chat's own temperature, top_p, max tokens and seed
        (for the new chat, those it will be saved with), or the defaults; its reasoning switch
        where the model can think; its own system prompt alone; a tool call first, where it
        may call tools."""
        chat_id = self.session.current_chat_id
        info = self.session.engine_info
        recommended = self.window.settings.sampling.recommended_values(self.session.model_sampling())
        dialog = ChatSettingsDialog(self.session.chat_sampling(chat_id), self.session.default_sampling(),
                                    self.window, new_chat=chat_id is None,
                                    reasoning=self.session.chat_reasoning(chat_id),
                                    can_think=info is not None and info.can_think,
                                    chat_version=info.chat_version if info is not None else 0,
                                    overflow=self.session.chat_overflow(chat_id),
                                    own_prompt_only=self.session.own_prompt_only(chat_id),
                                    tools_required=self.session.tools_required(chat_id)
                                    if self.chat_tools_on(chat_id) else None,
                                    recommended=recommended_words(recommended))
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.session.set_chat_sampling(chat_id, dialog.values())
            self.session.set_chat_overflow(chat_id, dialog.overflow_choice())
            if not dialog.reasoning.isHidden():  # shown: the model can think
                self.session.set_chat_reasoning(chat_id, dialog.reasoning.isChecked())
            self.session.set_own_prompt_only(chat_id, dialog.own_prompt_only.isChecked())
            if not dialog.tools_required.isHidden():  # shown: tools are on for the chat
                self.session.set_tools_required(chat_id, dialog.tools_required.isChecked())

    def chat_tools_on(self, chat_id: int | None) -> bool:
        """The chat's Tools switch (for the new chat, the one it will be saved with)."""
        if chat_id is None:
            return self.window.tools_switch.new_chat_tools
        try:
            return chat_tools_on(self.store, chat_id)
        except StoreError:
            return False


__all__ = ["ChatCommands"]
