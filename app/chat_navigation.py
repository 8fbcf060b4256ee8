"""The chat list: search, which chat is open, its draft, and which chat the chat actions act on.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

from PySide6.QtCore import QModelIndex, QObject
from PySide6.QtGui import QTextCursor


class ChatNavigation(QObject):
    """Opens chats (keeping each one's draft) and keeps the list's highlight on the open one."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.session = window.session
        self.draft_shown = False  # the composer holds the current chat's draft
        self.following = False  # the list's highlight is being moved to the open chat (not a click)

    def search_changed(self, text: str) -> None:
        self.window.chat_model.refresh(text)
        self.select_current_in_list()

    def focus_search(self) -> None:
        self.window.search.setFocus()
        self.window.search.selectAll()

    def select_current_in_list(self) -> None:
        w = self.window
        row = w.chat_model.row_of(self.session.current_chat_id)
        # Not by blocking the selection model's signals: the view repaints on them, and with
        # them blocked it went on painting the chat opened before as the selected one.
        self.following = True
        try:
            if row >= 0:
                w.chat_list.setCurrentIndex(w.chat_model.index(row))
            else:
                # Also drop the current index: Rename/Branch/Delete act on it, and a chat that is
                # neither shown nor highlighted must not be their target.
                w.chat_list.setCurrentIndex(QModelIndex())
                w.chat_list.clearSelection()
        finally:
            self.following = False
        self.update_chat_actions()

    def update_chat_actions(self) -> None:
        """The chat actions are on only when there is a chat for them to act on."""
        w = self.window
        has_chat = self.selected_chat_id() is not None
        widgets = [w.rename_button, w.branch_button, w.delete_button]
        actions = ("rename_action", "branch_action", "delete_action", "pin_action", "export_action")
        widgets += [getattr(w, name) for name in actions if hasattr(w, name)]
        for widget in widgets:
            widget.setEnabled(has_chat)
        if hasattr(w, "pin_action"):  # says what it will do to the highlighted chat
            row = w.chat_model.row_of(self.selected_chat_id())
            pinned = row >= 0 and w.chat_model.chats[row].pinned
            w.pin_action.setText("Un&pin" if pinned else "&Pin")

    def chat_selected(self, current, _previous) -> None:
        if self.following:
            return
        chat_id = self.window.chat_model.chat_id(current.row()) if current.isValid() else None
        if chat_id is not None and chat_id != self.session.current_chat_id:
            self.open_chat(chat_id)

    def on_list_changed(self) -> None:
        self.window.composer.show_message("")  # a hint about the last attachment is stale now
        self.refresh_chat_list()

    def refresh_chat_list(self) -> None:
        """Reread the chat list (titles, order, pins) and highlight the open chat."""
        self.window.chat_model.refresh()
        self.select_current_in_list()
        pending = self.session.pending
        self.window.chat_model.set_writing(pending.chat_id if pending is not None else None)

    def open_chat(self, chat_id: int | None) -> None:
        w = self.window
        if chat_id != self.session.current_chat_id or not self.draft_shown:
            w.composer.show_message("")
            # The text typed in the chat we leave is kept for it; the one we open gets its own.
            if self.draft_shown:
                self.session.save_draft(self.session.current_chat_id, w.composer.edit.toPlainText())
            w.composer.edit.setPlainText(self.session.draft(chat_id))
            w.composer.edit.moveCursor(QTextCursor.MoveOperation.End)
            self.draft_shown = True
        changed = chat_id != self.session.current_chat_id
        self.session.current_chat_id = chat_id
        if chat_id is not None:
            w.settings.last_chat_id = chat_id
            w.binding.follow_chat_binding(chat_id)
        self.select_current_in_list()
        w.conversation.refresh_view()
        if changed:
            w.find_bar.chat_changed()

    def new_chat(self) -> None:
        self.open_chat(None)
        self.window.composer.edit.setFocus()

    def selected_chat_id(self) -> int | None:
        index = self.window.chat_list.currentIndex()
        return self.window.chat_model.chat_id(index.row()) if index.isValid() else self.session.current_chat_id


__all__ = ["ChatNavigation"]
