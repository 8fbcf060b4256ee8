"""app/tools_switch.py on the real window (no model loaded): the Tools switch is stored per chat,
held for the chat not saved yet, starts the tool servers' listing when turned on, and a write
the store refuses leaves the switch as stored with the store's sentence (issue 34, item 5)."""
from __future__ import annotations

import pytest

from tramontane.app.store import StoreError
from tramontane.app.tools import chat_tools_on

pytest.importorskip("pytestqt")


@pytest.fixture
def listings(idle_window, monkeypatch):
    """How many times the switch asked the tool broker to list its servers' tools."""
    asked = []
    monkeypatch.setattr(idle_window.tools, "start_listing", lambda: asked.append(True))
    return asked


def test_the_switch_is_stored_per_chat(idle_window, listings):
    w, switch = idle_window, idle_window.tools_switch
    first, second = w.store.create_chat("one"), w.store.create_chat("two")
    w.navigation.refresh_chat_list()
    w.navigation.open_chat(first)
    assert not w.tools_button.isChecked()
    w.tools_button.click()  # on, for this chat only
    assert w.tools_button.isChecked() and chat_tools_on(w.store, first) and listings == [True]
    assert not chat_tools_on(w.store, second)
    w.navigation.open_chat(second)
    assert not w.tools_button.isChecked()
    w.navigation.open_chat(first)
    assert w.tools_button.isChecked()
    switch.toggle(False)
    assert not chat_tools_on(w.store, first) and not w.tools_button.isChecked()
    assert listings == [True, True]  # reopening a chat with tools on starts the listing again


def test_the_chat_not_saved_yet_keeps_its_switch_until_its_first_message(idle_window, listings):
    w, switch = idle_window, idle_window.tools_switch
    w.navigation.new_chat()
    before = w.store.list_chats()
    switch.toggle(True)
    assert switch.new_chat_tools and w.tools_button.isChecked() and listings == [True]
    assert w.store.list_chats() == before  # no chat made for a switch
    switch.toggle(False)
    assert not switch.new_chat_tools and not w.tools_button.isChecked()


def test_a_refused_write_leaves_the_switch_as_stored_and_says_why(idle_window, listings, monkeypatch):
    w, switch = idle_window, idle_window.tools_switch
    chat = w.store.create_chat("read-only")
    w.navigation.refresh_chat_list()
    w.navigation.open_chat(chat)

    def refuse(*args, **kwargs):
        raise StoreError("chats.sqlite3: attempt to write a readonly database")

    monkeypatch.setattr(w.store, "update_chat", refuse)
    switch.toggle(True)
    assert w.status_label.text() == "chats.sqlite3: attempt to write a readonly database"
    assert not w.tools_button.isChecked() and not chat_tools_on(w.store, chat) and listings == []


def test_a_tool_server_that_fails_is_said_in_the_status_bar(idle_window):
    idle_window.tools_switch.tool_server_failed("weather: the server exited (code 1) before it listed its tools")
    assert idle_window.statusBar().currentMessage() == \
        "weather: the server exited (code 1) before it listed its tools"
