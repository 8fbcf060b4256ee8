"""Messages: in order with their numbers, edited, cut short, their images read back."""
from __future__ import annotations

import pytest

from tramontane.app.store import NotFoundError, StoreError
from tramontane.engine.api import GenerationStats, ImagePart
from support.store_data import PNG, conversation, image_files


def test_messages_in_order_with_stats(store):
    chat = store.create_chat()
    ids = [store.add_message(chat, role, f"{role} says {i}") for i, role in
           enumerate(["system", "user", "assistant", "user", "tool"])]
    stats = GenerationStats(prompt_tokens=11, reused_tokens=7, generated_tokens=5, ttft_s=0.25,
                            prefill_tok_s=300.0, decode_tok_s=20.5, finish_reason="length")
    ids.append(store.add_message(chat, "assistant", "long", stats=stats, finish_reason="length"))
    got = store.get_chat(chat).messages
    assert [m.id for m in got] == ids
    assert [m.position for m in got] == list(range(6))
    assert [m.role for m in got] == ["system", "user", "assistant", "user", "tool", "assistant"]
    last = got[-1]
    assert (last.prompt_tokens, last.reused_tokens, last.generated_tokens) == (11, 7, 5)
    assert (last.ttft_s, last.prefill_tok_s, last.decode_tok_s, last.finish_reason) == (0.25, 300.0, 20.5, "length")
    with pytest.raises(StoreError, match="role 'robot'"):
        store.add_message(chat, "robot", "hi")


def test_edit_and_truncate_for_resend_and_regenerate(store):
    chat = store.create_chat()
    ids = conversation(store, chat, 3)
    assert len(image_files(store)) == 3
    # regenerate the last answer: drop it, keep its question
    assert store.truncate_after(ids[4]) == 1
    assert [m.id for m in store.get_chat(chat).messages] == ids[:5]
    # edit-and-resend the second question
    store.edit_message(ids[2], "question 1, edited")
    assert store.truncate_after(ids[2]) == 2
    msgs = store.get_chat(chat).messages
    assert [m.text for m in msgs] == ["question 0", "answer 0", "question 1, edited"]
    assert len(image_files(store)) == 2  # the third question's image went with it
    new_reply = store.add_message(chat, "assistant", "answer 1 again")
    assert store.get_message(new_reply).position == 3
    assert store.truncate_after(ids[0], inclusive=True) == 4
    assert store.get_chat(chat).messages == [] and image_files(store) == set()
    streaming = store.begin_reply(chat)
    with pytest.raises(StoreError, match="still streaming"):
        store.edit_message(streaming, "no")
    with pytest.raises(NotFoundError):
        store.truncate_after(10_000)


def test_missing_image_file_is_a_clear_error(store):
    chat = store.create_chat()
    mid = store.add_message(chat, "user", "x", [ImagePart(PNG, "p.png")])
    path = store.get_message(mid).images[0].path
    path.unlink()
    with pytest.raises(StoreError, match=str(path.name)):
        store.engine_messages(chat)
