"""server/tools_api.py on its own: tools, tool_choice, logprobs and assistant tool_calls parsed
with errors naming the field; the reply's shapes read back by the official openai client's
types (the reference nobody here wrote): tool_calls, streamed tool-call deltas re-assembled as
a client does, logprobs; the legacy logprobs' text offsets; the tool-mode stream filter."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="the official client's types are the reference (test extra)")

from openai.types.chat import ChatCompletionMessageToolCall  # noqa: E402
from openai.types.chat.chat_completion import ChoiceLogprobs  # noqa: E402
from openai.types.chat.chat_completion_chunk import ChoiceDelta  # noqa: E402

from tramontane.engine.api import GenerationResult, GenerationStats, TokenLogprob, ToolCall, ToolSpec  # noqa: E402
from tramontane.engine.server import tools_api  # noqa: E402
from tramontane.engine.server.errors import ApiError  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "weather", "description": "today's weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALLS = [ToolCall("call_1", "weather", '{"city": "Perpignan", "note": "' + "x" * 60 + '"}'),
         ToolCall("call_2", "time", "{}")]


def refused(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args)
    assert info.value.status == 400
    return info.value


def test_tools_are_parsed_and_every_refusal_names_its_field():
    assert tools_api.parse_tools([WEATHER]) == [ToolSpec("weather", "today's weather",
                                                         WEATHER["function"]["parameters"])]
    assert tools_api.parse_tools(None) == []
    assert refused(tools_api.parse_tools, {"a": 1}).param == "tools"
    assert refused(tools_api.parse_tools, [WEATHER, {"type": "retrieval"}]).param == "tools[1].type"
    assert refused(tools_api.parse_tools, [{"type": "function", "function": {"name": "a b"}}]).param \
        == "tools[0].function.name"
    assert "given twice" in refused(tools_api.parse_tools, [WEATHER, WEATHER]).message
    assert refused(tools_api.parse_tools, [{"function": {"name": "f", "parameters": []}}]).param \
        == "tools[0].function.parameters"
    many = [{"function": {"name": f"f{i}"}} for i in range(tools_api.MAX_TOOLS + 1)]
    assert f"at most {tools_api.MAX_TOOLS} tools" in refused(tools_api.parse_tools, many).message


def test_tool_choice_forms():
    tools = tools_api.parse_tools([WEATHER])
    assert tools_api.parse_tool_choice(None, tools) == ("auto", None)
    assert tools_api.parse_tool_choice("none", tools) == ("none", None)
    assert tools_api.parse_tool_choice("required", tools) == ("required", None)
    assert tools_api.parse_tool_choice({"type": "function", "function": {"name": "weather"}}, tools) \
        == ("named", "weather")
    assert "needs tools" in refused(tools_api.parse_tool_choice, "required", []).message
    assert "not among the tools" in refused(tools_api.parse_tool_choice,
                                            {"type": "function", "function": {"name": "nope"}}, tools).message
    assert refused(tools_api.parse_tool_choice, "sometimes", tools).param == "tool_choice"
    none = tools_api.parse_tool_request({"tools": [WEATHER], "tool_choice": "none"})
    assert none.tools == [] and not none.calls_tools
    assert tools_api.parse_tool_request({"tools": [WEATHER]}).calls_tools


@pytest.mark.parametrize("body,want", [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0),
                                       ({"logprobs": True, "top_logprobs": 3}, 3)])
def test_logprobs_asked(body, want):
    assert tools_api.parse_logprobs(body) == want


@pytest.mark.parametrize("body,param", [({"logprobs": "yes"}, "logprobs"),
                                        ({"top_logprobs": 2}, "top_logprobs"),
                                        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
                                        ({"logprobs": True, "top_logprobs": True}, "top_logprobs")])
def test_logprobs_refused(body, param):
    assert refused(tools_api.parse_logprobs, body).param == param


def test_assistant_tool_calls_sent_back_by_a_client():
    raw = [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Céret"}}}]
    assert tools_api.parse_tool_calls_field(raw, "messages[1]") == [
        ToolCall("c1", "weather", json.dumps({"city": "Céret"}, ensure_ascii=False))]
    assert refused(tools_api.parse_tool_calls_field, [{"function": {"name": "f"}}], "messages[1]").param \
        == "messages[1].tool_calls[0].id"
    assert refused(tools_api.parse_tool_calls_field, "x", "messages[1]").param == "messages[1].tool_calls"
    message = tools_api.parse_tool_message({"role": "tool", "tool_call_id": "c1",
                                            "content": [{"type": "text", "text": "sun"}]}, "messages[2]")
    assert (message.role, message.parts, message.tool_call_id) == ("tool", ["sun"], "c1")
    assert refused(tools_api.parse_tool_message, {"role": "tool", "content": "x"}, "messages[2]").param \
        == "messages[2].tool_call_id"


def test_tool_calls_read_by_the_client_types():
    for call, json_call in zip(CALLS, tools_api.tool_calls_json(CALLS)):
        parsed = ChatCompletionMessageToolCall.model_validate(json_call)
        assert (parsed.id, parsed.function.name, parsed.function.arguments) == (call.id, call.name, call.arguments)


def test_streamed_deltas_reassemble_into_the_calls_as_a_client_does():
    calls: dict[int, dict] = {}
    for delta in tools_api.tool_call_deltas(CALLS):
        for piece in ChoiceDelta.model_validate(delta).tool_calls:
            got = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            got["id"] = piece.id or got["id"]
            got["name"] += piece.function.name or ""
            got["arguments"] += piece.function.arguments or ""
    assert [ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())] == CALLS


def test_logprobs_shapes():
    e_acute = "é".encode()
    entries = [TokenLogprob(1, -0.5, (TokenLogprob(1, -0.5, token="Cé", token_bytes=b"C" + e_acute[:1]),),
                            token="Cé", token_bytes=b"C" + e_acute[:1]),
               TokenLogprob(2, -1.25, token="", token_bytes=e_acute[1:]),
               TokenLogprob(3, -0.1, token="ret", token_bytes=b"ret")]
    parsed = ChoiceLogprobs.model_validate(tools_api.logprobs_json(entries))
    assert [(c.token, c.logprob, c.bytes) for c in parsed.content] == [
        ("Cé", -0.5, [67, e_acute[0]]), ("", -1.25, [e_acute[1]]), ("ret", -0.1, list(b"ret"))]
    assert parsed.content[0].top_logprobs[0].token == "Cé"
    legacy = tools_api.legacy_logprobs_json(entries)
    # Offsets in characters: "C" (the é's first byte waits for its second), then "é", then "ret".
    assert legacy["text_offset"] == [0, 1, 2]
    assert legacy["tokens"] == ["Cé", "", "ret"] and legacy["top_logprobs"][0] == {"Cé": -0.5}
    assert tools_api.logprobs_json(None) is None and tools_api.legacy_logprobs_json(None) is None


def result(text: str, calls=()) -> GenerationResult:
    return GenerationResult(text, [], [], GenerationStats(), tool_calls=list(calls))


def test_the_stream_shows_text_before_the_marker_and_holds_the_rest():
    stream = tools_api.ToolStream()
    shown = [d for piece in ("Let me look", " [TOOL", "_CALLS]weather", '{"city": 1}') for d in stream.feed(piece)]
    assert "".join(d["content"] for d in shown) == "Let me look "
    tail = stream.finish(result("Let me look ", CALLS[:1]))
    assert all("tool_calls" in d for d in tail) and tail == tools_api.tool_call_deltas(CALLS[:1])

    plain = tools_api.ToolStream()
    shown = [d for piece in ("no call: [TOOL_", "CALLS] broken") for d in plain.feed(piece)]
    assert "".join(d["content"] for d in shown) == "no call: "
    text = "no call: [TOOL_CALLS] broken"
    assert plain.finish(result(text)) == [{"content": "[TOOL_CALLS] broken"}]  # held text, as content


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_llama_servers_schema_and_grammar_fields_are_the_grammars_vllms_names_give():
    """llama-server's `json_schema`, `grammar` (GBNF) and `response_format: {type: json_object,
    schema}` (its server suite and its web UI send them) constrain as vLLM's fields do."""
    pytest.importorskip("llguidance")
    structured = tools_api.structured_output_grammar
    assert structured({"json_schema": SCHEMA}) == structured({"guided_json": SCHEMA})
    assert tools_api.parse_response_format({"type": "json_object", "schema": SCHEMA}) \
        == tools_api.parse_response_format({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    assert tools_api.parse_response_format({"type": "json_object"}) == tools_api.output_grammar(None, "x")
    # GBNF read as llama.cpp reads it: its `root` is Lark's `start`
    assert structured({"grammar": 'root ::= "yes" | "no"'}).split() == ["%llguidance", "{}", "start:", '"yes"',
                                                                        "|", '"no"']
    bad = refused(structured, {"grammar": "root ::= ("})
    assert (bad.param, bad.code) == ("grammar", "invalid_grammar") and "GBNF" in bad.message
    assert refused(structured, {"grammar": 'start: "yes"'}).param == "grammar"  # Lark is not GBNF
    assert refused(structured, {"grammar": " "}).param == "grammar"
    assert refused(structured, {"json_schema": SCHEMA, "grammar": 'root ::= "a"'}).param == "json_schema"
    assert refused(tools_api.parse_response_format, {"type": "json_object", "schema": "x"}).param \
        == "response_format.schema"
    both = refused(tools_api.parse_tool_request, {"response_format": {"type": "json_object"},
                                                  "grammar": 'root ::= "a"'})
    assert both.param == "response_format" and "grammar" in both.message


ARGUMENT_TEXTS = ['{"city": "Paris", "n": 12, "x": [1, 2.5e3, {"b": true, "c": null}], "s": "a\\"b\\\\c\\u00e9",'
                  ' "e": {}, "f": [], "neg": -0.5, "z": false}',
                  '{ "a" : [ "x" , "y" ] , "b" :  { "c" : -12.25E+2 } }', '{"k":"v"}', '["not", "an object"]']


def test_a_cut_calls_arguments_are_what_the_anthropic_sdk_reads_from_its_stream():
    # jiter's partial mode is how the anthropic SDK builds a tool_use input from input_json_delta
    # pieces: a whole reply's input must be what the client makes of the same reply streamed
    jiter = pytest.importorskip("jiter", reason="the anthropic and openai clients' JSON reader (test extra)")
    for text in ARGUMENT_TEXTS:
        for end in range(1, len(text) + 1):
            want = jiter.from_json(text[:end].encode(), partial_mode=True)
            got = tools_api.arguments_object(ToolCall("c1", "f", text[:end]))
            assert got == (want if isinstance(want, dict) else {}), text[:end]
    assert tools_api.arguments_object(ToolCall("c1", "f", "not json")) == {}
