"""Light/dark: the palettes, following the system's scheme or the user's choice, and the
window's style sheet."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory


def is_dark(palette: QPalette | None = None) -> bool:
    palette = palette or QGuiApplication.palette()
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


ACCENT = "#2f6fde"


def style_sheet(dark: bool) -> str:
    user_bg, border, muted, error, box, hover, selected = (
        ("#2b323d", "#3a3f47", "#9aa0a6", "#ef9a9a", "#23272e", "#2c3139", "#2f3a4d") if dark else
        ("#eef1f6", "#d5d9df", "#5f6368", "#c62828", "#ffffff", "#eceef1", "#dde6f5"))
    conversation = "#1b1e23" if dark else "#ffffff"
    sidebar = "#202328" if dark else "#f5f6f8"
    return f"""
        QWidget#conversation, QWidget#conversationPane {{ background: {conversation}; }}
        QWidget#sidebar {{ background: {sidebar}; }}
        QFrame#userMessage {{ background: {user_bg}; border: none; border-radius: 16px;
                              margin-left: 72px; }}
        QFrame#assistantMessage {{ background: transparent; border: none; }}
        QLabel#roleLabel {{ color: {muted}; font-weight: 600; }}
        QLabel#statusLine {{ color: {muted}; }}
        QLabel#errorLine {{ color: {error}; }}
        QLabel#composerMessage {{ color: {error}; }}
        QLabel#composerNote {{ color: {muted}; }}
        QLabel#emptyTitle {{ font-size: 18pt; font-weight: 600; }}
        QLabel#groupLabel {{ color: {muted}; font-weight: 600; }}
        QFrame#composerBox {{ background: {box}; border: 1px solid {border}; border-radius: 18px; }}
        QFrame#attachment {{ border: 1px solid {border}; border-radius: 8px; }}
        QPlainTextEdit#prompt {{ border: none; background: transparent; padding: 2px; }}
        QPlainTextEdit#prompt QScrollBar:vertical {{ background: transparent; width: 8px; margin: 2px; }}
        QPlainTextEdit#prompt QScrollBar::handle:vertical {{ background: {border}; border-radius: 3px;
                                                             min-height: 24px; }}
        QPlainTextEdit#prompt QScrollBar::add-line:vertical, QPlainTextEdit#prompt QScrollBar::sub-line:vertical,
        QPlainTextEdit#prompt QScrollBar::add-page:vertical, QPlainTextEdit#prompt QScrollBar::sub-page:vertical
            {{ background: none; height: 0px; }}
        QLabel#dropOverlay {{ background: {selected}; border: 2px dashed {ACCENT};
                              border-radius: 12px; font-size: 14pt; color: palette(text); }}
        QToolButton#sendButton {{ background: {ACCENT}; border: none; border-radius: 15px;
                                  min-width: 30px; min-height: 30px; }}
        QToolButton#sendButton:disabled {{ background: {muted}; }}
        QToolButton#toolsSwitch, QToolButton#headerButton {{ border: 1px solid {border}; border-radius: 6px;
                                                             padding: 2px 8px; }}
        QToolButton#toolsSwitch:hover:!checked, QToolButton#headerButton:hover {{ background: {hover}; }}
        QToolButton#toolsSwitch:checked {{ background: {ACCENT}; border-color: {ACCENT}; color: #ffffff; }}
        QListView#chatList {{ background: transparent; border: none; }}
        QListView#chatList::item {{ padding: 5px 6px; border-radius: 6px; }}
        QListView#chatList::item:hover {{ background: {hover}; }}
        QListView#chatList::item:selected {{ background: {selected}; color: palette(text); }}
        QFrame#modelBar {{ border-bottom: 1px solid {border}; }}
        QLabel#quantChip {{ color: {muted}; border: 1px solid {border}; border-radius: 6px;
                            padding: 0px 5px; }}
        QProgressBar#contextMeter, QProgressBar#promptProgress {{ border: none; border-radius: 3px;
                                                                 background: {hover}; }}
        QProgressBar#contextMeter::chunk, QProgressBar#promptProgress::chunk {{ border-radius: 3px;
                                                                               background: {ACCENT}; }}
    """


def dark_palette():
    p = QPalette()
    role, group = QPalette.ColorRole, QPalette.ColorGroup
    colours = {
        role.Window: "#202328", role.WindowText: "#e6e6e6", role.Base: "#1b1e23",
        role.AlternateBase: "#262a30", role.ToolTipBase: "#2b2f36", role.ToolTipText: "#e6e6e6",
        role.PlaceholderText: "#8a8f98", role.Text: "#e6e6e6", role.Button: "#2b2f36",
        role.ButtonText: "#e6e6e6", role.BrightText: "#ff6b6b", role.Light: "#3a3f47",
        role.Midlight: "#33373e", role.Mid: "#2a2d33", role.Dark: "#16181c", role.Shadow: "#000000",
        role.Highlight: "#3d6fb4", role.HighlightedText: "#ffffff", role.Link: "#82aaff",
        role.LinkVisited: "#c792ea",
    }
    for r, c in colours.items():
        p.setColor(r, QColor(c))
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(group.Disabled, r, QColor("#6b7078"))
    return p


def light_palette():
    style = QStyleFactory.create("Fusion")
    return style.standardPalette() if style else QApplication.style().standardPalette()


def apply_color_scheme(app, dark: bool | None = None) -> bool:
    """Light or dark palette: `dark` forces one, None follows the system (Qt 6.5+
    styleHints().colorScheme()). Returns whether dark is in use."""
    if dark is None:
        scheme = app.styleHints().colorScheme() if hasattr(app.styleHints(), "colorScheme") else None
        dark = scheme == Qt.ColorScheme.Dark
    app.setPalette(dark_palette() if dark else light_palette())
    return dark


def follow_system_scheme(app) -> None:
    hints = app.styleHints()
    if hasattr(hints, "colorSchemeChanged"):
        # Only while the user's choice (View → Theme) is to follow the system.
        hints.colorSchemeChanged.connect(
            lambda _scheme: apply_color_scheme(app) if app.property("tramontane-theme") in (None, "system")
            else None)
