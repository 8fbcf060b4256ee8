"""Tool calls and their cards in the store (schema v5): read back as engine messages, copied
by a branch, carried by the JSON export and shown in the Markdown one."""
from __future__ import annotations

import json

from tramontane.app.store import Store
from tramontane.app.store.export import chat_to_json, chat_to_markdown, export_json, import_json
from tramontane.engine.api import ChatMessage, ToolCall

CALL = {"id": "abcDEF123", "name": "add", "arguments": '{"a": 2, "b": 3}'}
CARD = {"call_id": "abcDEF123", "name": "add", "arguments": '{"a": 2, "b": 3}', "status": "allowed once",
        "error": None, "elapsed_s": 0.25}


def _tool_chat(store: Store) -> int:
    chat = store.create_chat("tools")
    store.add_message(chat, "user", "what is 2 + 3?")
    reply = store.begin_reply(chat)
    store.finish_reply(reply, "")
    store.set_tool(reply, {"calls": [CALL]})
    store.add_tool_message(chat, "5", CARD)
    store.add_message(chat, "assistant", "It is 5.")
    return chat


def test_tool_rows_become_engine_messages_with_calls_and_ids(tmp_path):
    with Store(tmp_path / "d") as store:
        chat = _tool_chat(store)
        got = store.engine_messages(chat)
    assert got == [ChatMessage("user", ["what is 2 + 3?"]),
                   ChatMessage("assistant", [], tool_calls=[ToolCall("abcDEF123", "add", '{"a": 2, "b": 3}')]),
                   ChatMessage("tool", ["5"], tool_call_id="abcDEF123"),
                   ChatMessage("assistant", ["It is 5."])]


def test_update_card_and_branch_copies_the_cards(tmp_path):
    with Store(tmp_path / "d") as store:
        chat = _tool_chat(store)
        tool_id = store.get_chat(chat).messages[2].id
        store.update_tool_message(tool_id, "6", {**CARD, "status": "denied"})
        copy = store.branch_chat(chat)
        messages = store.get_chat(copy).messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1].tool == {"calls": [CALL]}
    assert messages[2].tool == {**CARD, "status": "denied"} and messages[2].text == "6"
    assert messages[3].tool is None


def test_json_export_round_trip_and_markdown(tmp_path):
    with Store(tmp_path / "d") as store:
        chat = _tool_chat(store)
        path = export_json(store, chat, tmp_path / "c.json")
        assert json.loads(path.read_text())["messages"][2]["tool"] == CARD
        back = store.get_chat(import_json(store, path))
        assert [m.tool for m in back.messages] == [None, {"calls": [CALL]}, CARD, None]
        assert chat_to_json(store, back.id)["messages"] == chat_to_json(store, chat)["messages"]
        text = chat_to_markdown(store.get_chat(chat), "images")
    assert "*Called `add`*" in text
    assert "## Tool: add" in text and '{"a": 2, "b": 3}' in text and "allowed once · 0.25 s" in text


def test_a_card_left_waiting_or_running_by_a_crash_is_stopped_on_open(tmp_path):
    with Store(tmp_path / "d") as store:
        chat = store.create_chat("c")
        waiting = store.add_tool_message(chat, "not run", {**CARD, "status": "waiting"})
        running = store.add_tool_message(chat, "not run", {**CARD, "status": "running"})
        done = store.add_tool_message(chat, "5", CARD)
    with Store(tmp_path / "d") as store:
        got = {m.id: m.tool["status"] for m in store.get_chat(chat).messages}
    assert got == {waiting: "stopped", running: "stopped", done: "allowed once"}
