"""The chat header's Tools switch (app/tools.py): whether the open chat may call the tools of
Settings → Tools, on the local model or a server's (its OpenAI tool calls go through the same
loop and cards).

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Slot

from .store import StoreError
from .tools import chat_tools_on, set_chat_tools


class ToolsSwitch(QObject):
    """The switch's state per chat; for the chat not saved yet it is kept here until its first
    message (`new_chat_tools`)."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.store = window.store
        self.session = window.session
        self.new_chat_tools = False  # the switch's state for the chat not saved yet

    def update(self, on: bool | None = None) -> None:
        """`on`: the open chat's switch, when the caller has just read the chat (a store read
        here could wait for the worker's write of a reply)."""
        button = self.window.tools_button
        if on is None:
            on = button.isChecked()
        button.setChecked(on)
        if on:  # its servers start now, not when the first message waits for them
            self.window.tools.start_listing()
        button.setToolTip("This chat may call the tools of Settings → Tools (each call asks first)")

    def toggle(self, on: bool) -> None:
        chat_id = self.session.current_chat_id
        if chat_id is None:
            self.new_chat_tools = on
        else:
            try:
                set_chat_tools(self.store, chat_id, on)
            except StoreError as exc:
                self.window.conversation.show_status(str(exc))
                on = chat_tools_on(self.store, chat_id)
        self.update(on)

    @Slot(str)
    def tool_server_failed(self, text: str) -> None:
        self.window.statusBar().showMessage(text, 20000)


__all__ = ["ToolsSwitch"]
