"""The chat list: a QAbstractListModel over the store's chats (pinned first, newest first),
filtered by the store's search (titles and message text)."""
from __future__ import annotations


import time

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt

ChatIdRole = Qt.ItemDataRole.UserRole + 1


def _when(ts: float) -> str:
    age = time.time() - ts
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        return time.strftime("%H:%M", time.localtime(ts))
    return time.strftime("%d %b %Y", time.localtime(ts))


class ChatListModel(QAbstractListModel):
    def __init__(self, store, parent=None):
        super().__init__(parent)
        self.store = store
        self.query = ""
        self.chats = []

    def refresh(self, query: str | None = None) -> None:
        if query is not None:
            self.query = query
        self.beginResetModel()
        q = self.query.strip()
        self.chats = self.store.search_chats(q) if q else self.store.list_chats()
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.chats)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.chats):
            return None
        chat = self.chats[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return ("📌 " if chat.pinned else "") + chat.title
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{chat.title}\n{chat.message_count} messages · {_when(chat.updated_at)}"
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return chat.title
        if role == ChatIdRole:
            return chat.id
        return None

    def row_of(self, chat_id: int | None) -> int:
        return next((i for i, c in enumerate(self.chats) if c.id == chat_id), -1)

    def chat_id(self, row: int) -> int | None:
        return self.chats[row].id if 0 <= row < len(self.chats) else None
