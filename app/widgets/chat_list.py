"""The chat list: a QAbstractListModel over the store's chats (pinned first, newest first),
filtered by the store's search (titles and message text), shown under the headings Pinned /
Today / Yesterday / Last 7 days / Older."""
from __future__ import annotations


import datetime
import time

from PySide6.QtCore import QAbstractListModel, QModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QFont, QPalette
from PySide6.QtWidgets import QStyledItemDelegate

from .icons import icon

ChatIdRole = Qt.ItemDataRole.UserRole + 1
HeadingRole = Qt.ItemDataRole.UserRole + 2  # the group heading shown above this row, or ''


def group_of(pinned: bool, updated_at: float, today: datetime.date | None = None) -> str:
    """The heading a chat is listed under."""
    if pinned:
        return "Pinned"
    today = today or datetime.date.today()
    days = (today - datetime.date.fromtimestamp(updated_at)).days
    if days <= 0:
        return "Today"
    if days == 1:
        return "Yesterday"
    if days < 7:
        return "Last 7 days"
    return "Older"


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
        self.writing_id: int | None = None  # the chat whose reply is being written
        self.hidden: set[int] = set()  # deleted, still undoable (see ChatCommands.delete_chat)

    def set_writing(self, chat_id: int | None) -> None:
        """Mark the chat that is writing a reply (its row says so), or none."""
        if chat_id == self.writing_id:
            return
        rows = [self.row_of(c) for c in (self.writing_id, chat_id)]
        self.writing_id = chat_id
        for row in rows:
            if row >= 0:
                self.dataChanged.emit(self.index(row), self.index(row))

    def refresh(self, query: str | None = None) -> None:
        if query is not None:
            self.query = query
        self.beginResetModel()
        q = self.query.strip()
        chats = self.store.search_chats(q) if q else self.store.list_chats()
        self.chats = [c for c in chats if c.id not in self.hidden]
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.chats)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.chats):
            return None
        chat = self.chats[index.row()]
        writing = chat.id == self.writing_id
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{chat.title}  · writing…" if writing else chat.title
        if role == Qt.ItemDataRole.DecorationRole:
            return icon("pin") if chat.pinned else None
        if role == HeadingRole:
            group = group_of(chat.pinned, chat.updated_at)
            previous = self.chats[index.row() - 1] if index.row() else None
            same = previous is not None and group_of(previous.pinned, previous.updated_at) == group
            return "" if same else group
        if role == Qt.ItemDataRole.ToolTipRole:
            state = "writing a reply" if writing else _when(chat.updated_at)
            return f"{chat.title}\n{chat.message_count} messages · {state}"
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return f"{chat.title}, writing a reply" if writing else chat.title
        if role == ChatIdRole:
            return chat.id
        return None

    def row_of(self, chat_id: int | None) -> int:
        return next((i for i, c in enumerate(self.chats) if c.id == chat_id), -1)

    def chat_id(self, row: int) -> int | None:
        return self.chats[row].id if 0 <= row < len(self.chats) else None


class ChatListDelegate(QStyledItemDelegate):
    """Draws a row's group heading (Today, Yesterday...) above the first chat of each group."""

    def _heading_height(self, option) -> int:
        return option.fontMetrics.height() + 12

    def sizeHint(self, option, index) -> QSize:  # noqa: N802
        size = super().sizeHint(option, index)
        if index.data(HeadingRole):
            size.setHeight(size.height() + self._heading_height(option))
        return size

    def paint(self, painter, option, index) -> None:
        heading = index.data(HeadingRole)
        if not heading:
            super().paint(painter, option, index)
            return
        top = self._heading_height(option)
        painter.save()
        font = QFont(option.font)
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 0.9)
        painter.setFont(font)
        painter.setPen(option.palette.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text))
        painter.drawText(QRect(option.rect.left() + 6, option.rect.top() + 4, option.rect.width() - 6, top - 4),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, heading)
        painter.restore()
        row = type(option)(option)
        row.rect = option.rect.adjusted(0, top, 0, 0)
        super().paint(painter, row, index)
