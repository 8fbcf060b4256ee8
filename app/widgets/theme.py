"""Light/dark detection and the window's style sheet."""
from __future__ import annotations

from PySide6.QtGui import QGuiApplication, QPalette


def is_dark(palette: QPalette | None = None) -> bool:
    palette = palette or QGuiApplication.palette()
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def style_sheet(dark: bool) -> str:
    user_bg, assistant_bg, border, muted, error = (
        ("#2d3b55", "#23272e", "#3a3f47", "#9aa0a6", "#ef9a9a") if dark else
        ("#e3ecfa", "#ffffff", "#d9dce1", "#5f6368", "#c62828"))
    conversation = "#1b1e23" if dark else "#f6f7f9"
    return f"""
        QWidget#conversation {{ background: {conversation}; }}
        QFrame#userMessage {{ background: {user_bg}; border: none; border-radius: 10px; }}
        QFrame#assistantMessage {{ background: {assistant_bg}; border: 1px solid {border};
                                   border-radius: 10px; }}
        QLabel#statusLine {{ color: {muted}; }}
        QLabel#errorLine {{ color: {error}; }}
        QLabel#composerMessage {{ color: {error}; }}
        QLabel#emptyTitle {{ font-size: 18pt; font-weight: 600; }}
        QFrame#attachment {{ border: 1px solid {border}; border-radius: 6px; }}
        QPlainTextEdit#prompt {{ border: 1px solid {border}; border-radius: 6px; padding: 2px; }}
        QListView#chatList::item {{ padding: 4px 2px; }}
    """
