"""The window's tool loop, end to end with real parts: the tiny fixture model (its replies scripted
by the test-only logits hook) calls the tools of our own MCP test server (a real stdio process
through the official SDK); each call is a card that asks first, its result goes back to the model,
and the loop ends in a text reply. Cards are stored with the chat and shown again after a restart."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

pytest.importorskip("mcp")

from tramontane.app.tools import DENIED, STOPPED, cap_note  # noqa: E402
from tramontane.app.widgets.tool_card import ToolCard  # noqa: E402
from tramontane.engine.api import ToolSpec  # noqa: E402
from tramontane.engine.mcp_tools import McpServerConfig  # noqa: E402

from support.scripted import script_logits
from support.served import ScriptedReplies as Replies  # each reply written exactly, then EOS
from support.app_window import GREEDY, close_window, make_window, send  # noqa: E402

SERVER = Path(__file__).resolve().parents[2] / "support" / "mcp_test_server.py"
OURS = f"{shlex.quote(sys.executable)} {shlex.quote(str(SERVER))}"
WAIT_MS = 60000


def call(name: str, **arguments) -> tuple[str, str]:
    return ("[TOOL_CALLS]", json.dumps([{"name": name, "arguments": arguments}]))


@pytest.fixture
def tool_window(qtbot, tmp_path, isolated, monkeypatch):
    w = make_window(qtbot, tmp_path / "data")
    w.session.param_overrides = dict(GREEDY, max_tokens=200)
    offer(w, "add")
    qtbot.mouseClick(w.tools_button, Qt.MouseButton.LeftButton)  # tools on for the new chat
    assert w.tools_button.isChecked()

    def script(*replies):
        script_logits(monkeypatch, Replies(w.worker.engine.tokenizer, *replies))

    w.script = script
    yield w
    if not getattr(w, "closed_by_test", False):
        close_window(w)


def offer(window, *names: str) -> None:
    """Our test server with only `names` switched on (the tiny model's context is 512 tokens)."""
    off = tuple(sorted({"add", "fail", "crash", "hang"} - set(names)))
    window.tools.apply_servers([McpServerConfig("ours", command=OURS, timeout_s=3, disabled_tools=off)])


def cards(window) -> list[ToolCard]:
    return [c for c in window.view.widgets if isinstance(c, ToolCard)]


def type_and_send(qtbot, window, text: str) -> None:
    qtbot.keyClicks(window.composer.edit, text)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)


def waiting_card(qtbot, window, n: int) -> ToolCard:
    """The n-th card (1-based) once it asks for an answer."""
    qtbot.waitUntil(lambda: len(cards(window)) >= n and bool(cards(window)[n - 1].buttons), timeout=WAIT_MS)
    return cards(window)[n - 1]


def stored(window):
    return window.store.get_chat(window.session.current_chat_id).messages


def test_allow_once_runs_the_call_and_the_model_answers_with_its_result(qtbot, tool_window):
    w = tool_window
    w.script(call("add", a=2, b=40), ("The sum is 42.",))
    finished = []
    w.worker.finished.connect(lambda _rid, result: finished.append(result))
    streamed = []
    w.session.streamed.connect(streamed.append)
    type_and_send(qtbot, w, "What is 2 + 40?")
    card = waiting_card(qtbot, w, 1)
    assert card.status.text() == "Waiting for your answer"
    assert "<b>add</b>" in card.title.text() and "(ours)" in card.title.text()
    assert json.loads(card.arguments.text()) == {"a": 2, "b": 40}
    assert set(card.buttons) == {"once", "always", "deny"}
    card.grab().save("/tmp/tool_card_waiting.png")

    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(card.buttons["once"], Qt.MouseButton.LeftButton)
    (card,) = cards(w)
    assert not card.buttons and card.result.text() == "42"
    assert card.status.text().startswith("Done · allowed once · ")
    card.grab().save("/tmp/tool_card_done.png")
    assert streamed[-1] == "The sum is 42." and not any("TOOL_CALLS" in t or "add" in t for t in streamed)
    final, calls_only = w.view.widgets[-1], w.view.widgets[1]
    assert final.message.text == "The sum is 42."
    qtbot.waitUntil(final.isVisible)  # a new widget shows at the next turn of the event loop
    assert calls_only.message.tool and calls_only.isHidden()  # its card says it all

    rows = stored(w)
    assert [m.role for m in rows] == ["user", "assistant", "tool", "assistant"]
    (called,) = rows[1].tool["calls"]
    assert called["name"] == "add" and json.loads(called["arguments"]) == {"a": 2, "b": 40}
    assert len(called["id"]) == 9 and rows[1].finish_reason == "tool_calls"
    assert rows[2].text == "42" and rows[2].tool["call_id"] == called["id"]
    assert (rows[2].tool["status"], rows[2].tool["decision"], rows[2].tool["error"]) == ("done", "once", None)
    assert rows[2].tool["elapsed_s"] > 0
    assert rows[3].text == "The sum is 42." and rows[3].tool is None and rows[3].state == "complete"
    # the second reply was given the call and its result, as the chat format writes them
    engine = w.worker.engine
    specs = w.tools.offered_tools()
    expected = engine.encode(w.store.engine_messages(w.session.current_chat_id)[:-1],
                             [ToolSpec(t.name, t.description, t.parameters) for t in specs]).ids
    assert finished[-1].prompt_token_ids == expected

    # a restart shows the same cards, not waiting
    chat_id, data = w.session.current_chat_id, w.store.data_dir
    close_window(w)
    w.closed_by_test = True
    w2 = make_window(qtbot, data, load=False)
    try:
        w2.navigation.open_chat(chat_id)
        (again,) = cards(w2)
        assert again.result.text() == "42" and not again.buttons
        assert again.status.text() == card.status.text()
        branch = w2.chats.branch_at(None, chat_id)
        assert [m.tool for m in w2.store.get_chat(branch).messages] == [m.tool for m in rows]
    finally:
        close_window(w2)


def test_deny_sends_the_denial_and_the_chat_goes_on(qtbot, tool_window):
    w = tool_window
    w.script(call("add", a=1, b=1), ("I was not allowed to add.",))
    type_and_send(qtbot, w, "add 1 and 1")
    card = waiting_card(qtbot, w, 1)
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(card.buttons["deny"], Qt.MouseButton.LeftButton)
    rows = stored(w)
    assert [m.role for m in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[2].text == DENIED and rows[2].tool["status"] == "denied"
    assert cards(w)[0].status.text() == "Denied" and cards(w)[0].result.text() == DENIED
    assert rows[3].text == "I was not allowed to add."


def test_a_crash_and_a_hang_give_error_cards_and_the_chat_goes_on(qtbot, tool_window):
    w = tool_window
    offer(w, "crash", "hang")
    w.script(call("crash"), call("hang"), ("Both tools failed.",))
    type_and_send(qtbot, w, "try the tools")
    qtbot.mouseClick(waiting_card(qtbot, w, 1).buttons["once"], Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(waiting_card(qtbot, w, 2).buttons["once"], Qt.MouseButton.LeftButton)
    crashed, hung = cards(w)
    assert crashed.status.text().startswith("Failed") and crashed.error.isVisibleTo(crashed)
    assert "ours" in crashed.error.text()
    assert "did not answer within 3 s" in hung.error.text()
    hung.grab().save("/tmp/tool_card_error.png")
    rows = stored(w)
    assert [m.role for m in rows] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert rows[-1].text == "Both tools failed."
    assert rows[2].tool["status"] == rows[4].tool["status"] == "error"
    assert rows[4].text.startswith("Error: ")  # what the model was given

    offer(w, "add")
    w.script(call("add", a=3, b=4), ("7.",))  # the server is back for the next call
    type_and_send(qtbot, w, "and 3 + 4?")
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(waiting_card(qtbot, w, 3).buttons["once"], Qt.MouseButton.LeftButton)
    assert stored(w)[-2].text == "7" and stored(w)[-1].text == "7."


def test_the_step_cap_ends_the_loop_and_always_allows_later_calls(qtbot, tool_window):
    w = tool_window
    w.tools.max_steps = 2
    w.script(call("add", a=1, b=2), call("add", a=3, b=4), ("Done adding.",))
    type_and_send(qtbot, w, "keep adding")
    card = waiting_card(qtbot, w, 1)
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(card.buttons["always"], Qt.MouseButton.LeftButton)
    rows = stored(w)
    assert [m.role for m in rows] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [rows[2].text, rows[4].text] == ["3", "7"]
    assert rows[4].tool["decision"] == "always"  # not asked again
    assert rows[4].tool["note"] == cap_note(2) and cards(w)[-1].note.text() == cap_note(2)
    assert rows[-1].text == "Done adding."
    assert w.store.get_chat_info(w.session.current_chat_id).settings["tools_always"] == ["add"]


def test_stop_while_a_card_waits_ends_the_reply(qtbot, tool_window):
    w = tool_window
    w.script(call("add", a=5, b=5), ("never written",))
    type_and_send(qtbot, w, "add")
    waiting_card(qtbot, w, 1)
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        w.replies.stop()
    rows = stored(w)
    assert [m.role for m in rows] == ["user", "assistant", "tool"]
    assert rows[2].text == STOPPED and rows[2].tool["status"] == "stopped"
    assert not cards(w)[0].buttons and w.session.pending is None



def test_a_chat_that_requires_a_tool_shows_a_card_from_a_model_that_would_not_call(qtbot, tool_window):
    """Issue 35, item 4: nothing let a user see a tool card without a model that decides to call.
    The tiny model left to itself (greedy, no script) writes text; with 'Each reply must call a
    tool first' chosen for the chat, its first round is held to a call of one of the chat's
    tools. That call's number runs on until the token limit cuts it: the card says so and is
    neither asked for nor run (it asked to run arguments the model never finished), and the
    reply ends there."""
    w = tool_window
    w.session.param_overrides = dict(w.session.param_overrides, max_tokens=40)
    reply = send(qtbot, w, "Hello")  # a model that would not call: a text reply, no card
    assert not cards(w) and w.store.get_message(reply).tool is None
    w.navigation.new_chat()
    w.session.set_tools_required(None, True)  # Chat settings' box, for the chat not saved yet
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        type_and_send(qtbot, w, "Hello")
    rows = stored(w)
    assert [m.role for m in rows] == ["user", "assistant", "tool"]
    (called,) = rows[1].tool["calls"]
    assert called["name"] == "add" and called["arguments"].startswith('{"a": ')  # the grammar's call
    assert rows[1].finish_reason == "tool_calls" and rows[2].tool["status"] == "unfinished"
    assert rows[2].tool["decision"] == "" and rows[2].tool["elapsed_s"] is None  # never run
    (card,) = cards(w)
    assert not card.buttons and card.status.text() == "Not run: the call was cut off"
    assert card.error.text() == ("Error: the reply reached its limit of 40 tokens while writing this "
                                 "call, so its arguments are unfinished and it was not run (Max "
                                 "tokens is in Chat settings)")
    assert rows[2].text == card.error.text()  # what the model reads in the next turn
    assert w.session.pending is None

def test_a_remote_engine_keeps_the_chats_tools(qtbot, tool_window):
    """A server's model gets the same tools (issue 36 item 5: its OpenAI tool calls, the same loop)."""
    from dataclasses import replace

    w = tool_window
    w.session.engine_info = replace(w.session.engine_info, remote=True)
    w.tools_switch.update()
    assert w.tools_button.isEnabled() and w.tools_button.isChecked()


def test_settings_tools_lists_a_servers_tools_and_switches_one_off(qtbot, idle_window):
    from tramontane.app.dialogs.tools_page import ToolsDialog
    from tramontane.app.tools import load_servers

    w = idle_window
    dialog = ToolsDialog(w.tools, w)
    qtbot.addWidget(dialog)
    dialog.name.setText("ours")
    dialog.command.setText(OURS)
    qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.tools.count() == 4, timeout=WAIT_MS)
    names = [dialog.tools.item(i).text() for i in range(4)]
    assert sorted(names) == ["add", "crash", "fail", "hang"]
    dialog.tools.item(names.index("hang")).setCheckState(Qt.CheckState.Unchecked)
    qtbot.waitUntil(lambda: load_servers(w.store)[0].disabled_tools == ("hang",), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: sorted(t.name for t in w.tools.offered_tools()) == ["add", "crash", "fail"],
                    timeout=WAIT_MS)
    dialog.servers.item(0).setCheckState(Qt.CheckState.Unchecked)
    qtbot.waitUntil(lambda: not load_servers(w.store)[0].enabled, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: w.tools.offered_tools() == [], timeout=WAIT_MS)
    qtbot.mouseClick(dialog.remove_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: load_servers(w.store) == [], timeout=WAIT_MS)
    assert dialog.servers.count() == 0


def test_a_server_answering_garbage_is_named_and_the_others_tools_still_work(qtbot, tool_window):
    w = tool_window
    w.tools.apply_servers([McpServerConfig("junk", command=f"{OURS} garbage", timeout_s=3),
                           # 'ours' must answer: time for its Python to start on two busy cores
                           McpServerConfig("ours", command=OURS, timeout_s=20,
                                           disabled_tools=("crash", "fail", "hang"))])
    w.script(call("add", a=20, b=22), ("42.",))
    type_and_send(qtbot, w, "add")
    card = waiting_card(qtbot, w, 1)
    shown = w.statusBar().currentMessage()
    assert "'junk'" in shown and "left out of this reply" in shown
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(card.buttons["once"], Qt.MouseButton.LeftButton)
    assert [m.text for m in stored(w)[-2:]] == ["42", "42."]


def test_the_reference_time_server_from_the_package_index(qtbot, tool_window):
    exe = Path(sys.executable).with_name("mcp-server-time")
    if not exe.exists():
        pytest.skip("mcp-server-time is not installed (test extra)")
    w = tool_window
    w.tools.apply_servers([McpServerConfig("time", command=f"{shlex.quote(str(exe))} --local-timezone UTC",
                                           disabled_tools=("convert_time",))])
    w.script(call("get_current_time", timezone="Asia/Tokyo"), ("Here is the time in Tokyo.",))
    type_and_send(qtbot, w, "time in Tokyo?")
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(waiting_card(qtbot, w, 1).buttons["once"], Qt.MouseButton.LeftButton)
    rows = stored(w)
    answer = json.loads(rows[2].text)
    assert answer["timezone"] == "Asia/Tokyo" and answer["datetime"].endswith("+09:00")
    assert rows[2].tool["server"] == "time" and rows[-1].text == "Here is the time in Tokyo."


def test_regenerating_the_answer_after_a_tool_call_keeps_the_card_and_the_result(qtbot, tool_window):
    w = tool_window
    w.script(call("add", a=2, b=2), ("Four.",))
    type_and_send(qtbot, w, "2 + 2?")
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(waiting_card(qtbot, w, 1).buttons["once"], Qt.MouseButton.LeftButton)
    w.script(("It is 4.",))
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        w.replies.regenerate(None)
    rows = stored(w)
    assert [m.role for m in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[2].text == "4" and rows[3].text == "It is 4." and rows[3].tool is None
    assert (rows[3].versions, rows[3].version) == (2, 1)
    assert len(cards(w)) == 1 and not cards(w)[0].buttons


def test_parallel_calls_each_get_a_card_and_always_covers_the_next(qtbot, tool_window):
    w = tool_window
    w.script(("[TOOL_CALLS]", json.dumps([{"name": "add", "arguments": {"a": 1, "b": 2}},
                                          {"name": "add", "arguments": {"a": 30, "b": 12}}])), ("3 and 42.",))
    type_and_send(qtbot, w, "two sums")
    first = waiting_card(qtbot, w, 1)
    assert len(cards(w)) == 1  # the second call waits for the first one's answer
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
        qtbot.mouseClick(first.buttons["always"], Qt.MouseButton.LeftButton)
    rows = stored(w)
    assert [m.role for m in rows] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["id"] for c in rows[1].tool["calls"]] == [rows[2].tool["call_id"], rows[3].tool["call_id"]]
    assert [rows[2].text, rows[3].text, rows[4].text] == ["3", "42", "3 and 42."]
    assert [c.result.text() for c in cards(w)] == ["3", "42"]


def test_each_turn_of_a_tool_chat_reuses_all_but_the_last_exchange(qtbot, tool_window):
    """Issue 35, item 4: each turn of a tool chat reused 1 token from the cache. Tokenizers v7 and
    v11 put the tools block before the last user message (mistral-common, the reference, and the
    models' own chat templates do), so a new turn moves it: turn 2 cannot reuse what followed the
    tools in turn 1. The prefix before the block is the same ids in the same places from turn to
    turn, so from turn 3 on everything before the previous turn's tools block is reused, and a long
    tool chat reads only its last exchange and the tools block again, not the whole chat."""
    w = tool_window
    tokenizer = w.worker.engine.tokenizer
    assert tokenizer.version == 7  # the fixture's tekken: tools before the last [INST]
    w.script(("Hello there.",), ("Again.",), ("Once more.",))
    finished = []
    w.worker.finished.connect(lambda _rid, result: finished.append(result))
    for text in ("First question", "Second question", "Third question"):
        with qtbot.waitSignal(w.replyFinished, timeout=WAIT_MS):
            type_and_send(qtbot, w, text)
    stats = [w.session.live_stats[m.id] for m in stored(w) if m.role == "assistant"]
    prompts = [list(r.prompt_token_ids) for r in finished]
    tools = tokenizer.token_id("[AVAILABLE_TOOLS]")
    assert w.tools.offered_tools() and all(p.count(tools) == 1 for p in prompts)
    # the reference's format: the block moves to each turn's last user message
    before = [p.index(tools) for p in prompts]
    assert before[0] < before[1] < before[2]
    for turn in (1, 2):
        assert prompts[turn][:before[turn - 1]] == prompts[turn - 1][:before[turn - 1]]
        # turn 2 reuses what came before turn 1's block (<s>), turn 3 all before turn 2's block
        assert stats[turn].reused_tokens >= before[turn - 1], (turn, stats[turn], before)
    assert before[1] > 10  # turn 1's question and answer, read again in turn 2, reused in turn 3
