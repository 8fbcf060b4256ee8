"""What an empty chat shows: how to get a model, or how to start once one is loaded."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from ..engine_info import EngineInfo


class EmptyState(QWidget):
    """What an empty chat shows: how to get a model, or what to do once one is loaded."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = QLabel()
        self.title.setObjectName("emptyTitle")
        self.title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.recommended_button = QPushButton("Get a recommended model…")
        self.recommended_button.setToolTip("Opens the model manager on its recommended models")
        self.open_button = QPushButton("Open a GGUF file…")
        self.local_buttons: list[QPushButton] = []
        self.local_box = QVBoxLayout()
        column = QVBoxLayout(self)
        column.addStretch(1)
        column.addWidget(self.title)
        # A word-wrapped label given an alignment in its layout gets the height of a too-narrow
        # box and is clipped; centre it between stretches instead, capped at a readable width.
        text_row = QHBoxLayout()
        text_row.addStretch(1)
        self.text.setMaximumWidth(620)
        self.text.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        text_row.addWidget(self.text, 4)
        text_row.addStretch(1)
        column.addLayout(text_row)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.recommended_button)
        row.addWidget(self.open_button)
        row.addStretch(1)
        column.addLayout(row)
        column.addLayout(self.local_box)
        column.addStretch(2)

    def show_state(self, *, loaded: EngineInfo | None, loading: bool, local_models, on_load) -> None:
        for b in self.local_buttons:
            self.local_box.removeWidget(b)
            b.deleteLater()
        self.local_buttons = []
        if loaded is not None or loading:
            self.title.setText("Start a conversation")
            vision = (" Drop, paste or attach images to ask about them." if loaded and loaded.has_vision
                      else "")
            self.text.setText(("The model is loading; you can type meanwhile." if loading else
                               f"Type a message below and press Enter.{vision}"))
            self.recommended_button.hide()
            self.open_button.hide()
            return
        self.title.setText("No model loaded")
        self.recommended_button.show()
        self.open_button.show()
        if local_models:
            self.text.setText("Load a model from this computer with one click, or get another:")
        else:
            self.text.setText("Tramontane runs Mistral 3 models (GGUF) on this computer. Download "
                              "a recommended one (with its vision projector for images), or open a "
                              "GGUF file you already have.")
        for model, mmproj in local_models[:5]:
            label = f"Load {Path(model).name}" + (" + projector" if mmproj else "")
            button = QPushButton(label)
            button.setToolTip(str(model))
            button.clicked.connect(lambda _=False, m=str(model), p=str(mmproj or ""): on_load(m, p))
            self.local_box.addWidget(button, 0, Qt.AlignmentFlag.AlignHCenter)
            self.local_buttons.append(button)
