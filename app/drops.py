"""Images and documents dropped anywhere on the window (the conversation, the empty state) go to the composer:
its own drop handling decides. While they are dragged over the window an overlay over the
conversation pane says where they will go.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QLabel, QWidget


class DropsToComposer(QObject):
    """An event filter on the window: its drag and drop events are the composer's."""

    def __init__(self, window: QWidget, composer, pane: QWidget, overlay_parent: QWidget):
        super().__init__(window)
        self.composer = composer
        self.pane = pane  # what the overlay covers
        self.overlay = QLabel("Drop images or documents here to attach them to your message", overlay_parent)
        self.overlay.setObjectName("dropOverlay")
        self.overlay.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.overlay.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.overlay.hide()  # over the conversation, outside the layout
        window.setAcceptDrops(True)
        window.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802
        kind = event.type()
        if kind == QEvent.Type.DragEnter:
            self.composer.dragEnterEvent(event)
            if event.isAccepted():
                self.overlay.setGeometry(self.pane.geometry().adjusted(12, 12, -12, -12))
                self.overlay.raise_()
                self.overlay.show()
            return True
        if kind == QEvent.Type.DragMove:
            self.composer.dragMoveEvent(event)
            return True
        if kind == QEvent.Type.DragLeave:
            self.overlay.hide()
            return False  # the window's own handling too
        if kind == QEvent.Type.Drop:
            self.overlay.hide()
            self.composer.dropEvent(event)
            return True
        return False


__all__ = ["DropsToComposer"]
