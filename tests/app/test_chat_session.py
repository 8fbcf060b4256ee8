"""ChatSession, through the real window on the tiny model: every store write a reply makes
(message, reply row, checkpoints, final text, what is left after a failure) happens on the
engine worker's thread, never on the UI thread."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from support.app_window import MMPROJ, MODEL, close_window, make_window, send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

WRITES = ("create_chat", "add_message", "begin_reply", "checkpoint_reply", "finish_reply",
          "delete_message", "truncate_after", "edit_message", "edit_as_version", "abandon_reply",
          "regenerate_reply")


def record_writes(store, monkeypatch) -> list[tuple[str, str]]:
    """(store method, thread name) for every reply write the store is asked for."""
    calls: list[tuple[str, str]] = []
    for name in WRITES:
        original = getattr(store, name)

        def wrapped(*args, _name=name, _original=original, **kwargs):
            calls.append((_name, threading.current_thread().name))
            return _original(*args, **kwargs)

        monkeypatch.setattr(store, name, wrapped)
    return calls


def test_reply_writes_happen_on_the_worker(qtbot, window, monkeypatch):
    calls = record_writes(window.store, monkeypatch)
    ui = threading.current_thread().name
    send(qtbot, window, "Hello")
    send(qtbot, window, "And again")
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        window.replies.regenerate()
    user = next(m.id for m in window.store.get_chat(window.session.current_chat_id).messages if m.role == "user")
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        window.replies.edit_and_resend(user, "Hello there")
    names = {name for name, _ in calls}
    assert {"create_chat", "add_message", "begin_reply", "checkpoint_reply", "finish_reply",
            "edit_as_version"} <= names
    on_ui = [(name, thread) for name, thread in calls if thread == ui]
    assert on_ui == [], on_ui
    # What was written is what was shown, and complete.
    last = window.store.get_chat(window.session.current_chat_id).messages[-1]
    assert last.state == "complete" and last.text == window.view.widgets[-1].text


def test_failed_reply_is_saved_on_the_worker(qtbot, tmp_path, monkeypatch):
    """A failure after the reply row exists: the worker drops the empty reply and the UI only
    shows the message."""
    window = make_window(qtbot, tmp_path / "data")
    try:
        window.settings.context_length = 32
        window.model_loading.load_model(str(MODEL), str(MMPROJ))
        qtbot.waitUntil(lambda: window.session.engine_info is not None and window.session.engine_info.context_size == 32,
                        timeout=30000)
        calls = record_writes(window.store, monkeypatch)
        window.composer.edit.setPlainText("word " * 60)
        with qtbot.waitSignal(window.replyFailed, timeout=30000):
            window.composer.submit()
        assert ("abandon_reply", threading.current_thread().name) not in calls
        assert any(name == "abandon_reply" for name, _ in calls)  # the empty reply goes
        assert [m.role for m in window.store.get_chat(window.session.current_chat_id).messages] == ["user"]
        assert "context length" in window.session.notices[window.session.current_chat_id]
    finally:
        close_window(window)


def test_drafts_stay_with_their_chat_across_restarts(qtbot, tmp_path):
    data = tmp_path / "data"
    window = make_window(qtbot, data)
    try:
        send(qtbot, window, "First chat")
        first = window.session.current_chat_id
        window.navigation.new_chat()
        send(qtbot, window, "Second chat")
        second = window.session.current_chat_id
        window.composer.edit.setPlainText("half-typed for the second")
        window.navigation.open_chat(first)
        assert window.composer.edit.toPlainText() == ""
        window.composer.edit.setPlainText("half-typed for the first")
        window.navigation.open_chat(second)
        assert window.composer.edit.toPlainText() == "half-typed for the second"
        window.navigation.new_chat()
        assert window.composer.edit.toPlainText() == ""
        window.navigation.open_chat(first)
    finally:
        close_window(window)
    window = make_window(qtbot, data, load=False)  # restarted on the last chat
    try:
        assert window.session.current_chat_id == first
        assert window.composer.edit.toPlainText() == "half-typed for the first"
        window.navigation.open_chat(second)
        assert window.composer.edit.toPlainText() == "half-typed for the second"
        window.chats.delete_chat(second)  # a deleted chat's draft goes with it (once Undo is over)
        window.chats.commit_deletes()
        assert window.store.get_setting(f"draft.{second}") is None
    finally:
        close_window(window)


def test_a_long_first_message_titles_the_chat_cut_at_a_word_with_an_ellipsis(qtbot, window):
    """The README's screenshot showed "… how would I measure how warm it": the first line cut at
    60 characters inside "its". The title ends at a whole word and says it was cut."""
    window.composer.edit.setPlainText("What is in this picture? And how would I measure how warm "
                                      "its colours are?\nMore")
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        window.composer.submit()
    title = window.store.get_chat_info(window.session.current_chat_id).title
    assert title == "What is in this picture? And how would I measure how warm…"
    assert len(title) <= 60 and window.windowTitle() == f"{title} — Tramontane"


@pytest.mark.parametrize("text, title", [
    ("  Short question?  \nsecond line", "Short question?"),
    ("", "Image chat"),
    ("x" * 61, "x" * 59 + "…"),  # one long word (a link) is cut inside it
    ("a" * 58 + " bb", "a" * 58 + "…"),
    ("word, " * 12, "word, word, word, word, word, word, word, word, word, word…"),
    ("y" * 60, "y" * 60),  # exactly the limit: whole
])
def test_chat_title(text, title):
    from tramontane.app.chat_session import chat_title

    assert chat_title(text) == title
