"""The status bar's "Reload to apply": settings that only apply when the model loads again."""
from __future__ import annotations

from PySide6.QtWidgets import QPushButton


class ReloadButton(QPushButton):
    """Hidden until Settings changed the context length, device or GPU layers of a loaded model."""

    def __init__(self, parent=None):
        super().__init__("Reload to apply", parent)
        self.setToolTip("Load the model again with the new context length, device "
                        "or GPU layers from Settings")
        self.hide()


__all__ = ["ReloadButton"]
