"""A reasoning model's thought above its answer (issue 36): a foldable block titled "Thinking… 4 s"
while the model thinks, then "Thought for 12 s"; open while it thinks, folded once the answer
begins (unless the user opened or closed it meanwhile: their choice stands), folded for a stored
reply; its own Copy. The thought is shown as plain text: it is the model's notes, not the answer."""
from __future__ import annotations

import time

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from ..reasoning import thought_title
from .icons import icon

COPIED_MS = 1500


class ReasoningBlock(QFrame):
    """`set_thought` as the thought streams or as it was stored; `answer_started` when the
    answer's first words come (the block folds, unless the user chose)."""

    chosen = Signal(bool)  # the user opened (True) or closed it

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("reasoningBlock")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.text = ""
        self.seconds: float | None = None
        self.cut = False
        self.thinking = False
        self.user_chose = False  # the user opened or closed it: it stays so
        self._since = 0.0  # time.monotonic() of the first streamed piece (the live seconds)
        self.toggle = QToolButton()
        self.toggle.setObjectName("reasoningToggle")
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setToolTip("Show or hide what the model thought before it answered")
        self.toggle.clicked.connect(self._clicked)
        self.copy = QToolButton()
        self.copy.setText("Copy thought")
        self.copy.setAccessibleName("Copy thought")
        self.copy.setToolTip("Copy what the model thought")
        self.copy.setIcon(icon("copy"))
        self.copy.setIconSize(QSize(16, 16))
        self.copy.setAutoRaise(True)
        self.copy.clicked.connect(self._copy)
        self._copied = QTimer(self)
        self._copied.setSingleShot(True)
        self._copied.setInterval(COPIED_MS)
        self._copied.timeout.connect(self._copy_done)
        self.body = QLabel()
        self.body.setObjectName("reasoningText")
        self.body.setTextFormat(Qt.TextFormat.PlainText)  # model output is never HTML here
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                          | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.body.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.body.setAccessibleName("Thought")
        self.body.hide()
        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.addWidget(self.toggle)
        header.addStretch(1)
        header.addWidget(self.copy)
        # Its own look, in either theme: a quiet frame, a flat toggle, the thought in italics
        # (apart from the answer without a colour that could fall below contrast in a theme).
        self.setStyleSheet("QFrame#reasoningBlock { border: 1px solid palette(mid); border-radius: 6px; }"
                           " QToolButton#reasoningToggle { border: none; background: transparent; }"
                           " QLabel#reasoningText { font-style: italic; padding: 0 0 4px 18px; }")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 2, 8, 4)
        layout.setSpacing(2)
        layout.addLayout(header)
        layout.addWidget(self.body)
        self.hide()

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    @property
    def title(self) -> str:
        return self.toggle.text()

    def set_thought(self, text: str, *, seconds: float | None = None, cut: bool = False,
                    thinking: bool = False) -> None:
        """The thought so far (`thinking`: still streaming, the block is open unless the user
        closed it) or as stored (`seconds` it took, `cut` before its end)."""
        if thinking and not self.thinking:
            self._since = time.monotonic()
            if not self.user_chose:
                self.set_expanded(True)
        if seconds is None and not thinking:
            seconds = self.seconds  # measured here when the answer began
        self.text, self.seconds, self.cut, self.thinking = text, seconds, cut, thinking
        self.body.setText(text.strip("\n"))
        self._retitle()
        self.setVisible(bool(text) or thinking)

    def answer_started(self) -> None:
        """The answer's first words: the thinking is over; the block folds (unless the user chose)."""
        if not self.thinking:
            return
        self.thinking = False
        self.seconds = time.monotonic() - self._since
        self._retitle()
        if not self.user_chose:
            self.set_expanded(False)

    def set_expanded(self, on: bool) -> None:
        self.toggle.setChecked(on)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.body.setVisible(on)

    def _retitle(self) -> None:
        if self.thinking:
            elapsed = round(time.monotonic() - self._since)
            title = thought_title(None, thinking=True) + (f" {elapsed} s" if elapsed else "")
        else:
            title = thought_title(self.seconds, self.cut)
        self.toggle.setText(title)
        self.toggle.setAccessibleName(title)

    def _clicked(self, on: bool) -> None:
        self.user_chose = True
        self.set_expanded(on)
        self.chosen.emit(on)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        self.copy.setIcon(icon("check"))  # says it worked, for a moment
        self.copy.setText("Copied")
        self.copy.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self._copied.start()

    def _copy_done(self) -> None:
        self.copy.setIcon(icon("copy"))
        self.copy.setText("Copy thought")
        self.copy.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)


__all__ = ["ReasoningBlock"]
