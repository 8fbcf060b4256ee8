"""app/store/rows.py: database rows -> row types, row types -> engine input, and the checks on
what callers hand the store (no Store: rows are real sqlite3.Row objects of an in-memory query)."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tramontane.app.store.errors import StoreError
from tramontane.app.store.rows import (Message, StoredImage, chat_columns, chat_info, check_role_and_state,
                                       message, split_parts, stat_values, thought_parts, to_chat_message,
                                       tool_data)
from tramontane.engine.api import ChatMessage, DocumentPart, GenerationStats, ImagePart, ThinkPart, ToolCall


def row(**columns) -> sqlite3.Row:
    """One sqlite3.Row with these columns, as the store's queries hand them to rows.py."""
    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    names = list(columns)
    got = db.execute("SELECT " + ", ".join(f"? AS {n}" for n in names), [columns[n] for n in names]).fetchone()
    db.close()
    return got


def stored(sha: str, ext: str, offset: int, name: str = "") -> StoredImage:
    return StoredImage(sha, ext, name or f"{sha}.{ext}", offset, Path("/nowhere") / f"{sha}.{ext}")


def msg(role: str = "user", text: str = "", **over) -> Message:
    fields = dict(id=1, chat_id=1, position=0, role=role, text=text, state="complete", finish_reason=None,
                  prompt_tokens=0, generated_tokens=0, reused_tokens=0, ttft_s=None, prefill_tok_s=None,
                  decode_tok_s=None, created_at=0.0)
    fields.update(over)
    return Message(**fields)


def fake_bytes(sha: str, ext: str) -> bytes:
    return f"{sha}|{ext}".encode()


# --------------------------------------------------------------------------- rows -> objects


def test_chat_info_decodes_settings_and_pinned():
    info = chat_info(row(id=7, title="T", created_at=1.5, updated_at=2.5, model_path="/m.gguf",
                         projector_path=None, remote_url="http://h:1/v1", remote_model="served",
                         system_prompt="be brief", settings_json='{"temperature": 0.2}', pinned=1,
                         message_count=3))
    assert (info.id, info.title, info.created_at, info.updated_at) == (7, "T", 1.5, 2.5)
    assert (info.model_path, info.projector_path) == ("/m.gguf", None)
    assert (info.remote_url, info.remote_model) == ("http://h:1/v1", "served")
    assert info.system_prompt == "be brief"
    assert info.settings == {"temperature": 0.2}
    assert info.pinned is True and info.message_count == 3
    unpinned = chat_info(row(id=8, title="", created_at=0, updated_at=0, model_path=None, projector_path=None,
                             remote_url=None, remote_model=None, system_prompt="", settings_json="{}",
                             pinned=0, message_count=0))
    assert unpinned.pinned is False and unpinned.settings == {}


def message_row(**over) -> sqlite3.Row:
    columns = dict(id=4, chat_id=2, position=1, role="assistant", text="answer", state="interrupted",
                   finish_reason="length", prompt_tokens=10, generated_tokens=5, reused_tokens=3, ttft_s=0.25,
                   prefill_tok_s=40.0, decode_tok_s=12.5, created_at=9.0, tool_json=None, reasoning="",
                   reasoning_s=None, reasoning_open=0)
    columns.update(over)
    return row(**columns)


def test_message_splits_attachments_into_images_and_documents_keeping_their_order():
    attached = [stored("a", "png", 0), stored("d1", "doc.pdf", 2), stored("b", "jpg", 4),
                stored("d2", "doc.txt", 5)]
    m = message(message_row(), attached)
    assert [i.sha256 for i in m.images] == ["a", "b"]
    assert [d.sha256 for d in m.documents] == ["d1", "d2"]
    assert (m.id, m.chat_id, m.position, m.role, m.text) == (4, 2, 1, "assistant", "answer")
    assert (m.state, m.finish_reason) == ("interrupted", "length")
    assert (m.prompt_tokens, m.generated_tokens, m.reused_tokens) == (10, 5, 3)
    assert (m.ttft_s, m.prefill_tok_s, m.decode_tok_s, m.created_at) == (0.25, 40.0, 12.5, 9.0)
    assert m.tool is None and m.reasoning == "" and m.reasoning_open is False


def test_message_reads_its_tool_card_and_thought():
    card = {"call_id": "c1", "name": "clock", "status": "done"}
    m = message(message_row(role="tool", tool_json=json.dumps(card), reasoning="hm", reasoning_s=1.5,
                            reasoning_open=1), [])
    assert m.tool == card
    assert (m.reasoning, m.reasoning_s, m.reasoning_open) == ("hm", 1.5, True)


@pytest.mark.parametrize("raw", [None, "", "{not json", "[1, 2]", '"text"', "3"])
def test_tool_data_that_is_absent_or_not_an_object_is_none(raw):
    assert tool_data(raw) is None


def test_tool_data_reads_an_object():
    assert tool_data('{"calls": [{"id": "x"}]}') == {"calls": [{"id": "x"}]}


# --------------------------------------------------------------------------- objects -> engine input


def test_thought_parts_only_for_an_assistant_with_a_thought():
    assert thought_parts(msg("assistant", "a", reasoning="why", reasoning_open=False)) == [ThinkPart("why", True)]
    assert thought_parts(msg("assistant", "a", reasoning="cut", reasoning_open=True)) == [ThinkPart("cut", False)]
    assert thought_parts(msg("assistant", "a")) == []
    assert thought_parts(msg("user", "a", reasoning="not a reply's")) == []


def test_plain_message_is_its_text():
    assert to_chat_message(msg("user", "hello"), fake_bytes) == ChatMessage("user", ["hello"])
    assert to_chat_message(msg("system", ""), fake_bytes) == ChatMessage("system", [""])


def test_attachments_sit_at_their_offsets_in_the_text():
    # listed out of order; one offset past the text's end (it goes last), one before a previous one
    m = msg("user", "abcdef", attachments=[stored("late", "png", 99), stored("first", "png", 0),
                                           stored("doc", "doc.pdf", 3, name="paper.pdf")])
    parts = to_chat_message(m, fake_bytes).parts
    assert parts == [ImagePart(b"first|png", "first.png"), "abc", DocumentPart(b"doc|doc.pdf", "paper.pdf"),
                     "def", ImagePart(b"late|png", "late.png")]
    assert isinstance(parts[2], DocumentPart) and isinstance(parts[0], ImagePart)
    # offsets a damaged row may hold: below zero is the start, past the end the end (no empty text)
    odd = msg("user", "xy", attachments=[stored("neg", "png", -1), stored("p1", "png", 50), stored("p2", "png", 60)])
    assert [p if isinstance(p, str) else p.name for p in to_chat_message(odd, fake_bytes).parts] == \
        ["neg.png", "xy", "p1.png", "p2.png"]


def test_split_parts_then_to_chat_message_gives_the_parts_back():
    image, doc = ImagePart(b"\x89PNG", "cat.png"), DocumentPart(b"%PDF", "a.pdf")
    parts = ["look ", image, "at ", "this", doc, " please", image]
    text, attached = split_parts(parts)
    assert text == "look at this please"
    assert [(p, offset) for p, offset in attached] == [(image, 5), (doc, 12), (image, 19)]
    blobs = {}
    rows = []
    for i, (part, offset) in enumerate(attached):
        ext = "doc.pdf" if isinstance(part, DocumentPart) else "png"
        blobs[(f"s{i}", ext)] = part.data
        rows.append(stored(f"s{i}", ext, offset, name=part.name))
    m = msg("user", text, attachments=rows)
    back = to_chat_message(m, lambda sha, ext: blobs[(sha, ext)]).parts
    # adjacent text parts merge ("at this"); everything else comes back in place
    assert back == ["look ", image, "at this", doc, " please", image]


def test_a_document_before_an_image_at_one_offset_keeps_its_place():
    m = message(message_row(role="user", text="ab"), [stored("d", "doc.pdf", 1), stored("i", "png", 1)])
    kinds = [type(p) for p in to_chat_message(m, fake_bytes).parts]
    assert kinds == [str, DocumentPart, ImagePart, str]
    # and the other way round: the order is the message's, not images first
    m = message(message_row(role="user", text="ab"), [stored("i", "png", 1), stored("d", "doc.pdf", 1)])
    assert [type(p) for p in to_chat_message(m, fake_bytes).parts] == [str, ImagePart, DocumentPart, str]
    assert [a.sha256 for a in m.images] == ["i"] and [a.sha256 for a in m.documents] == ["d"]


def test_split_parts_refuses_a_part_it_cannot_store():
    with pytest.raises(StoreError, match="ThinkPart"):
        split_parts(["a", ThinkPart("no")])


def test_assistant_tool_calls_come_back_with_the_thought_first():
    calls = {"calls": [{"id": "c1", "name": "clock", "arguments": '{"tz": "UTC"}'}, "junk", {"name": "bare"}]}
    m = msg("assistant", "", tool=calls, reasoning="need the time")
    got = to_chat_message(m, fake_bytes)
    assert got.role == "assistant"
    assert got.parts == [ThinkPart("need the time", True)]  # no empty text part
    assert got.tool_calls == [ToolCall("c1", "clock", '{"tz": "UTC"}'), ToolCall("", "bare", "{}")]
    with_text = to_chat_message(msg("assistant", "checking", tool=calls), fake_bytes)
    assert with_text.parts == ["checking"] and len(with_text.tool_calls) == 2


def test_a_reply_with_a_thought_and_no_calls():
    got = to_chat_message(msg("assistant", "42", reasoning="sum", reasoning_open=True), fake_bytes)
    assert got == ChatMessage("assistant", [ThinkPart("sum", False), "42"])
    assert to_chat_message(msg("assistant", "", reasoning="only"), fake_bytes).parts == [ThinkPart("only", True)]


def test_a_tool_message_answers_its_call():
    got = to_chat_message(msg("tool", "12:00", tool={"call_id": "c1", "name": "clock"}), fake_bytes)
    assert got == ChatMessage("tool", ["12:00"], tool_call_id="c1")
    assert to_chat_message(msg("tool", "x", tool={"call_id": ""}), fake_bytes).tool_call_id is None
    assert to_chat_message(msg("tool", "x"), fake_bytes).tool_call_id is None


# --------------------------------------------------------------------------- objects -> rows


def test_stat_values_in_insert_order_with_unmeasured_times_as_null():
    stats = GenerationStats(prompt_tokens=11, reused_tokens=4, generated_tokens=7, ttft_s=0.5,
                            prefill_tok_s=0.0, decode_tok_s=20.0)
    assert stat_values(stats) == (11, 7, 4, 0.5, None, 20.0)
    assert stat_values(GenerationStats()) == (0, 0, 0, None, None, None)


def test_chat_columns_converts_each_field():
    values = chat_columns({"title": "T", "settings": {"b": 1, "a": [2]}, "pinned": "yes", "model_path": Path("/m"),
                           "remote_url": None, "created_at": 3, "system_prompt": ""})
    assert values == {"title": "T", "settings_json": '{"a": [2], "b": 1}', "pinned": 1, "model_path": "/m",
                      "remote_url": None, "created_at": 3.0, "system_prompt": ""}
    assert isinstance(values["created_at"], float)
    assert chat_columns({"pinned": 0}) == {"pinned": 0}


@pytest.mark.parametrize(("fields", "says"), [
    ({"colour": "red"}, "chat field 'colour': unknown"),
    ({"settings": [1]}, "chat field 'settings': expected a dict, got list"),
    ({"settings": {"x": object()}}, "chat field 'settings': not JSON-serialisable"),
    ({"title": 5}, "chat field 'title': expected text, got int"),
    ({"system_prompt": None}, "chat field 'system_prompt': expected text, got NoneType"),
])
def test_chat_columns_refuses_with_the_field_named(fields, says):
    with pytest.raises(StoreError) as caught:
        chat_columns(fields)
    assert says in str(caught.value)


def test_check_role_and_state():
    for role in ("system", "user", "assistant", "tool"):
        check_role_and_state(role, "complete")
    check_role_and_state("assistant", "streaming")
    check_role_and_state("assistant", "interrupted")
    with pytest.raises(StoreError, match=r"^message role 'bot': expected one of system, user, assistant, tool$"):
        check_role_and_state("bot", "complete")
    with pytest.raises(StoreError, match=r"^messages\[3\]\.state 'done': expected one of"):
        check_role_and_state("user", "done", where="messages[3].")


def test_a_stored_document_is_told_by_its_ext():
    assert stored("x", "doc.pdf", 0).is_document
    assert not stored("x", "png", 0).is_document
    assert not stored("x", "pdf", 0).is_document  # a document's ext carries the prefix
