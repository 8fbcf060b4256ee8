"""A reply being generated: streamed, checkpointed, finished, from another thread."""
from __future__ import annotations

import threading

import pytest

from tramontane.app.store import Store, StoreError
from tramontane.engine.api import GenerationStats


def test_reply_streams_checkpoints_and_finishes(tmp_path):
    with Store(tmp_path, checkpoint_interval_s=3600) as s:
        chat = s.create_chat()
        s.add_message(chat, "user", "count")
        reply = s.begin_reply(chat)
        m = s.get_message(reply)
        assert (m.state, m.text, m.role, m.position) == ("streaming", "", "assistant", 1)
        assert s.checkpoint_reply(reply, "one")
        assert not s.checkpoint_reply(reply, "one two")  # within the interval: skipped
        assert s.get_message(reply).text == "one"
        assert s.checkpoint_reply(reply, "one two", force=True)
        assert s.get_message(reply).text == "one two"
        # the engine never sees the reply being generated
        assert [msg.role for msg in s.engine_messages(chat)] == ["user"]
        stats = GenerationStats(prompt_tokens=9, reused_tokens=4, generated_tokens=3, ttft_s=0.1,
                                decode_tok_s=12.0, finish_reason="stop")
        assert s.finish_reply(reply, "one two three", stats)
        m = s.get_message(reply)
        assert (m.state, m.text, m.finish_reason, m.reused_tokens) == ("complete", "one two three", "stop", 4)
        assert not s.checkpoint_reply(reply, "late", force=True)  # no longer streaming
        assert s.get_message(reply).text == "one two three"
        with pytest.raises(StoreError, match="not a streaming reply"):
            s.finish_reply(reply, "again")
        cancelled = s.begin_reply(chat)
        s.finish_reply(cancelled, "par", GenerationStats(), finish_reason="cancelled")
        assert s.get_message(cancelled).finish_reason == "cancelled"
        gone = s.begin_reply(chat)
        s.delete_message(gone)
        assert not s.checkpoint_reply(gone, "x", force=True)
        assert not s.finish_reply(gone, "x")


def test_checkpoints_from_a_worker_thread_while_reading(store):
    chat = store.create_chat()
    reply = store.begin_reply(chat)
    store.checkpoint_interval_s = 0
    full = "".join(chr(ord("a") + i % 26) for i in range(400))
    errors = []

    def worker():
        try:
            for i in range(1, len(full) + 1, 7):
                store.checkpoint_reply(reply, full[:i])
            store.finish_reply(reply, full)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    while thread.is_alive():
        text = store.get_chat(chat).messages[0].text
        assert full.startswith(text)
        store.list_chats()
    thread.join()
    assert not errors
    assert store.get_message(reply).text == full


def test_a_reply_keeps_its_thought_apart_from_its_answer(tmp_path):
    from tramontane.engine.api import ThinkPart

    with Store(tmp_path, checkpoint_interval_s=3600) as s:
        chat = s.create_chat()
        s.add_message(chat, "user", "two and two?")
        reply = s.begin_reply(chat)
        assert s.checkpoint_reply(reply, "", reasoning="Two and")  # thinking: no answer yet
        m = s.get_message(reply)
        assert (m.text, m.reasoning) == ("", "Two and")
        assert s.finish_reply(reply, "Four.", GenerationStats(finish_reason="stop"),
                              reasoning="Two and two.", reasoning_s=2.5)
        m = s.get_message(reply)
        assert (m.text, m.reasoning, m.reasoning_s, m.reasoning_open) == ("Four.", "Two and two.", 2.5, False)
        assert s.engine_messages(chat)[-1].parts == [ThinkPart("Two and two."), "Four."]  # think chunk first
        stopped = s.begin_reply(chat)
        s.finish_reply(stopped, "", finish_reason="cancelled", reasoning="Hm", reasoning_s=0.1, reasoning_open=True)
        assert s.engine_messages(chat)[-1].parts == [ThinkPart("Hm", closed=False)]
        plain = s.begin_reply(chat)
        s.finish_reply(plain, "ok", reasoning_s=3.0, reasoning_open=True)  # no thought: nothing of one kept
        m = s.get_message(plain)
        assert (m.reasoning, m.reasoning_s, m.reasoning_open) == ("", None, False)
        with pytest.raises(StoreError, match="reasoning must be text"):
            s.finish_reply(s.begin_reply(chat), "x", reasoning=None)
