"""A reasoning model in the real window (issue 36, item 3): the tiny model made to think (its
vocabulary with [THINK] / [/THINK], its replies scripted by the test-only logits hook) streams
its thought into the block above the answer, which folds once the answer begins; the answer
bubble holds the answer alone; the thought is stored apart (a restart shows it again), copied,
exported, branched, regenerated with its versions, and sent back in the next turn as the v13
format's think chunk; Stop while thinking keeps what was thought; the chat's reasoning switch
is stored in its settings and says what it can do for this format."""
from __future__ import annotations

import json
import threading

import pytest
from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QGuiApplication

from tramontane.app.reasoning import NO_SWITCH_NOTE, REASONING_KEY
from tramontane.app.store.export import export_json, export_markdown, import_json
from tramontane.engine.api import ChatMessage, ThinkPart
from tramontane.engine.mistral3.chat_format import encode_chat
from tramontane.engine.mistral3.tokenizer import Tokenizer

from support.app_window import GREEDY, MODEL, PieceCounter, close_window, make_window, send
from support.scripted import ScriptedLogits, script_logits
from support.thinking import thinking_tokenizer

THOUGHT, ANSWER = "Two and two make four.", "Four."
WAIT_MS = 60000


@pytest.fixture
def thinking_model(monkeypatch):
    """Every model the window loads reads the tiny file with the thinking vocabulary."""
    monkeypatch.setattr(Tokenizer, "from_gguf", classmethod(lambda cls, gf: thinking_tokenizer(MODEL)))


def thinking_window(qtbot, data_dir):
    w = make_window(qtbot, data_dir, mmproj=False)
    w.session.param_overrides = dict(GREEDY, max_tokens=120)
    return w


@pytest.fixture
def window(qtbot, tmp_path, isolated, thinking_model):
    w = thinking_window(qtbot, tmp_path / "data")
    yield w
    close_window(w)


def script(monkeypatch, window, thought: str, answer: str, *, close: bool = True) -> list[int]:
    """The model's next reply: [THINK] thought [/THINK] answer, then EOS; its ids."""
    tok = window.worker.engine.tokenizer
    start, end = tok.think_ids
    ids = [start, *tok.encode(thought), *([end, *tok.encode(answer)] if close else [])]
    script_logits(monkeypatch, ScriptedLogits(ids, tok.eos_id))
    return ids


def reply_widget(window):
    return window.view.widgets[-1]


def shown_reply(qtbot, window):
    """The last message's widget once Qt has shown it (a widget added to a shown page is shown
    a moment later)."""
    qtbot.waitUntil(lambda: reply_widget(window).isVisible(), timeout=WAIT_MS)
    return reply_widget(window)


def test_thought_streams_into_its_block_and_folds_when_the_answer_begins(qtbot, window, monkeypatch):
    assert window.session.engine_info.can_think and window.session.engine_info.chat_version == 13
    script(monkeypatch, window, THOUGHT, ANSWER)
    # the block as each piece reached the window (rendered at once here; the view's own timer
    # would group them); shown or hidden as set (a widget just added is shown by Qt a moment later)
    seen = []

    def look():
        window.view.flush()
        w = window.view.streaming
        if w is not None:
            seen.append((not w.thought.isHidden(), w.thought.expanded, w.thought.text, not w.body.isHidden(), w.text))

    thought_pieces = []
    window.worker.thoughtPiece.connect(lambda _rid, text: thought_pieces.append(text))
    counter = PieceCounter(window, then=look)
    window.session.thoughtStreamed.connect(lambda _text: look())
    reply_id = send(qtbot, window, "What is two and two?")

    assert "".join(thought_pieces) == THOUGHT and "".join(counter.pieces) == ANSWER  # apart, from the worker on
    thinking = [s for s in seen if not s[4]]
    assert thinking and all(visible and expanded and not body for visible, expanded, _, body, _ in thinking)
    assert thinking[-1][2] == THOUGHT
    answering = [s for s in seen if s[4]]
    assert answering and all(not expanded and body for _, expanded, _, body, _ in answering)

    w = shown_reply(qtbot, window)
    assert w.message.id == reply_id and w.thought.isVisible() and not w.thought.expanded
    assert w.thought.title.startswith("Thought for ") and w.body.markdown == ANSWER
    assert THOUGHT not in w.body.toPlainText()
    stored = window.store.get_message(reply_id)
    assert (stored.text, stored.reasoning, stored.reasoning_open) == (ANSWER, THOUGHT, False)
    assert stored.reasoning_s is not None and stored.reasoning_s >= 0

    window.resize(900, 640)
    qtbot.wait(100)
    assert window.grab().save("/tmp/reasoning_block_folded.png")
    qtbot.mouseClick(w.thought.toggle, Qt.MouseButton.LeftButton)  # open it
    assert w.thought.expanded and w.thought.body.isVisible() and w.thought.body.text() == THOUGHT
    w.thought.copy.click()
    assert QGuiApplication.clipboard().text() == THOUGHT
    w.buttons["copy"].click()  # the message's own Copy copies the answer
    assert QGuiApplication.clipboard().text() == ANSWER
    qtbot.wait(100)
    assert window.grab().save("/tmp/reasoning_block_open.png")
    qtbot.mouseClick(w.thought.toggle, Qt.MouseButton.LeftButton)
    assert not w.thought.expanded and not w.thought.body.isVisible()


def test_the_next_turn_sends_the_thought_back_as_a_think_chunk(qtbot, window, monkeypatch):
    script(monkeypatch, window, THOUGHT, ANSWER)
    send(qtbot, window, "What is two and two?")
    script(monkeypatch, window, "Again.", "Still four.")
    prompts = []
    window.worker.finished.connect(lambda _rid, result: prompts.append(result.prompt_token_ids))
    send(qtbot, window, "Sure?")
    qtbot.waitUntil(lambda: bool(prompts), timeout=WAIT_MS)
    tok = window.worker.engine.tokenizer
    expected = encode_chat(tok, [ChatMessage.text("user", "What is two and two?"),
                                 ChatMessage("assistant", [ThinkPart(THOUGHT), ANSWER]),
                                 ChatMessage.text("user", "Sure?")]).ids
    assert prompts[-1] == expected
    start, end = tok.think_ids
    assert [start, *tok.encode(THOUGHT), end] == expected[expected.index(start):expected.index(end) + 1]


class GatedScript(ScriptedLogits):
    """The scripted reply, which waits at token `gate` until the test has pressed Stop (so the
    stop lands while the model thinks, however fast the machine)."""

    def __init__(self, ids, eos_id, gate: int):
        super().__init__(ids, eos_id)
        self.gate = gate
        self.stopped = threading.Event()

    def __call__(self, generated, logits):
        if len(generated) == self.gate:
            self.stopped.wait(30)
        return super().__call__(generated, logits)


class StopWhileThinking(QObject):
    """Presses Stop (on the UI thread, as a user does) once three pieces of thought have come."""

    def __init__(self, window, gated: GatedScript):
        super().__init__()
        self.window, self.gated, self.pieces = window, gated, []
        window.worker.thoughtPiece.connect(self.on_thought)

    @Slot(int, str)
    def on_thought(self, _rid: int, text: str) -> None:
        self.pieces.append(text)
        if len(self.pieces) == 3:
            self.window.composer.stop_button.click()
            self.gated.stopped.set()


def test_stop_while_thinking_keeps_the_thought(qtbot, window, monkeypatch):
    long_thought = " ".join(f"step {k}" for k in range(30))
    tok = window.worker.engine.tokenizer
    ids = [tok.think_ids[0], *tok.encode(long_thought), tok.think_ids[1], *tok.encode(ANSWER)]
    gated = GatedScript(ids, tok.eos_id, gate=8)
    script_logits(monkeypatch, gated)
    stopper = StopWhileThinking(window, gated)
    reply_id = send(qtbot, window, "Think long")
    assert len(stopper.pieces) >= 3
    stored = window.store.get_message(reply_id)
    assert stored.finish_reason == "cancelled" and stored.text == ""
    assert stored.reasoning and long_thought.startswith(stored.reasoning) and stored.reasoning != long_thought
    assert stored.reasoning_open  # cut before [/THINK]
    w = shown_reply(qtbot, window)
    assert w.thought.isVisible() and w.thought.title.endswith("(stopped)")
    assert not w.body.isVisible()  # no empty answer bubble under the thought
    assert "stopped" in w.status.text()
    tok = window.worker.engine.tokenizer
    messages = window.store.engine_messages(w.message.chat_id)
    assert messages[-1].parts == [ThinkPart(stored.reasoning, closed=False)]
    start, end = tok.think_ids
    ids = encode_chat(tok, messages + [ChatMessage.text("user", "go on")]).ids
    assert start in ids and end not in ids  # sent back as it was written: no [/THINK] it never wrote


def test_the_thought_survives_a_restart_and_goes_with_export_branch_and_versions(qtbot, tmp_path, isolated,
                                                                                monkeypatch, thinking_model):
    data = tmp_path / "data"
    w = thinking_window(qtbot, data)
    script(monkeypatch, w, THOUGHT, ANSWER)
    reply_id = send(qtbot, w, "What is two and two?")
    chat_id = w.session.current_chat_id
    script(monkeypatch, w, "Second look.", "Four again.")
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        w.replies.regenerate()
    versions = w.store.reply_versions(reply_id)
    assert [(v["text"], v["reasoning"]) for v in versions] == [(ANSWER, THOUGHT), ("Four again.", "Second look.")]
    w.session.show_version(reply_id, 0)  # back to the first: its thought with it
    assert w.store.get_message(reply_id).reasoning == THOUGHT
    close_window(w)

    again = thinking_window(qtbot, data)  # a restart
    try:
        again.navigation.open_chat(chat_id)
        qtbot.waitUntil(lambda: bool(again.view.widgets), timeout=WAIT_MS)
        block = shown_reply(qtbot, again).thought
        assert block.isVisible() and not block.expanded and block.text == THOUGHT
        assert block.title.startswith("Thought for ")

        branch = again.session.branch(chat_id)
        assert again.store.get_chat(branch).messages[-1].reasoning == THOUGHT

        md = export_markdown(again.store, chat_id, tmp_path / "chat.md").read_text("utf-8")
        assert "<details><summary>Thought for " in md and f"> {THOUGHT}" in md
        assert md.index(THOUGHT) < md.index(f"\n{ANSWER}\n")  # above the answer
        exported = export_json(again.store, chat_id, tmp_path / "chat.json")
        doc = json.loads(exported.read_text("utf-8"))
        assert doc["messages"][-1]["reasoning"]["text"] == THOUGHT
        assert [v["reasoning"]["text"] for v in doc["messages"][-1]["versions"]] == [THOUGHT, "Second look."]
        imported = import_json(again.store, exported)
        copy = again.store.get_chat(imported).messages[-1]
        assert (copy.reasoning, copy.text) == (THOUGHT, ANSWER)
        assert [v["reasoning"] for v in again.store.reply_versions(copy.id)] == [THOUGHT, "Second look."]
    finally:
        close_window(again)


def test_the_chat_reasoning_switch_is_stored_and_says_what_it_can_do(qtbot, window, monkeypatch):
    from tramontane.app.dialogs.chat_settings import ChatSettingsDialog

    script(monkeypatch, window, THOUGHT, ANSWER)
    send(qtbot, window, "hi")
    chat_id = window.session.current_chat_id
    seen = {}

    def answer(dialog_self):
        seen["shown"] = not dialog_self.reasoning.isHidden()
        seen["note"] = dialog_self.reasoning_note.text()
        dialog_self.reasoning.setChecked(False)
        return ChatSettingsDialog.DialogCode.Accepted

    monkeypatch.setattr(ChatSettingsDialog, "exec", answer)
    window.chats.edit_chat_settings()
    assert seen["shown"] and seen["note"] == NO_SWITCH_NOTE.format(version=13)
    assert window.store.get_chat_info(chat_id).settings.get(REASONING_KEY) is False
    assert window.session.chat_reasoning(chat_id) is False
    # off asks nothing of a v13 model (its format has no switch): the prompt is the same, and
    # what it thinks is still shown apart
    script(monkeypatch, window, "Still thinking.", "Hello.")
    prompts = []
    window.worker.finished.connect(lambda _rid, result: prompts.append(result.prompt_token_ids))
    send(qtbot, window, "again")
    qtbot.waitUntil(lambda: bool(prompts), timeout=WAIT_MS)
    assert prompts[-1] == encode_chat(window.worker.engine.tokenizer, window.store.engine_messages(chat_id)[:-1]).ids
    assert reply_widget(window).thought.text == "Still thinking."
