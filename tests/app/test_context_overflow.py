"""Issue 35: what a chat does when it outgrows the context, chosen per chat in Chat settings
(LM Studio's choice): stop with a sentence (as before), leave out the oldest turns, or keep the
first turn and the latest ones. The fit is the engine's own rule (prompts.check_fits), on the
real window and the tiny model (a context of 512); the choice survives a restart."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QDialog  # noqa: E402

from support.app_window import close_window, make_window, send  # noqa: E402
from tramontane.app.worker import fit_overflow, turns  # noqa: E402
from tramontane.engine.api import ChatMessage, EngineError  # noqa: E402
from tramontane.engine.runtime.prompts import check_fits  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")
TURNS = 10


def long_chat(window) -> int:
    """A stored chat of TURNS question/answer turns, together well over the context."""
    chat = window.store.create_chat("Long", system_prompt="Be brief.")
    for i in range(TURNS):
        window.store.add_message(chat, "user", f"question {i}: " + "tell me more about it " * 8)
        window.store.add_message(chat, "assistant", f"answer {i}: " + "here is some more of it " * 8)
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat)
    return chat


class Prompts:
    """The messages each reply is generated from (the engine's chat, called on the worker)."""

    def __init__(self, engine):
        self.seen: list[list[ChatMessage]] = []
        original = engine.chat

        def chat(messages, *args, **kwargs):
            self.seen.append(list(messages))
            return original(messages, *args, **kwargs)

        engine.chat = chat


def fits(engine, messages, max_tokens) -> bool:
    try:
        check_fits(engine.count_tokens(messages), max_tokens, engine.context_size)
    except EngineError:
        return False
    return True


def test_fit_overflow_leaves_out_the_fewest_turns(window):
    engine = window.worker.engine
    messages = [ChatMessage("system", "Be brief.")]
    for i in range(TURNS):
        messages += [ChatMessage("user", f"question {i}: " + "tell me more about it " * 8),
                     ChatMessage("assistant", f"answer {i}: " + "here is some more of it " * 8)]
    messages.append(ChatMessage("user", "And the last question?"))
    assert not fits(engine, messages, 12)
    assert fit_overflow(engine, messages, 12, "stop") == (messages, 0)
    _system, chat_turns = turns(messages)
    for policy in ("drop_oldest", "keep_first"):
        kept, left_out = fit_overflow(engine, messages, 12, policy)
        assert 0 < left_out < TURNS and fits(engine, kept, 12)
        assert kept[0].role == "system" and kept[-1].text_content == "And the last question?"
        first = [m.text_content for m in chat_turns[0]]
        assert ([m.text_content for m in kept[1:3]] == first) == (policy == "keep_first")
        # the fewest: one turn fewer left out does not fit
        head = chat_turns[:1] if policy == "keep_first" else []
        middle = chat_turns[1:-1] if policy == "keep_first" else chat_turns[:-1]
        one_more = messages[:1] + [m for t in head + middle[left_out - 1:] + chat_turns[-1:] for m in t]
        assert not fits(engine, one_more, 12)
    assert fit_overflow(engine, messages[:3], 12, "drop_oldest") == (messages[:3], 0)  # fits: unchanged


def test_the_chats_choice_is_used_and_survives_a_restart(qtbot, window, tmp_path, monkeypatch):
    chat = long_chat(window)
    prompts = Prompts(window.worker.engine)
    with qtbot.waitSignal(window.replyFailed, timeout=30000) as failed:  # stop, as chats always did
        window.composer.edit.setPlainText("And now?")
        window.composer.send_button.click()
    assert "more than the model's context" in failed.args[0]
    qtbot.waitUntil(lambda: window.session.pending is None, timeout=10000)

    window.session.set_chat_overflow(chat, "keep_first")
    reply = send(qtbot, window, "And now, briefly?")
    assert window.store.get_message(reply).state == "complete"
    prompt = prompts.seen[-1]
    assert prompt[0].role == "system" and prompt[1].text_content.startswith("question 0:")
    assert prompt[-1].text_content == "And now, briefly?"
    assert not any(m.text_content.startswith("question 1:") for m in prompt)  # left out
    assert fits(window.worker.engine, prompt, 12)
    assert "left out of this reply's prompt" in window.statusBar().currentMessage()
    # the chat itself keeps every message
    assert sum(m.role == "user" for m in window.store.engine_messages(chat)) == TURNS + 2

    close_window(window)
    again = make_window(qtbot, tmp_path / "data", load=False)
    try:
        assert again.session.chat_overflow(chat) == "keep_first"
        again.navigation.open_chat(chat)
        shown = []

        def exec_(dialog):
            shown.append(dialog.overflow_choice())
            return QDialog.DialogCode.Rejected

        from tramontane.app.dialogs.chat_settings import ChatSettingsDialog
        monkeypatch.setattr(ChatSettingsDialog, "exec", exec_)
        again.chats.edit_chat_settings()
        assert shown == ["keep_first"]
    finally:
        close_window(again)


def test_the_choice_made_for_a_new_chat_is_saved_with_it(qtbot, window, monkeypatch):
    from tramontane.app.dialogs.chat_settings import ChatSettingsDialog

    window.navigation.new_chat()

    def exec_(dialog):
        dialog.overflow.setCurrentIndex(dialog.overflow.findData("drop_oldest"))
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(ChatSettingsDialog, "exec", exec_)
    window.chats.edit_chat_settings()
    send(qtbot, window, "Hello")
    chat = window.session.current_chat_id
    assert window.session.chat_overflow(chat) == "drop_oldest"
    assert window.store.get_chat_info(chat).settings.get("overflow") == "drop_oldest"
