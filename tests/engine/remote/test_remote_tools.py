"""A RemoteEngine bound to this project's own `serve` gets what a local chat gets (issue 36,
item 5): the server's streamed `reasoning_content` as ReasoningPiece and in `result.reasoning`,
its OpenAI `tool_calls` as ToolCalls, the calls and their results sent back as assistant
`tool_calls` and `tool` messages, images and tools reaching the model. The server runs the tiny
model made to think, its replies scripted; what reached the model is checked by its prompt
length (the server's usage) against the same model's own encoding of the same conversation."""
from __future__ import annotations

import json

import pytest

from tramontane.engine.api import ChatMessage, ImagePart, ReasoningPiece, SamplingParams, ToolSpec
from tramontane.engine.remote.client import RemoteEngine, message_payload
from tramontane.engine.remote.transport import RemoteError

from support import FIXTURES
from support.scripted import script_logits
from support.served import ScriptedReplies, thinking_server

THOUGHT, ANSWER = "Two and forty.", "The sum is 42."
ADD = ToolSpec("add", "Add two integers.", {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})
ARGS = json.dumps({"a": 2, "b": 40})
GREEDY = SamplingParams(max_tokens=80, temperature=0.0)


@pytest.fixture(scope="module")
def served():
    with thinking_server() as server:
        yield server


@pytest.fixture
def script(served, monkeypatch):
    def set_replies(*replies):
        script_logits(monkeypatch, ScriptedReplies(served.engine.tokenizer, *replies))
    return set_replies


def remote(served) -> RemoteEngine:
    return RemoteEngine(served.url, "tiny", read_timeout=120)


def test_a_thought_then_a_tool_call_then_the_answer_over_the_server(served, script):
    image = ImagePart.from_path(FIXTURES / "ref_image_112x84.png")
    script(("[THINK]", THOUGHT, "[/THINK]", "[TOOL_CALLS]", "add", "[ARGS]", ARGS), (ANSWER,))
    messages = [ChatMessage("user", ["What is 2 + 40? ", image])]
    pieces: list[str] = []
    first = remote(served).chat(messages, GREEDY, on_piece=pieces.append, tools=[ADD])

    assert first.reasoning == THOUGHT and first.text == ""
    assert pieces and all(isinstance(p, ReasoningPiece) for p in pieces) and "".join(pieces) == THOUGHT
    (call,) = first.tool_calls
    assert call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 40} and call.id
    assert first.finish_reason == "stop" and first.error is None
    # the image and the tool reached the model: the server read exactly the prompt it encodes
    assert first.stats.prompt_tokens == len(served.engine.encode(messages, [ADD]).ids)
    assert first.stats.prompt_tokens > len(served.engine.encode([ChatMessage.text("user", "What is 2 + 40? ")],
                                                                [ADD]).ids) + 4

    messages += [ChatMessage("assistant", [], tool_calls=[call]), ChatMessage("tool", ["42"], tool_call_id=call.id)]
    pieces.clear()
    second = remote(served).chat(messages, GREEDY, on_piece=pieces.append, tools=[ADD])
    assert second.text == ANSWER and not second.tool_calls and second.reasoning == ""
    assert "".join(pieces) == ANSWER and not any(isinstance(p, ReasoningPiece) for p in pieces)
    # the call and its result went back as the model's own format writes them
    assert second.stats.prompt_tokens == len(served.engine.encode(messages, [ADD]).ids)


def test_calls_and_results_are_sent_in_openais_shape():
    from tramontane.engine.api import ThinkPart, ToolCall

    call = ToolCall("abcDEF123", "add", ARGS)
    assert message_payload(ChatMessage("assistant", [ThinkPart("hm")], tool_calls=[call])) == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "abcDEF123", "type": "function", "function": {"name": "add", "arguments": ARGS}}]}
    assert message_payload(ChatMessage("tool", ["42"], tool_call_id="abcDEF123")) == {
        "role": "tool", "tool_call_id": "abcDEF123", "content": "42"}
    # an earlier thought is not sent (OpenAI's messages have no place for it), images beside it still are
    image = ImagePart((FIXTURES / "ref_image_112x84.png").read_bytes(), "x.png")
    sent = message_payload(ChatMessage("assistant", [ThinkPart("hm"), "ok ", image]))
    assert [p["type"] for p in sent["content"]] == ["text", "image_url"] and sent["content"][0]["text"] == "ok "
    with pytest.raises(RemoteError, match="tool_call_id"):
        message_payload(ChatMessage("tool", ["42"]))


def test_a_stopped_reply_never_returns_its_half_written_calls(served, script):
    import threading

    script(("[THINK]", THOUGHT, "[/THINK]", "[TOOL_CALLS]", "add", "[ARGS]", ARGS),)
    cancel = threading.Event()

    def on_piece(piece):
        cancel.set()  # Stop as soon as the thought starts

    result = remote(served).chat([ChatMessage.text("user", "add")], GREEDY, on_piece=on_piece, cancel=cancel,
                                 tools=[ADD])
    assert result.finish_reason == "cancelled" and result.tool_calls == []


def test_tool_choice_goes_out_only_with_tools_and_only_when_not_auto():
    from tramontane.engine.remote.client import chat_payload

    user = [ChatMessage.text("user", "What is 2 + 40?")]
    assert chat_payload("m", user, GREEDY, tools=[ADD], tool_choice="required")["tool_choice"] == "required"
    assert chat_payload("m", user, GREEDY, tools=[ADD], tool_choice="none")["tool_choice"] == "none"
    assert "tool_choice" not in chat_payload("m", user, GREEDY, tools=[ADD], tool_choice="auto")
    assert "tool_choice" not in chat_payload("m", user, GREEDY, tools=[ADD])
    assert "tool_choice" not in chat_payload("m", user, GREEDY, tool_choice="required")  # no tools to choose from
    with pytest.raises(RemoteError, match="tool_choice 'always'"):
        chat_payload("m", user, GREEDY, tools=[ADD], tool_choice="always")
