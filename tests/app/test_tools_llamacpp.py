"""A chat bound to a real llama-server runs the MCP tool loop end to end (issue 36, item 5): llama.cpp's
own server (tests/support/llama_cpp.py; skipped without TRAMONTANE_LLAMA_CPP_BIN) on the tiny
fixture model, with `--jinja` and a Mistral tool chat template written here (llama-server renders
it; we never execute Jinja ourselves). The chat forces a tool, so its first round goes out with
tool_choice "required"; llama-server's own parser turns what the model wrote into OpenAI
tool_calls, which become the card; the card is answered, the MCP server runs the call, its
result goes back as a tool message, and the model answers.

The tiny model is random: llama-server's "required" grammar still lets a reply write text before
its [TOOL_CALLS] (and this model would write text until max_tokens), so the forced round also
favours the [TOOL_CALLS] token by logit_bias (added to that request only); the grammar makes
what follows a well-formed call of an offered tool, with integer arguments per its schema.
"""
from __future__ import annotations

import json
import shlex
import sys
import threading
from pathlib import Path

import pytest

from tramontane.app.store import Store
from tramontane.app.tools import (ALLOW_ONCE, ToolBroker, set_chat_tools, set_chat_tools_required)
from tramontane.engine.api import ChatMessage, SamplingParams
from tramontane.engine.mcp_tools import McpServerConfig
from tramontane.engine.remote import client
from tramontane.engine.remote.client import RemoteEngine, message_payload

from support import FIXTURES
from support.llama_cpp import llama_server, post_json

FIXTURE = FIXTURES / "mistral3_tiny-f32.gguf"
SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_test_server.py"
OURS = f"{shlex.quote(sys.executable)} {shlex.quote(str(SERVER))}"
QUESTION = "What is 2 + 40?"

# Mistral's v3/v7 tool format: [AVAILABLE_TOOLS] before the last [INST], calls as a JSON list
# after [TOOL_CALLS], results as [TOOL_RESULTS]{"content", "call_id"}[/TOOL_RESULTS].
TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
{%- if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ message['content'] }}[/SYSTEM_PROMPT]
{%- elif message['role'] == 'user' %}
{%- if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}[INST]{{ message['content'] }}[/INST]
{%- elif message['role'] == 'assistant' %}
{%- if message['tool_calls'] %}[TOOL_CALLS][
{%- for call in message['tool_calls'] %}{"name": "{{ call['function']['name'] }}", "arguments": {{ call['function']['arguments'] | tojson }}, "id": "{{ call['id'] }}"}{%- if not loop.last %}, {% endif %}{%- endfor %}]{{ eos_token }}
{%- else %}{{ message['content'] }}{{ eos_token }}{%- endif %}
{%- elif message['role'] == 'tool' %}[TOOL_RESULTS]{"content": {{ message['content'] | tojson }}, "call_id": "{{ message['tool_call_id'] }}"}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}
"""


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama_server_tools")
    template = folder / "mistral-tools.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    with llama_server(FIXTURE, folder, "--alias", "tiny", "--ctx-size", "512", "--jinja",
                      "--chat-template-file", str(template)) as url:
        yield url


def tool_calls_token() -> int:
    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.mistral3.tokenizer import Tokenizer

    with open_gguf(FIXTURE) as gf:
        return Tokenizer.from_gguf(gf).token_id("[TOOL_CALLS]")


def test_a_chat_bound_to_llama_server_runs_the_tool_loop(base_url, tmp_path, qtbot, monkeypatch):
    sent: list[dict] = []
    real_payload = client.chat_payload
    favoured = tool_calls_token()

    def payload(*args, **kwargs):
        body = real_payload(*args, **kwargs)
        if body.get("tool_choice") == "required":
            body["logit_bias"] = {str(favoured): 100}
        sent.append(body)
        return body

    monkeypatch.setattr(client, "chat_payload", payload)
    with Store(tmp_path / "d") as store:
        broker = ToolBroker(store, list_wait_s=1.0)
        try:
            broker.apply_servers([McpServerConfig("ours", command=OURS, timeout_s=20,
                                                  disabled_tools=("crash", "fail", "hang"))])
            with qtbot.waitSignal(broker.toolServersChanged, timeout=60000):
                broker.start_listing()
            chat = store.create_chat("c")
            set_chat_tools(store, chat, True)
            set_chat_tools_required(store, chat, True)
            store.add_message(chat, "user", QUESTION)
            messages = [ChatMessage.text("user", QUESTION)]
            engine = RemoteEngine(base_url + "/v1", "tiny", read_timeout=120)
            reply_id = store.begin_reply(chat)
            pieces, rows, out = [], [], {}

            def run():
                try:
                    out["result"] = broker.run_chat(
                        engine, chat, messages, SamplingParams(max_tokens=60, temperature=0.0, seed=0),
                        on_piece=pieces.append, cancel=threading.Event(), session_key="k", reply_id=reply_id,
                        new_reply=rows.append)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    out["error"] = exc

            worker = threading.Thread(target=run)
            worker.start()
            try:
                def waiting_card():
                    cards = [m for m in store.get_chat(chat).messages if m.role == "tool"]
                    return cards[0].id if cards and broker.waiting(cards[0].id) else None

                qtbot.waitUntil(lambda: waiting_card() is not None or not worker.is_alive(), timeout=120000)
                card_id = waiting_card()
                assert card_id is not None, out  # llama-server's call asks first
                assert broker.answer(card_id, ALLOW_ONCE)
            finally:
                worker.join(120)
            assert "error" not in out, out.get("error")
        finally:
            broker.close()

        result, final_id = out["result"]
        assert [b.get("tool_choice") for b in sent] == ["required", None]  # forced once, then the model chooses
        assert sent[0]["tools"] == sent[1]["tools"] and [t["function"]["name"] for t in sent[0]["tools"]] == ["add"]
        stored = store.get_chat(chat).messages
        assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
        assert rows == [final_id] and stored[3].id == final_id
        (called,) = stored[1].tool["calls"]
        assert stored[1].finish_reason == "tool_calls" and called["name"] == "add" and called["id"]
        arguments = json.loads(called["arguments"])  # llama-server's grammar held them to the schema
        assert set(arguments) == {"a", "b"} and all(isinstance(v, int) for v in arguments.values())
        card = stored[2].tool
        assert (card["status"], card["decision"], card["server"], card["call_id"]) == ("done", "once", "ours", called["id"])
        assert stored[2].text == str(arguments["a"] + arguments["b"])  # the MCP server ran the call
        # the answer: text, streamed as it came, no more calls
        assert not result.tool_calls and result.text and "".join(pieces).endswith(result.text)
        # the second request carried the call and its result in OpenAI's shape, and llama-server's
        # template put them in the model's prompt: its prompt is that rendering, token for token
        second = sent[1]["messages"]
        assert second[1] == {"role": "assistant", "content": None, "tool_calls": [
            {"id": called["id"], "type": "function", "function": {"name": "add", "arguments": called["arguments"]}}]}
        assert second[2] == {"role": "tool", "tool_call_id": called["id"], "content": stored[2].text}
        rendered = post_json(base_url + "/apply-template", {"messages": second, "tools": sent[1]["tools"]})["prompt"]
        assert f'[TOOL_RESULTS]{{"content": "{stored[2].text}", "call_id": "{called["id"]}"}}[/TOOL_RESULTS]' in rendered
        assert '[TOOL_CALLS][{"name": "add"' in rendered
        # /apply-template leaves out the BOS the server puts before every prompt: add_special adds it
        tokens = post_json(base_url + "/tokenize", {"content": rendered, "add_special": True, "parse_special": True})["tokens"]
        assert result.stats.prompt_tokens == len(tokens)
        assert message_payload(messages[0]) == second[0]
