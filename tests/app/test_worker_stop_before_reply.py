"""Issue 35, item 10: Stop while the prompt was still being read left an empty "stopped" reply
in the chat (saved, shown, and given to the model as an empty turn). Now the reply row is
dropped (app/worker.py): the user's message stays, with nothing under it."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, Slot  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

LONG = "Tell me everything about the winds that blow over the south of France, one by one. " * 12


class StopWhileReading(QObject):
    """Presses Stop at the first sign of the prompt being read (before any word)."""

    def __init__(self, window):
        super().__init__()
        self.window = window
        self.pressed = 0
        window.session.promptRead.connect(self.on_read)

    @Slot(int, int)
    def on_read(self, read, total):
        if not self.pressed and self.window.session.pending is not None and not self.window.session.pending.text:
            self.pressed += 1
            self.window.composer.stop_button.click()


def test_stop_while_the_prompt_is_read_keeps_no_empty_reply(qtbot, window, monkeypatch):
    from tramontane.engine.runtime.local import LocalEngine

    real_chat = LocalEngine.chat

    def reading_slowly(self, messages, params, *args, on_prompt_progress=None, cancel=None, **kwargs):
        """The tiny model reads a prompt in milliseconds: here its reading waits at the first
        chunk until the user has pressed Stop (as a long prompt on a CPU gives them time to)."""
        def progress(read, total):
            on_prompt_progress(read, total)
            if read == 0:
                cancel.wait(10)
        return real_chat(self, messages, params, *args, on_prompt_progress=progress, cancel=cancel, **kwargs)

    monkeypatch.setattr(LocalEngine, "chat", reading_slowly)
    monkeypatch.setattr(window.worker.engine.model, "prefill_chunk", 32)  # the prompt in several chunks
    window.session.param_overrides["max_tokens"] = 8
    stopper = StopWhileReading(window)
    window.composer.edit.setPlainText(LONG)
    with qtbot.waitSignal(window.replyFinished, timeout=60000):
        window.composer.send_button.click()
    assert stopper.pressed == 1
    chat_id = window.session.current_chat_id
    qtbot.waitUntil(lambda: window.session.pending is None)
    messages = window.store.get_chat(chat_id).messages
    assert [m.role for m in messages] == ["user"], [(m.role, m.finish_reason, m.generated_tokens) for m in messages]
    assert messages[0].text == LONG
    assert [w.message.role for w in window.view.widgets] == ["user"]
    assert window.composer.send_button.isEnabled()

