"""app/chat_navigation.py on the real window (no model loaded): each chat keeps its own draft,
the list's highlight follows the open chat, and the chat actions are on only where a chat is
highlighted for them (issue 34, item 5)."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")


def _chat_actions(w):
    return [w.rename_button, w.branch_button, w.delete_button, w.rename_action, w.branch_action,
            w.delete_action, w.pin_action, w.export_action]


def _highlighted(w):
    index = w.chat_list.currentIndex()
    return w.chat_model.chat_id(index.row()) if index.isValid() else None


def test_each_chat_keeps_its_own_draft(idle_window):
    w, nav = idle_window, idle_window.navigation
    first, second = w.store.create_chat("apples"), w.store.create_chat("pears")
    nav.refresh_chat_list()
    nav.open_chat(first)
    w.composer.edit.setPlainText("half a question about apples")
    nav.open_chat(second)
    assert w.composer.edit.toPlainText() == ""  # the draft stays with its chat
    w.composer.edit.setPlainText("pears?")
    nav.open_chat(first)
    assert w.composer.edit.toPlainText() == "half a question about apples"
    assert w.composer.edit.textCursor().atEnd()  # typing goes on where the draft ended
    nav.new_chat()
    assert w.session.current_chat_id is None and w.composer.edit.toPlainText() == ""
    nav.open_chat(second)
    assert w.composer.edit.toPlainText() == "pears?"
    assert w.settings.last_chat_id == second  # what the next start opens


def test_the_highlight_and_the_actions_follow_the_open_chat_through_a_search(idle_window):
    w, nav = idle_window, idle_window.navigation
    apples, pears = w.store.create_chat("apples"), w.store.create_chat("pears")
    nav.refresh_chat_list()
    nav.open_chat(apples)
    assert _highlighted(w) == apples and all(a.isEnabled() for a in _chat_actions(w))
    w.search.setText("pears")  # the open chat is not in the results
    assert [c.id for c in w.chat_model.chats] == [pears]
    # neither shown nor highlighted: Rename/Branch/Delete must not act on it, nor on "pears"
    assert _highlighted(w) is None and not w.chat_list.selectionModel().hasSelection()
    assert nav.selected_chat_id() == apples  # what the menus' actions would fall back to
    w.search.clear()
    assert _highlighted(w) == apples and all(a.isEnabled() for a in _chat_actions(w))
    nav.new_chat()
    assert _highlighted(w) is None and not any(a.isEnabled() for a in _chat_actions(w))


def test_clicking_a_chat_in_the_list_opens_it_and_the_pin_action_says_what_it_will_do(idle_window):
    w, nav = idle_window, idle_window.navigation
    plain, pinned = w.store.create_chat("plain"), w.store.create_chat("pinned")
    w.store.set_pinned(pinned, True)
    nav.refresh_chat_list()
    nav.open_chat(plain)
    assert w.pin_action.text() == "&Pin"
    w.chat_list.setCurrentIndex(w.chat_model.index(w.chat_model.row_of(pinned)))  # as a click does
    assert w.session.current_chat_id == pinned and w.pin_action.text() == "Un&pin"


def test_the_list_shows_which_chat_is_writing(idle_window):
    w, nav = idle_window, idle_window.navigation
    chat = w.store.create_chat("busy")

    class Pending:  # what ChatSession.pending holds while a reply is written (only its chat is read)
        chat_id = chat

    w.session.pending = Pending()
    try:
        nav.refresh_chat_list()
        assert w.chat_model.writing_id == chat
        assert w.chat_model.data(w.chat_model.index(w.chat_model.row_of(chat))) == "busy  · writing…"
    finally:
        w.session.pending = None
    nav.refresh_chat_list()
    assert w.chat_model.writing_id is None
