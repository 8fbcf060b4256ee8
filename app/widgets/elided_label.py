"""A one-line label that cuts its text with "…" instead of widening the window."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QTextDocumentFragment
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """A one-line label that never makes the window wider: the text is cut with "…" to fit,
    and the whole of it is in the tooltip. `text()` gives back what was set (a `<b>…</b>`
    wrapper is shown bold)."""

    def __init__(self, text: str = "", parent: QWidget | None = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight):
        super().__init__(parent)
        self._full = ""
        self._mode = mode
        self._tip = ""
        self.setTextFormat(Qt.TextFormat.PlainText)
        # Its whole width when there is room, down to nothing when not (minimumSizeHint).
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        self._full = text
        bold = text.startswith("<b>") and text.endswith("</b>")
        plain = QTextDocumentFragment.fromHtml(text).toPlainText() if bold else text
        self._plain = " ".join(plain.split())  # one line
        font = self.font()
        font.setBold(bold)
        super().setFont(font)
        super().setToolTip(self._tip or (self._plain if self._plain else ""))
        self._elide()
        self.updateGeometry()  # sizeHint() follows the whole text, not the shown part

    def text(self) -> str:
        return self._full

    def setToolTip(self, tip: str) -> None:  # noqa: N802 - Qt override
        self._tip = tip
        super().setToolTip(tip or self._plain)

    def sizeHint(self) -> QSize:  # noqa: N802 - the whole text, if there is room
        hint = super().sizeHint()
        return QSize(self.fontMetrics().horizontalAdvance(self._plain) + 4, hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(0, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = self.contentsRect().width()
        # Not laid out yet (width 0): the whole text, cut at the first resize.
        shown = self.fontMetrics().elidedText(self._plain, self._mode, width) if width > 0 else self._plain
        super().setText(shown)
