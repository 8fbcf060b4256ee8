"""The window's look: light or dark (following the desktop or View → Theme), and the text size
(View → Zoom), both remembered in the store.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QApplication

from .widgets.icons import icon
from .widgets.theme import apply_color_scheme, is_dark, style_sheet

THEMES = ("system", "light", "dark")


class Appearance(QObject):
    """Theme and zoom; `dark` is the scheme the window is drawn in now."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.store = window.store
        self.settings = window.settings
        self.dark = is_dark()

    def apply_at_start(self) -> None:
        """The style sheet, the remembered text size and the light/dark chosen last time."""
        self.window.setStyleSheet(style_sheet(self.dark))
        self.apply_font_size(self.settings.font_size)
        if self.theme != "system":
            self.set_theme(self.theme)

    @property
    def theme(self) -> str:
        """'system' (follow the desktop), 'light' or 'dark', as chosen in View → Theme."""
        value = self.store.get_setting("theme", "system")
        return value if value in THEMES else "system"

    def set_theme(self, theme: str) -> None:
        self.store.set_setting("theme", theme)
        for key, a in self.window.theme_actions.items():
            a.setChecked(key == theme)
        app = QApplication.instance()
        app.setProperty("tramontane-theme", theme)  # theme.follow_system_scheme reads it
        apply_color_scheme(app, dark=None if theme == "system" else theme == "dark")

    def palette_changed(self) -> None:
        """The window's palette changed: it may be the other scheme now."""
        dark = is_dark(self.window.palette())
        if dark != self.dark:
            self.dark = dark
            # Every message is drawn anew in the new colours. The old ones go first, a few
            # at a time: restyling a window that holds a long chat would stall the UI.
            self.window.view.clear()
            self.window.view.after_trash(lambda: self._apply_scheme(dark))

    def _apply_scheme(self, dark: bool) -> None:
        if dark != self.dark:
            return  # switched back meanwhile: that switch applies
        w = self.window
        w.setStyleSheet(style_sheet(dark))
        w.new_button.setIcon(icon("new-chat"))
        w.view.dark = dark
        w.conversation.refresh_view()

    def apply_font_size(self, size: int) -> None:
        font = QFont(QApplication.font())
        if size:
            font.setPointSize(size)
        for widget in (self.window.view, self.window.composer, self.window.chat_list):
            widget.setFont(font)

    def zoom(self, step: int) -> None:
        """One point bigger (+1) or smaller (-1), or back to the system size (0); remembered."""
        w = self.window
        base = QApplication.font().pointSize() or 10
        size = self.settings.font_size or base
        size = base if step == 0 else max(6, min(48, size + step))
        self.settings.font_size = 0 if size == base else size
        if w.view.long_chat_shown():
            # A long chat is drawn anew in the new size, a few messages at a time: handing the
            # font to every message at once would stall the UI (see ChatView._build_backlog).
            w.view.clear()
            w.view.after_trash(lambda: (self.apply_font_size(size), w.conversation.refresh_view()))
            return
        self.apply_font_size(size)
        w.conversation.refresh_view()


__all__ = ["Appearance", "THEMES"]
