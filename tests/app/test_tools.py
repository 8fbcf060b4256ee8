"""app/tools.py without a window: the tool servers setting (damaged entries skipped), a chat's
switches, and the stream filter that keeps a reply's tool calls out of its text."""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from tramontane.app.store import Store
from tramontane.app.tools import (SERVERS_KEY, allow_always, always_allowed, chat_tools_on, load_servers,
                                  save_servers, set_chat_tools, text_before_calls)
from tramontane.engine.mcp_tools import McpServerConfig


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "d") as s:
        yield s


def test_servers_round_trip_and_damaged_entries_are_skipped(store):
    good = McpServerConfig("time", command="mcp-server-time", timeout_s=5, disabled_tools=("convert_time",))
    web = McpServerConfig("web", url="http://127.0.0.1:9/mcp", enabled=False)
    save_servers(store, [good, web])
    assert load_servers(store) == [good, web]
    store.set_setting(SERVERS_KEY, [good.to_json(), {"name": "both", "command": "x", "url": "http://a"},
                                    {"command": "no name"}, "not an object", {"name": "ftp", "url": "ftp://x"}])
    assert load_servers(store) == [good]
    store.set_setting(SERVERS_KEY, {"not": "a list"})
    assert load_servers(store) == []


def test_a_chats_switches_keep_its_other_settings(store):
    chat = store.create_chat("c", settings={"temperature": 0.3})
    assert not chat_tools_on(store, chat) and not chat_tools_on(store, None)
    set_chat_tools(store, chat, True)
    allow_always(store, chat, "add")
    allow_always(store, chat, "add")
    assert chat_tools_on(store, chat) and always_allowed(store, chat) == {"add"}
    set_chat_tools(store, chat, False)
    assert store.get_chat_info(chat).settings == {"temperature": 0.3, "tools": False, "tools_always": ["add"]}


@pytest.mark.parametrize("pieces, shown", [
    (["Let me ", "check. [TOOL", "_CALLS][{\"name\"", ": 1}]"], ["Let me ", "check. "]),
    (["[TOOL_CALLS]", "[{", "}]"], []),
    (["plain ", "text [x]"], ["plain ", "text [x]"]),
    (["a [T", "able]"], ["a ", "[Table]"]),  # held back only while it could be the marker
    (["before[TOOL_CALLS]after"], ["before"]),
])
def test_tool_calls_are_kept_out_of_the_streamed_text(pieces, shown):
    out: list[str] = []
    piece = text_before_calls(out.append)
    for p in pieces:
        piece(p)
    assert out == shown


# --------------------------------------------------------------------------- the broker's servers
# Issue 35, item 4: a tool server that never answered cost every message its whole timeout
# (~30 s) before the reply, and one whose command does not exist stayed listed with no mark.

SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_test_server.py"
OURS = f"{shlex.quote(sys.executable)} {shlex.quote(str(SERVER))}"
SILENT = f"{shlex.quote(sys.executable)} -c {shlex.quote('import time; time.sleep(600)')}"  # starts, never speaks


@pytest.fixture
def broker(store, qapp):
    from tramontane.app.tools import ToolBroker

    b = ToolBroker(store, list_wait_s=1.0)
    yield b
    b.close()


def test_a_server_that_never_answers_delays_a_reply_once_by_the_short_wait(broker):
    broker.apply_servers([McpServerConfig("silent", command=SILENT, timeout_s=5)])
    said: list[str] = []
    broker.toolServerFailed.connect(said.append, Qt.ConnectionType.DirectConnection)
    t0 = time.monotonic()
    assert broker.offered_tools() == []
    first = time.monotonic() - t0
    t0 = time.monotonic()
    assert broker.offered_tools() == []  # still starting: this reply does not wait again
    second = time.monotonic() - t0
    assert 0.9 <= first < 3.0 and second < 0.3, (first, second)
    assert said == ["tool server 'silent' still starting: its tools are left out of this reply"]


def test_a_missing_command_is_remembered_as_failed_with_its_reason(broker, tmp_path, qtbot):
    missing = tmp_path / "no-such-mcp-server"
    broker.apply_servers([McpServerConfig("gone", command=str(missing), timeout_s=5)])
    t0 = time.monotonic()
    assert broker.offered_tools() == []
    assert time.monotonic() - t0 < 1.0
    assert broker.failure("gone") == f"tool server 'gone': command not found: {missing}"
    t0 = time.monotonic()
    assert broker.offered_tools() == [] and time.monotonic() - t0 < 0.1  # not started again
    broker.apply_servers([McpServerConfig("gone", command=OURS, timeout_s=5)])  # fixed in Settings
    assert broker.failure("gone") == ""
    with qtbot.waitSignal(broker.toolServersChanged, timeout=30000):
        broker.start_listing()
    assert {t.remote_name for t in broker.offered_tools()} == {"add", "fail", "crash", "hang"}


def test_switching_tools_on_starts_the_servers_before_the_first_message(broker, qtbot):
    broker.apply_servers([McpServerConfig("ours", command=OURS, timeout_s=10)])
    with qtbot.waitSignal(broker.toolServersChanged, timeout=30000):
        broker.start_listing()
    calls = []
    real = broker.mcp.list_server_tools
    broker.mcp.list_server_tools = lambda name: calls.append(name) or real(name)
    assert "add" in {t.remote_name for t in broker.offered_tools()}
    assert calls == []  # listed once, in the background: the reply found it ready


def test_the_tools_page_marks_a_server_whose_command_does_not_exist(broker, qtbot, tmp_path):
    from tramontane.app.dialogs.tools_page import ToolsDialog

    missing = tmp_path / "no-such-mcp-server"
    broker.apply_servers([McpServerConfig("ours", command=OURS, timeout_s=10),
                          McpServerConfig("gone", command=str(missing), timeout_s=5)])
    with qtbot.waitSignal(broker.toolServersChanged, timeout=30000,
                          check_params_cb=lambda: bool(broker.failure("gone"))):
        broker.start_listing()  # a chat's tools switched on: both start in the background
    dialog = ToolsDialog(broker)
    qtbot.addWidget(dialog)
    ours, gone = (dialog.servers.item(i) for i in range(2))
    assert gone.text() == "gone" and gone.toolTip() == f"{missing}\nFailed: {broker.failure('gone')}"
    assert gone.data(Qt.ItemDataRole.AccessibleDescriptionRole).startswith("failed: tool server 'gone': command not found")
    assert gone.foreground().color().name() == "#c62828"
    assert ours.toolTip() == OURS and ours.foreground().style() == Qt.BrushStyle.NoBrush
    dialog.servers.setCurrentRow(1)  # its own line says why too
    qtbot.waitUntil(lambda: "command not found" in dialog.tools_status.text(), timeout=30000)


def test_a_thought_streams_past_the_call_filter_as_a_thought():
    from tramontane.engine.api import ReasoningPiece

    out: list[str] = []
    piece = text_before_calls(out.append)
    for p in [ReasoningPiece("think [T"), ReasoningPiece("OOL_CALLS]"), "Answer [TOOL_CALLS]", "[{}]"]:
        piece(p)
    assert out == ["think [T", "OOL_CALLS]", "Answer "]
    assert [type(p) for p in out] == [ReasoningPiece, ReasoningPiece, str]


# --------------------------------------------------------------------------- a server's chat
# Issue 36, item 5: a chat bound to a server (RemoteEngine) runs the same tool loop, here against
# this project's own `serve` on loopback: its OpenAI tool_calls become the same cards, asked first,
# and the results go back as tool messages; the server's reasoning streams as ReasoningPiece.

def test_a_server_chat_runs_the_tool_loop_with_its_cards(store, broker, qtbot, monkeypatch):
    import json
    import threading

    from tramontane.app.tools import ALLOW_ONCE, set_chat_tools
    from tramontane.engine.api import ChatMessage, ReasoningPiece, SamplingParams, ToolCall, ToolSpec
    from tramontane.engine.remote.client import RemoteEngine

    from support.scripted import script_logits
    from support.served import ScriptedReplies, thinking_server

    broker.apply_servers([McpServerConfig("ours", command=OURS, timeout_s=20,
                                          disabled_tools=("crash", "fail", "hang"))])
    with qtbot.waitSignal(broker.toolServersChanged, timeout=60000):
        broker.start_listing()
    chat = store.create_chat("c")
    set_chat_tools(store, chat, True)
    store.add_message(chat, "user", "What is 2 + 40?")
    messages = [ChatMessage.text("user", "What is 2 + 40?")]
    with thinking_server() as served:
        script_logits(monkeypatch, ScriptedReplies(served.engine.tokenizer,
                                                   ("[THINK]", "Add them.", "[/THINK]", "[TOOL_CALLS]", "add",
                                                    "[ARGS]", json.dumps({"a": 2, "b": 40})),
                                                   ("The sum is 42.",)))
        engine = RemoteEngine(served.url, "tiny", read_timeout=120)
        pieces, rows, out = [], [], {}
        reply_id = store.begin_reply(chat)

        def run():
            try:
                out["result"] = broker.run_chat(engine, chat, messages, SamplingParams(max_tokens=80, temperature=0.0),
                                                on_piece=pieces.append, cancel=threading.Event(), session_key="k",
                                                reply_id=reply_id, new_reply=rows.append)
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                out["error"] = exc

        worker = threading.Thread(target=run)
        worker.start()
        try:
            def waiting_card():
                cards = [m for m in store.get_chat(chat).messages if m.role == "tool"]
                return cards[0].id if cards and broker.waiting(cards[0].id) else None

            qtbot.waitUntil(lambda: waiting_card() is not None or not worker.is_alive(), timeout=120000)
            card_id = waiting_card()
            assert card_id is not None, out  # the server's call asks first
            assert pieces and all(isinstance(p, ReasoningPiece) for p in pieces) and "".join(pieces) == "Add them."
            assert broker.answer(card_id, ALLOW_ONCE)
        finally:
            worker.join(120)
        assert "error" not in out, out.get("error")

    result, final_id = out["result"]
    assert result.text == "The sum is 42." and not result.tool_calls
    assert "".join(p for p in pieces if not isinstance(p, ReasoningPiece)) == "The sum is 42."
    assert rows == [final_id] and final_id != reply_id
    stored = store.get_chat(chat).messages
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    (called,) = stored[1].tool["calls"]
    assert called["name"] == "add" and json.loads(called["arguments"]) == {"a": 2, "b": 40}
    assert stored[1].finish_reason == "tool_calls"
    assert stored[1].reasoning == "Add them." and stored[1].reasoning_s is not None  # the round's thought kept
    assert stored[2].text == "42" and stored[2].tool["call_id"] == called["id"]
    assert (stored[2].tool["status"], stored[2].tool["decision"], stored[2].tool["server"]) == ("done", "once", "ours")
    # the server was given the tool, the call and its result: its prompt is the model's own encoding
    spec = [ToolSpec(t.name, t.description, t.parameters) for t in broker.offered_tools()]
    sent = messages + [ChatMessage("assistant", [], tool_calls=[ToolCall(called["id"], "add", called["arguments"])]),
                       ChatMessage("tool", ["42"], tool_call_id=called["id"])]
    assert result.stats.prompt_tokens == len(served.engine.encode(sent, spec).ids)


# --------------------------------------------------------------------------- a round's thought
# Issue 36, item 2: a round that ends in tool calls keeps its thought with the calls (the store's
# reasoning, timed), and the next round's prompt carries it before them as a [THINK] chunk, as
# the model's v13 format (mistral-common) encodes an earlier assistant turn's thought.

def test_a_tool_rounds_thought_is_stored_and_sent_back_before_its_calls(store, broker, qtbot, monkeypatch):
    import json
    import threading

    from tramontane.app.tools import ALLOW_ONCE
    from tramontane.engine.api import ChatMessage, SamplingParams, ThinkPart, ToolCall, ToolSpec
    from tramontane.engine.runtime.local import LocalEngine

    from support.scripted import script_logits
    from support.served import MODEL, ScriptedReplies
    from support.thinking import thinking_tokenizer

    broker.apply_servers([McpServerConfig("ours", command=OURS, timeout_s=20,
                                          disabled_tools=("crash", "fail", "hang"))])
    with qtbot.waitSignal(broker.toolServersChanged, timeout=60000):
        broker.start_listing()
    chat = store.create_chat("c")
    set_chat_tools(store, chat, True)
    store.add_message(chat, "user", "What is 2 + 40?")
    messages = [ChatMessage.text("user", "What is 2 + 40?")]
    engine = LocalEngine(MODEL, None, device="cpu", context_length=2048)
    try:
        engine.tokenizer = thinking_tokenizer(MODEL)
        script_logits(monkeypatch, ScriptedReplies(engine.tokenizer,
                                                   ("[THINK]", "Add them.", "[/THINK]", "[TOOL_CALLS]", "add",
                                                    "[ARGS]", json.dumps({"a": 2, "b": 40})),
                                                   ("The sum is 42.",)))
        reply_id = store.begin_reply(chat)
        out = {}

        def run():
            try:
                out["result"] = broker.run_chat(engine, chat, messages, SamplingParams(max_tokens=80, temperature=0.0),
                                                on_piece=lambda _p: None, cancel=threading.Event(), session_key="k",
                                                reply_id=reply_id, new_reply=lambda _id: None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                out["error"] = exc

        worker = threading.Thread(target=run)
        worker.start()
        try:
            def waiting_card():
                cards = [m for m in store.get_chat(chat).messages if m.role == "tool"]
                return cards[0].id if cards and broker.waiting(cards[0].id) else None

            qtbot.waitUntil(lambda: waiting_card() is not None or not worker.is_alive(), timeout=120000)
            assert waiting_card() is not None, out
            assert broker.answer(waiting_card(), ALLOW_ONCE)
        finally:
            worker.join(120)
        assert "error" not in out, out.get("error")
        result, _final = out["result"]
        assert result.text == "The sum is 42."
        stored = store.get_chat(chat).messages
        assert stored[1].finish_reason == "tool_calls" and stored[1].text == ""
        assert stored[1].reasoning == "Add them." and not stored[1].reasoning_open
        assert stored[1].reasoning_s is not None
        (called,) = stored[1].tool["calls"]
        spec = [ToolSpec(t.name, t.description, t.parameters) for t in broker.offered_tools()]
        sent = messages + [ChatMessage("assistant", [ThinkPart("Add them.")],
                                       tool_calls=[ToolCall(called["id"], "add", called["arguments"])]),
                           ChatMessage("tool", ["42"], tool_call_id=called["id"])]
        assert result.prompt_token_ids == engine.encode(sent, spec).ids
        think, end_think = engine.tokenizer.think_ids
        assert engine.tokenizer.decode(result.prompt_token_ids).count("Add them.") == 1
        assert think in result.prompt_token_ids and end_think in result.prompt_token_ids
        # the store gives the same thought back for a later reply of the chat
        assert store.engine_messages(chat)[1].parts == [ThinkPart("Add them.")]
    finally:
        engine.close()
