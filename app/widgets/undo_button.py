"""The status bar's Undo offer for a deleted chat: shown for UNDO_DELETE_MS, then `expired`."""
from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QPushButton

UNDO_DELETE_MS = 10_000


class UndoButton(QPushButton):
    """Hidden until `offer`; clicking it is the undo, `expired` says the offer ran out."""

    expired = Signal()

    def __init__(self, parent=None):
        super().__init__("Undo", parent)
        self.setToolTip("Bring the deleted chat back")
        self.hide()
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(UNDO_DELETE_MS)
        self.timer.timeout.connect(self.expired)

    def offer(self, title: str) -> None:
        self.setText(f"Undo: deleted “{title[:40]}”")
        self.show()
        self.timer.start()

    def withdraw(self) -> None:
        self.timer.stop()
        self.hide()


__all__ = ["UNDO_DELETE_MS", "UndoButton"]
