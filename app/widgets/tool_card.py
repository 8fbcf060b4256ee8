"""A tool call in the conversation: the tool, its arguments, the user's answer, the result and
the time it took. While the worker waits for the answer the card shows Allow once / Always for
this chat / Deny; a failed call shows its error in red. Built from a stored `tool` message
(its `tool` dict, schema v5), so a chat reopened after a restart shows the same cards."""
from __future__ import annotations

import json

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from ..tools import ALLOW_ONCE, ALWAYS, DENY
from .model_bar import escape

RESULT_CHARS = 2000  # shown on the card; the model got all of it (and Copy in the export has it)

STATUS_WORDS = {
    "waiting": "Waiting for your answer",
    "running": "Running…",
    "done": "Done",
    "error": "Failed",
    "denied": "Denied",
    "stopped": "Not run: the reply was stopped",
    "unfinished": "Not run: the call was cut off",
}
DECISION_WORDS = {ALLOW_ONCE: "allowed once", ALWAYS: "always allowed in this chat"}


def pretty_arguments(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(text)


def status_line(card: dict, waiting: bool) -> str:
    status = str(card.get("status", ""))
    if status == "waiting" and not waiting:
        status = "stopped"  # the app closed, or the reply was stopped, before an answer
    words = STATUS_WORDS.get(status, status)
    decision = DECISION_WORDS.get(card.get("decision", ""))
    if decision and status in ("running", "done", "error"):
        words += f" · {decision}"
    elapsed = card.get("elapsed_s")
    if isinstance(elapsed, (int, float)):
        words += f" · {elapsed:.2f} s"
    return words


class ToolCard(QFrame):
    """One tool call; `decided(message id, decision)` when a waiting card is answered."""

    decided = Signal(int, str)

    def __init__(self, message, *, waiting=lambda _message_id: False, dark: bool = False,
                 parent: QWidget | None = None):
        """`waiting(message id)`: whether the worker waits for this card's answer now."""
        super().__init__(parent)
        self._waiting_now = waiting
        waiting = bool(waiting(message.id))
        self.setObjectName("toolCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.message = message
        self.waiting = waiting
        # What ChatView asks of every message widget (a card has no stats or actions).
        self.live = None
        self.busy = False
        self._can_regenerate = False
        self.context = (0, True)
        self.hovered = False
        card = message.tool or {}
        self.card = card
        self.setAccessibleName(f"Tool call: {card.get('name', '?')}")
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)
        self._add_header(layout, card, waiting)
        self._add_arguments(layout, card, mono)
        self.buttons: dict[str, QPushButton] = {}
        if waiting:
            self._add_decision_buttons(layout)
        self._add_error(layout, card)
        self._add_result(layout, message, card, waiting, mono)
        self.note = QLabel(str(card.get("note") or ""))
        self.note.setWordWrap(True)
        self.note.setStyleSheet("font-style: italic;")
        self.note.setVisible(bool(card.get("note")))
        layout.addWidget(self.note)

    def _add_header(self, layout: QVBoxLayout, card: dict, waiting: bool) -> None:
        """The tool's name (and its server) on the left, the call's status on the right."""
        server = card.get("server")
        self.title = QLabel(f"Tool <b>{escape(str(card.get('name', '?')))}</b>"
                            + (f" <span style='color: gray'>({escape(str(server))})</span>" if server else ""))
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.status = QLabel(status_line(card, waiting))
        self.status.setObjectName("toolStatus")
        header = QHBoxLayout()
        header.addWidget(self.title)
        header.addStretch(1)
        header.addWidget(self.status)
        layout.addLayout(header)

    def _add_arguments(self, layout: QVBoxLayout, card: dict, mono) -> None:
        self.arguments = QLabel(pretty_arguments(card.get("arguments", "{}")))
        self.arguments.setFont(mono)
        self.arguments.setWordWrap(True)
        self.arguments.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.arguments.setAccessibleName("Arguments")
        layout.addWidget(self.arguments)

    def _add_decision_buttons(self, layout: QVBoxLayout) -> None:
        """Allow once / Always for this chat / Deny, shown while the worker waits for the answer."""
        row = QHBoxLayout()
        for decision, text, tip in (
                (ALLOW_ONCE, "Allow once", "Run this call"),
                (ALWAYS, "Always for this chat", "Run this call, and this tool's later calls in "
                                                 "this chat without asking"),
                (DENY, "Deny", "Do not run it; the model is told the user denied it")):
            button = QPushButton(text)
            button.setToolTip(tip)
            button.clicked.connect(lambda _=False, d=decision: self._decide(d))
            row.addWidget(button)
            self.buttons[decision] = button
        row.addStretch(1)
        layout.addLayout(row)

    def _add_error(self, layout: QVBoxLayout, card: dict) -> None:
        self.error = QLabel(f"Error: {card['error']}" if card.get("error") else "")
        self.error.setObjectName("errorLine")
        self.error.setStyleSheet("color: #c62828;")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.setVisible(bool(card.get("error")))
        layout.addWidget(self.error)

    def _add_result(self, layout: QVBoxLayout, message, card: dict, waiting: bool, mono) -> None:
        """The result (its first RESULT_CHARS), shown once the call has one and did not fail."""
        live = waiting or card.get("status") == "running"  # no result yet (the row says "not run")
        has_result = bool(message.text) and not card.get("error") and not live
        self.result_caption = QLabel("Result:")
        self.result_caption.setStyleSheet("color: gray;")
        self.result_caption.setVisible(has_result)
        layout.addWidget(self.result_caption)
        shown = message.text if len(message.text) <= RESULT_CHARS else message.text[:RESULT_CHARS] + " …"
        self.result = QLabel(shown)
        self.result.setFont(mono)
        self.result.setWordWrap(True)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result.setAccessibleName("Result")
        self.result.setVisible(has_result)
        layout.addWidget(self.result)

    def _decide(self, decision: str) -> None:
        for button in self.buttons.values():
            button.setEnabled(False)
        self.decided.emit(self.message.id, decision)

    # -- what ChatView asks of a message widget
    def shows(self, message, live, error: str, dark: bool) -> bool:
        return (message.id == self.message.id and message.text == self.message.text
                and message.tool == self.message.tool and bool(self._waiting_now(message.id)) == self.waiting)

    def set_busy(self, busy: bool, can_regenerate: bool, can_reply: bool = True) -> None:
        self.busy = busy

    def set_stats(self, live) -> None:
        pass

    def show_actions(self, shown: bool) -> None:
        pass
