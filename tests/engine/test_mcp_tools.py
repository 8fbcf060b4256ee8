"""MCP tool servers through the official SDK: the reference time server from the package index
(offline), and our own small server for what goes wrong (a tool error, a crash, a hang, a
process answering garbage). Each failure is one ToolOutcome with an error, and the next call
works again."""
import gc
import json
import logging
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from tramontane.engine.mcp_tools import McpError, McpServerConfig, McpTools, model_tool_name

pytest.importorskip("mcp")
SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_test_server.py"
OURS = f"{shlex.quote(sys.executable)} {shlex.quote(str(SERVER))}"


@pytest.fixture
def tools():
    hub = McpTools()
    yield hub
    hub.close()


def test_the_reference_time_server_lists_and_answers(tools):
    exe = shutil.which("mcp-server-time") or str(Path(sys.executable).with_name("mcp-server-time"))
    if not Path(exe).exists():
        pytest.skip("mcp-server-time is not installed (test extra)")
    tools.set_configs([McpServerConfig("time", command=f"{shlex.quote(exe)} --local-timezone UTC")])
    listed = {t.name: t for t in tools.list_server_tools("time")}
    assert {"get_current_time", "convert_time"} <= set(listed)
    params = listed["get_current_time"].parameters
    assert params["type"] == "object" and "timezone" in params["properties"]
    entry = listed["get_current_time"].openai_tool()
    assert entry["type"] == "function" and entry["function"]["name"] == "get_current_time"
    out = tools.call("get_current_time", '{"timezone": "Europe/Paris"}')
    assert out.ok, out.error
    reply = json.loads(out.text)
    assert reply["timezone"] == "Europe/Paris" and reply["datetime"].startswith(time.strftime("%Y-", time.gmtime()))
    out = tools.call("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
    assert out.ok and json.loads(out.text)["target"]["datetime"].endswith("21:00:00+09:00")


def test_a_tool_error_a_crash_and_a_hang_are_outcomes_and_the_server_comes_back(tools):
    tools.set_configs([McpServerConfig("ours", command=OURS, timeout_s=3)])
    assert {t.name for t in tools.list_server_tools("ours")} == {"add", "fail", "crash", "hang"}
    assert tools.call("add", {"a": 2, "b": 40}).text == "42"

    failed = tools.call("fail", {"reason": "disk on fire"})
    assert not failed.ok and "disk on fire" in failed.error

    crashed = tools.call("crash", {})
    assert not crashed.ok and "ours" in crashed.error
    assert tools.call("add", {"a": 1, "b": 1}).text == "2"  # restarted

    start = time.monotonic()
    hung = tools.call("hang", {})
    assert not hung.ok and "did not answer within 3 s" in hung.error
    assert time.monotonic() - start < 3 + 12
    assert tools.call("add", {"a": 5, "b": 5}).text == "10"


def test_a_late_answer_to_a_caller_that_gave_up_is_not_left_for_the_garbage_collector(tools, caplog):
    """The server's own timeout error arrives after the caller stopped waiting; left unretrieved,
    asyncio logs it when the future is collected, anywhere (in CPython 3.11.7 that logging,
    nested in an ast.parse, raised SystemError in an unrelated Triton test)."""
    tools.set_configs([McpServerConfig("ours", command=OURS, timeout_s=1)])
    tools.list_server_tools("ours")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert not tools.call("hang", {}).ok
        assert tools.call("add", {"a": 1, "b": 2}).text == "3"
        tools.close()
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_bad_arguments_and_unknown_tools_never_reach_a_server(tools):
    tools.set_configs([McpServerConfig("ours", command=OURS)])
    tools.list_server_tools("ours")
    assert "not JSON" in tools.call("add", "{a: 1").error
    assert "JSON object" in tools.call("add", "[1, 2]").error
    assert "no tool named 'nope'" in tools.call("nope", {}).error


def test_servers_that_cannot_be_used_say_why(tools):
    tools.set_configs([McpServerConfig("garbage", command=f"{OURS} garbage", timeout_s=3),
                       McpServerConfig("missing", command="/nonexistent/mcp-server --flag")])
    with pytest.raises(McpError, match="garbage"):
        tools.list_server_tools("garbage")
    with pytest.raises(McpError, match="missing.*(not found|No such file)"):
        tools.list_server_tools("missing")
    with pytest.raises(McpError, match="either a command or a URL"):
        McpServerConfig("both", command="x", url="http://127.0.0.1:1/mcp")
    with pytest.raises(McpError, match="not an http"):
        McpServerConfig("ftp", url="ftp://example/mcp")


def test_tool_names_are_unique_across_servers_and_valid_for_the_model():
    taken = {"search"}
    assert model_tool_name("web", "search", taken) == "web_search"
    assert model_tool_name("my server", "get time!", set()) == "get_time_"
    assert len(model_tool_name("s", "x" * 100, set())) == 64
    taken = {"search", "web_search"}
    assert model_tool_name("web", "search", taken) == "web_search_2"


def test_disabled_servers_and_tools_are_not_offered(tools):
    tools.set_configs([McpServerConfig("ours", command=OURS, disabled_tools=("crash", "hang"))])
    tools.list_server_tools("ours")
    assert {t.name for t in tools.enabled_tools()} == {"add", "fail"}
    config = McpServerConfig.from_json({**tools.configs[0].to_json(), "enabled": False})
    tools.set_configs([config])
    assert tools.enabled_tools() == []
