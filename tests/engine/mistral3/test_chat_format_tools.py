"""Tool definitions, calls and results in the v7, v11 and v13 chat formats, token-exact with
mistral-common's `encode_chat_completion`; the parser of the calls a model writes.

Reference: mistral-common's tokenizers of support.tekken_versions (its real tekken_240911.json
with the version string set, the later control slots named), ours the GGUF of the same JSON.
"""
from __future__ import annotations

import json

import pytest

from tramontane.engine.api import ChatMessage, ToolCall, ToolSpec
from tramontane.engine.mistral3.chat_format import (encode_chat, instruct_version, new_call_id,
                                                    parse_tool_calls)

from support.tekken_versions import TEMPLATES, our_tokenizer, reference_tokenizer

pytest.importorskip("mistral_common")
from mistral_common.protocol.instruct.messages import (  # noqa: E402
    AssistantMessage, SystemMessage, ToolMessage, UserMessage)
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import (  # noqa: E402
    Function, FunctionCall, Tool)
from mistral_common.protocol.instruct.tool_calls import ToolCall as RefToolCall  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

_our_tokenizer = our_tokenizer


@pytest.fixture(scope="module", params=[7, 11, 13], ids=lambda v: f"v{v}")
def pair(request, tmp_path_factory):
    version = request.param
    return version, _our_tokenizer(version), reference_tokenizer(version, tmp_path_factory.mktemp("mc"))


WEATHER = ToolSpec("get_weather", "Weather now in a city, in Celsius or Fahrenheit", {
    "type": "object", "properties": {"city": {"type": "string", "description": "ville, e.g. Zürich"},
                                     "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"]})
TIME = ToolSpec("local_time", "", {"type": "object", "properties": {"tz": {"type": "string"}}})


def _ref_tool(t: ToolSpec) -> Tool:
    return Tool(function=Function(name=t.name, description=t.description, parameters=t.parameters))


def _ref_message(m: ChatMessage):
    text = "".join(p for p in m.parts if isinstance(p, str))
    if m.role == "system":
        return SystemMessage(content=text)
    if m.role == "user":
        return UserMessage(content=text)
    if m.role == "tool":
        return ToolMessage(content=text, tool_call_id=m.tool_call_id)
    calls = [RefToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
             for c in m.tool_calls] or None
    return AssistantMessage(content=text or None, tool_calls=calls)


def _reference_ids(ref: MistralTokenizer, messages, tools) -> list[int]:
    request = ChatCompletionRequest(messages=[_ref_message(m) for m in messages],
                                    tools=[_ref_tool(t) for t in tools] if tools else None)
    return ref.encode_chat_completion(request).tokens


def U(text):
    return ChatMessage("user", [text])


def S(text):
    return ChatMessage("system", [text])


def A(text="", *calls):
    return ChatMessage("assistant", [text] if text else [], list(calls))


def T(call_id, text):
    return ChatMessage("tool", [text], tool_call_id=call_id)


CALL_A = ToolCall("a1B2c3D4e", "get_weather", '{"city": "Paris", "unit": "c"}')
CALL_B = ToolCall("Zz9Yy8Xx7", "local_time", '{"tz":"Europe/Paris"}')  # compact JSON: normalised
CALL_C = ToolCall("q0w9e8r7t", "get_weather", "{}")

CONVERSATIONS = {
    "tools_only_first_turn": ([S("Be brief."), U("Weather in Paris?")], [WEATHER, TIME]),
    "one_call_and_result": ([U("Weather in Paris?"), A("", CALL_A), T(CALL_A.id, '{"temp": 21}')],
                            [WEATHER]),
    "parallel_calls_then_text_then_new_user": (
        [S("sys"), U("Weather and time in Paris?"), A("", CALL_A, CALL_B),
         T(CALL_A.id, "21 degrees"), T(CALL_B.id, "14:05"), A("It is 21 °C and 14:05."),
         U("And in Lyon?  ")], [WEATHER, TIME]),
    "results_given_out_of_call_order": (
        [U("both"), A("", CALL_A, CALL_B), T(CALL_B.id, "14:05"), T(CALL_A.id, "sunny")], [WEATHER, TIME]),
    "call_with_empty_arguments_and_text_before": (
        [U("go"), A("Let me check.", CALL_C), T(CALL_C.id, "ok"), A("Done."), U("thanks")], [WEATHER]),
    "history_calls_without_tools_now": (
        [U("q"), A("", CALL_A), T(CALL_A.id, "x"), A("y"), U("z")], None),
    "several_user_turns_tools_placement": (
        [U("first"), A("one"), U("second"), A("two"), U("third")], [TIME]),
    "plain_chat": ([S("a"), U("hello"), A("hi  "), U("bye")], None),
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_prompt_ids_match_mistral_common(pair, name):
    version, tok, ref = pair
    messages, tools = CONVERSATIONS[name]
    ours = encode_chat(tok, messages, tools=tools).ids
    assert ours == _reference_ids(ref, messages, tools)


def test_version_is_read_from_the_file(pair):
    version, tok, _ = pair
    assert instruct_version(tok) == version


def test_a_v7_template_name_is_v7_whatever_the_vocabulary():
    tok = _our_tokenizer(13)
    tok.chat_template = "mistral-v7-tekken"
    assert instruct_version(tok) == 7


def test_a_v13_template_that_only_mentions_call_ids_is_still_v13():
    tok = _our_tokenizer(13)
    tok.chat_template = "{#- older clients may send [CALL_ID]; it is not written #}" + TEMPLATES[13]
    assert instruct_version(tok) == 13
    tok.chat_template = None  # no template: the newer format
    assert instruct_version(tok) == 13


def test_v13_puts_tools_before_the_first_user_message_and_v7_before_the_last(pair):
    version, tok, _ = pair
    messages, tools = CONVERSATIONS["several_user_turns_tools_placement"]
    ids = encode_chat(tok, messages, tools=tools).ids
    at = ids.index(tok.token_id("[AVAILABLE_TOOLS]"))
    insts = [i for i, t in enumerate(ids) if t == tok.token_id("[INST]")]
    assert ids[ids.index(tok.token_id("[/AVAILABLE_TOOLS]")) + 1] == tok.token_id("[INST]")
    assert at < insts[0] if version == 13 else insts[1] < at < insts[2]


# ----------------------------------------------------------------------------- parsing replies

def _reply_text(tok, version, calls, content=""):
    """What the model writes for these calls (the assistant turn's ids minus </s>), decoded with
    control tokens by name, as the server decodes a tool-mode reply."""
    ids = encode_chat(tok, [U("x"), A(content, *calls)]).ids
    ids = ids[ids.index(tok.token_id("[/INST]")) + 1:-1]
    return tok.decode(ids, skip_special=False)


@pytest.mark.parametrize("content", ["", "Checking. "])
def test_parse_reads_back_what_the_format_writes(pair, content):
    version, tok, _ = pair
    calls = [CALL_A, CALL_B]
    parsed = parse_tool_calls(_reply_text(tok, version, calls, content), version)
    assert parsed is not None
    assert parsed.content == content.rstrip(" ")
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == \
        [(c.name, json.loads(c.arguments)) for c in calls]
    ids = [c.id for c in parsed.tool_calls]
    if version == 13:  # the format carries no ids: fresh ones
        assert all(len(i) == 9 and i.isalnum() for i in ids) and len(set(ids)) == 2
    else:
        assert ids == [CALL_A.id, CALL_B.id]


@pytest.mark.parametrize("version, text", [
    (7, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}"),  # cut off
    (7, "[TOOL_CALLS]not json"),
    (7, "[TOOL_CALLS][{\"arguments\": {}}]"),  # no name
    (13, "[TOOL_CALLS]get_weather{\"city\": 1}"),  # no [ARGS]
    (13, "[TOOL_CALLS]get_weather[ARGS]{\"city\": "),
    (13, "[TOOL_CALLS][ARGS]{}"),
    (11, "[TOOL_CALLS]f[CALL_ID]abc[ARGS][1, 2]"),  # arguments must be an object
    (13, "[TOOL_CALLS]f[ARGS]{} trailing"),
])
def test_malformed_calls_are_not_calls(version, text):
    assert parse_tool_calls(text, version) is None


def test_text_without_calls_is_not_a_call():
    assert parse_tool_calls("Just words [TOOL_CALL] nearly", 13) is None


def test_call_ids_are_nine_alphanumerics():
    ids = {new_call_id() for _ in range(200)}
    assert len(ids) == 200 and all(len(i) == 9 and i.isalnum() and i.isascii() for i in ids)
