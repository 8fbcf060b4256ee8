"""app/tools.py without a window: the tool servers setting (damaged entries skipped), a chat's
switches, and the stream filter that keeps a reply's tool calls out of its text."""
from __future__ import annotations

import pytest

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
