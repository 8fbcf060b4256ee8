"""The System prompt dialog: the chat's system prompt (on the new chat, the default one), and
the named presets it can be picked from (Settings' system_prompt_presets): pick one, save the
text as one, delete one. Preset changes are kept at once, whether the dialog ends in OK or not."""
from __future__ import annotations

from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QLineEdit,
                               QPlainTextEdit, QPushButton, QVBoxLayout, QWidget)

from ..config import AppSettings


class SystemPromptDialog(QDialog):
    """After OK, `text()` is the system prompt to keep."""

    def __init__(self, text: str, settings: AppSettings, parent: QWidget | None = None, *, new_chat: bool):
        super().__init__(parent)
        self.settings = settings
        # No chat yet: what is edited is the default every new chat starts with; say so.
        self.setWindowTitle("Default system prompt" if new_chat else "System prompt")
        self.edit = QPlainTextEdit(text)
        self.edit.setAccessibleName("System prompt")
        self.edit.setTabChangesFocus(True)
        self.presets = QComboBox()
        self.presets.setAccessibleName("Presets")
        self.presets.setToolTip("Put a saved system prompt in the box")
        self.presets.activated.connect(self._pick)
        self.delete_button = QPushButton("Delete preset")
        self.delete_button.clicked.connect(self._delete)
        self.name = QLineEdit()
        self.name.setPlaceholderText("Preset name")
        self.name.setAccessibleName("Preset name")
        self.save_button = QPushButton("Save as preset")
        self.save_button.clicked.connect(self._save)
        self.name.textChanged.connect(lambda name: self.save_button.setEnabled(bool(name.strip())))
        self.save_button.setEnabled(False)
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        box.accepted.connect(self.accept)
        box.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Instructions the model reads before every new chat (the default, "
                                "also in Settings):" if new_chat else
                                "Instructions the model reads before this chat:"))
        layout.addLayout(_row(QLabel("Preset:"), self.presets, self.delete_button))
        layout.addWidget(self.edit)
        layout.addLayout(_row(self.name, self.save_button))
        layout.addWidget(box)
        self.resize(560, 300)
        self._fill()

    def text(self) -> str:
        return self.edit.toPlainText()

    def _fill(self, current: str = "") -> None:
        """The presets as saved, `current` chosen (else the "choose" line)."""
        self.presets.clear()
        names = [name for name, _ in self.settings.system_prompt_presets]
        self.presets.addItem("Choose a preset…" if names else "No presets yet", None)
        for name in names:
            self.presets.addItem(name, name)
        self.presets.setCurrentIndex(max(0, self.presets.findData(current)) if current else 0)
        self.presets.setEnabled(bool(names))
        self.delete_button.setEnabled(bool(current))

    def _pick(self, index: int) -> None:
        name = self.presets.itemData(index)
        self.delete_button.setEnabled(name is not None)
        if name is None:
            return
        self.edit.setPlainText(dict(self.settings.system_prompt_presets).get(name, ""))
        self.name.setText(name)  # so "Save as preset" updates this one

    def _save(self) -> None:
        name = self.name.text().strip()
        self.settings.save_preset(name, self.text())
        self._fill(name)

    def _delete(self) -> None:
        name = self.presets.currentData()
        if name is not None:
            self.settings.delete_preset(name)
            self._fill()


def _row(*widgets: QWidget) -> QHBoxLayout:
    row = QHBoxLayout()
    for widget in widgets:
        row.addWidget(widget, 1 if isinstance(widget, (QComboBox, QLineEdit)) else 0)
    return row


__all__ = ["SystemPromptDialog"]
