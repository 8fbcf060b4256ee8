"""Find in the open chat (Chat ▸ Find in chat, Ctrl+Shift+F): a bar over the composer that
highlights every match of its text in the shown messages, the current one in the accent colour
and scrolled to, with "3 of 12", Enter / Shift+Enter for the next and previous, Esc to close.

The chat list's search (Ctrl+F) finds chats; this finds the place inside the one on screen.
Matches are looked for again at each step, so a reply that came in meanwhile is included."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QLineEdit, QTextEdit, QToolButton, QWidget

from .icons import icon
from .theme import ACCENT

OTHER_MATCH = "#f6d365"  # the other matches: a marker yellow, readable on light and dark bubbles


def find_in_view(view, text: str) -> list[tuple[QWidget, QTextCursor]]:
    """(message widget, cursor over the match) of every case-insensitive match of `text` in
    the shown messages' text, in reading order."""
    matches: list[tuple[QWidget, QTextCursor]] = []
    if not text:
        return matches
    for widget in view.widgets:
        body = getattr(widget, "body", None)
        if body is None or widget.isHidden():
            continue
        doc = body.document()
        cursor = doc.find(text, 0)
        while not cursor.isNull():
            matches.append((widget, QTextCursor(cursor)))
            cursor = doc.find(text, cursor)
    return matches


def highlight(view, matches: list[tuple[QWidget, QTextCursor]], current: int) -> None:
    """Mark `matches` in their bubbles (the `current` one in the accent colour, scrolled to);
    none: every mark goes."""
    marks: dict[int, list] = {}
    for i, (widget, cursor) in enumerate(matches):
        selection = QTextEdit.ExtraSelection()
        selection.cursor = cursor
        selection.format.setBackground(QColor(ACCENT if i == current else OTHER_MATCH))
        selection.format.setForeground(QColor("#ffffff" if i == current else "#000000"))
        marks.setdefault(id(widget), []).append(selection)
    for widget in view.widgets:
        body = getattr(widget, "body", None)
        if body is not None:
            body.setExtraSelections(marks.get(id(widget), []))
    if matches:
        widget, cursor = matches[current]
        rect = widget.body.cursorRect(cursor)
        where = widget.body.viewport().mapTo(view.widget(), rect.center())
        view.ensureVisible(where.x(), where.y(), 0, max(40, view.viewport().height() // 3))


class FindBar(QFrame):
    """The bar; `view` is the ChatView it searches."""

    closed = Signal()

    def __init__(self, view, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("findBar")
        self.view = view
        self.current = 0
        self.matches: list[tuple[QWidget, QTextCursor]] = []
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("Find in this chat")
        self.edit.setAccessibleName("Find in this chat")
        self.edit.setClearButtonEnabled(True)
        self.edit.textChanged.connect(lambda _text: self.search(0, restart=True))
        self.edit.returnPressed.connect(lambda: self.search(+1))
        self.count = QLabel()
        self.count.setObjectName("statusLine")
        self.previous_button = self._button("previous", "Previous match (Shift+Enter)", lambda: self.search(-1))
        self.next_button = self._button("next", "Next match (Enter)", lambda: self.search(+1))
        self.close_button = self._button("close", "Close (Esc)", self.close_bar)
        for keys, slot in (("Shift+Return", lambda: self.search(-1)), ("Shift+Enter", lambda: self.search(-1)),
                           ("Escape", self.close_bar)):
            shortcut = QShortcut(QKeySequence(keys), self.edit)
            shortcut.setContext(Qt.ShortcutContext.WidgetShortcut)
            shortcut.activated.connect(slot)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(16, 4, 16, 0)
        layout.addWidget(self.edit, 1)
        layout.addWidget(self.count)
        for button in (self.previous_button, self.next_button, self.close_button):
            layout.addWidget(button)
        self.hide()

    @staticmethod
    def _button(name: str, tip: str, slot) -> QToolButton:
        button = QToolButton()
        button.setIcon(icon(name))
        button.setToolTip(tip)
        button.setAccessibleName(tip.split(" (")[0])
        button.setAutoRaise(True)
        button.clicked.connect(slot)
        return button

    def open_bar(self) -> None:
        """Show the bar with its text selected, and mark what it finds."""
        self.show()
        self.edit.setFocus()
        self.edit.selectAll()
        self.search(0)

    def search(self, step: int, restart: bool = False) -> None:
        """Find again (the view may have changed), then move `step` matches on; `restart`:
        from the first match (the text changed)."""
        self.matches = find_in_view(self.view, self.edit.text())
        if restart or not self.matches:
            self.current = 0
        else:
            self.current = (self.current + step) % len(self.matches)
        highlight(self.view, self.matches, self.current)
        if not self.edit.text():
            self.count.setText("")
        else:
            self.count.setText(f"{self.current + 1} of {len(self.matches)}" if self.matches else "No match")

    def chat_changed(self) -> None:
        """Another chat is on screen: an open bar finds its text there, from the first match.
        After the events already queued: the layout shows the chat's new bubbles by a queued call,
        and until then they count as hidden."""
        if self.isVisible():
            QTimer.singleShot(0, self, lambda: self.search(0, restart=True))

    def close_bar(self) -> None:
        self.hide()
        self.matches = []
        highlight(self.view, [], 0)
        self.closed.emit()


__all__ = ["FindBar", "find_in_view"]
