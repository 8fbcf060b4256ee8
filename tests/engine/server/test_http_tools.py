"""Tools, tool_choice, response_format and logprobs through the server, driven by the official
`openai` client (the reference for OpenAI's shapes).

A tiny random model cannot decide to call a tool, so where a given reply is needed the
test-only scripted-logits hook makes it write that reply token by token through the real
generation loop; where a grammar is on (required / named tool, json_schema), the random model
writes freely and the output must still validate (jsonschema). Prompts are compared with
mistral-common's encoder of the same conversation on the model's own vocabulary.
"""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import BatchExecutor, ThreadExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402

from support.scripted import ScriptedLogits, script_logits
from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
TINY_JSON = FIXTURES / "tekken_tiny.json"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "local_time", "parameters": {"type": "object", "properties": {
        "tz": {"type": "string", "maxLength": 6}}, "required": ["tz"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


class Served:
    def __init__(self, owner: str):
        self.engine = LocalEngine(MODEL, device="cpu", context_length=2048)
        self.finished = []
        self.owner = owner  # the window's one-at-a-time owner, or the CLI server's batching one
        self.executor = ThreadExecutor(self.engine) if owner == "thread" else BatchExecutor(self.engine, slots=2)
        self.server = OpenAIServer(self.executor, port=0, on_finished=self.finished.append).start()
        self.client = openai.OpenAI(base_url=self.server.url, api_key="x", max_retries=0, timeout=120)

    def close(self):
        self.server.stop()
        self.executor.shutdown()
        self.engine.close()


@pytest.fixture(scope="module", params=["thread", "batch"])
def served(request):
    s = Served(request.param)
    yield s
    s.close()


def _reference_prompt(messages, tools):
    """mistral-common's prompt ids for an OpenAI conversation, on the tiny model's vocabulary."""
    import pathlib
    import tempfile

    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    data = json.loads(TINY_JSON.read_text(encoding="utf-8"))
    data["config"]["version"] = "v7"
    path = pathlib.Path(tempfile.mkdtemp()) / "tekken_tiny_v7.json"  # "tekken" in the name: its format
    path.write_text(json.dumps(data), encoding="utf-8")
    ref = MistralTokenizer.from_file(str(path))
    request = ChatCompletionRequest.from_openai(messages=messages, tools=tools)
    return ref.encode_chat_completion(request).tokens


CALL_TEXT = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]'


def test_a_whole_tool_loop_with_the_official_client(served, script):
    script("[TOOL_CALLS]", CALL_TEXT)
    first = served.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}
    assert len(call.id) == 9 and call.id.isalnum()
    assert served.finished[-1].result.prompt_token_ids == _reference_prompt(ASK, [WEATHER, TIME])

    script("It is 21 degrees in Paris.")
    messages = ASK + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    second = served.client.chat.completions.create(model="m", messages=messages, tools=[WEATHER, TIME])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "It is 21 degrees in Paris."
    assert second.choices[0].message.tool_calls is None
    # the call and its result went into the prompt as mistral-common writes them
    assert served.finished[-1].result.prompt_token_ids == _reference_prompt(messages, [WEATHER, TIME])


def _collect(stream):
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return chunks, deltas, finish


def test_streamed_parallel_calls_come_as_indexed_deltas(served, script):
    script("Checking both. ", "[TOOL_CALLS]",
           '[{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "f"}}, '
           '{"name": "local_time", "arguments": {"tz": "CET"}}]')
    stream = served.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME], stream=True)
    chunks, deltas, finish = _collect(stream)
    assert finish == ["tool_calls"]
    assert "".join(d.content or "" for d in deltas) == "Checking both. "  # as written, live
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert entry["id"] is None  # id and name once, in the call's first delta
                entry["id"], entry["name"] = tc.id, tc.function.name
            entry["arguments"] += tc.function.arguments or ""
    assert sorted(calls) == [0, 1]
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Lyon", "unit": "f"}
    assert calls[1]["name"] == "local_time" and json.loads(calls[1]["arguments"]) == {"tz": "CET"}
    assert sum(1 for d in deltas for tc in d.tool_calls or [] if tc.function.arguments) > 2  # in pieces


def test_parallel_tool_calls_false_keeps_one_call(served, script):
    script("[TOOL_CALLS]", '[{"name": "get_weather", "arguments": {"city": "A", "unit": "c"}}, '
                           '{"name": "local_time", "arguments": {"tz": "UTC"}}]')
    reply = served.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME],
                                                  parallel_tool_calls=False)
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_weather"]


@pytest.mark.parametrize("written", ["[TOOL_CALLS]not json at all", '[TOOL_CALLS][{"name": "nope", "arguments": {}}]'])
@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_call_comes_back_as_text_never_an_error(served, script, written, stream):
    script("[TOOL_CALLS]", written.split("[TOOL_CALLS]", 1)[1])
    args = dict(model="m", messages=ASK, tools=[WEATHER])
    if stream:
        _, deltas, finish = _collect(served.client.chat.completions.create(stream=True, **args))
        text = "".join(d.content or "" for d in deltas)
        assert not any(d.tool_calls for d in deltas)
    else:
        reply = served.client.chat.completions.create(**args)
        text, finish = reply.choices[0].message.content, [reply.choices[0].finish_reason]
        assert reply.choices[0].message.tool_calls is None
    assert finish == ["stop"]
    assert text == written.split("[TOOL_CALLS]", 1)[1]


@pytest.mark.parametrize("seed", range(4))
def test_required_makes_even_a_random_model_call_a_tool_validly(served, seed):
    reply = served.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME],
                                                  tool_choice="required", temperature=1.0, seed=seed,
                                                  max_tokens=300)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    specs = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), {**specs[call.function.name],
                                                                  "additionalProperties": False})


@pytest.mark.parametrize("seed", range(3))
def test_a_named_tool_is_the_one_called(served, seed):
    reply = served.client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], temperature=1.0, seed=seed, max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "local_time"}}, stream=False)
    calls = reply.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["local_time"]
    jsonschema.validate(json.loads(calls[0].function.arguments), TIME["function"]["parameters"])


def test_tool_choice_none_keeps_tools_out_of_the_prompt(served, script):
    script("[TOOL_CALLS]", CALL_TEXT)
    reply = served.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "stop"
    assert served.finished[-1].result.prompt_token_ids == _reference_prompt(ASK, None)


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["answer", "score"]}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_json_schema_strict_output_validates(served, seed, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    args = dict(model="m", messages=ASK, response_format=fmt, temperature=1.0, seed=seed, max_tokens=200)
    if stream:
        _, deltas, _ = _collect(served.client.chat.completions.create(stream=True, **args))
        text = "".join(d.content or "" for d in deltas)
    else:
        text = served.client.chat.completions.create(**args).choices[0].message.content
    jsonschema.validate(json.loads(text), {**SCHEMA, "additionalProperties": False})


def test_json_object_output_is_an_object(served):
    reply = served.client.chat.completions.create(model="m", messages=ASK, temperature=1.0, seed=1,
                                                  response_format={"type": "json_object"}, max_tokens=200)
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_and_top_logprobs(served, stream):
    args = dict(model="m", messages=ASK, temperature=0.0, max_tokens=5, logprobs=True, top_logprobs=3,
                extra_body={"ignore_eos": True})
    if stream:
        chunks, deltas, _ = _collect(served.client.chat.completions.create(stream=True, **args))
        content = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        text = "".join(d.content or "" for d in deltas)
    else:
        reply = served.client.chat.completions.create(**args)
        content, text = reply.choices[0].logprobs.content, reply.choices[0].message.content
    # one entry per generated token the content shows: a random model's control tokens, which the
    # content leaves out, are left out here too
    assert 0 < len(content) <= 5 and not any(e.token.startswith("<SPECIAL_") for e in content)
    assert "".join(bytes(e.bytes).decode("utf-8", "replace") for e in content) == text
    for e in content:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)


@pytest.mark.parametrize("kwargs, param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such"}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
])
def test_bad_tool_fields_are_400_naming_the_field(served, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        served.client.chat.completions.create(model="m", messages=ASK, **kwargs)
    assert err.value.body["param"] == param


def test_a_tool_message_must_name_its_call(served):
    with pytest.raises(openai.BadRequestError) as err:
        served.client.chat.completions.create(model="m", messages=ASK + [{"role": "tool", "content": "x"}])
    assert err.value.body["param"] == "messages[1].tool_call_id"


# ----------------------------------------------------------------------------- the v13 format

@pytest.fixture
def v13(served):
    """The served model speaking v13 (Ministral 3's format): its vocabulary with slots 32/33
    named [ARGS]/[CALL_ID] and a v13 template marker (the weights are random anyway)."""
    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.mistral3.chat_format import instruct_version
    from tramontane.engine.mistral3.tokenizer import Tokenizer

    with open_gguf(MODEL) as gf:
        kv = dict(gf.kv)
    tokens = list(kv["tokenizer.ggml.tokens"])
    tokens[32], tokens[33] = "[ARGS]", "[CALL_ID]"
    kv["tokenizer.ggml.tokens"] = tokens
    kv["tokenizer.chat_template"] = "{{- '[TOOL_CALLS]' + name + '[ARGS]' + arguments }}"
    tok = Tokenizer.from_kv(kv, "tiny-v13.gguf")
    assert instruct_version(tok) == 13
    if served.owner != "thread":
        pytest.skip("the batching scheduler keeps the tokenizer it started with")
    original = served.engine.tokenizer
    served.executor.submit(lambda engine: setattr(engine, "tokenizer", tok)).result()
    yield tok
    served.executor.submit(lambda engine: setattr(engine, "tokenizer", original)).result()


def _reference_prompt_v13(messages, tools):
    import pathlib
    import tempfile

    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    data = json.loads(TINY_JSON.read_text(encoding="utf-8"))
    data["config"]["version"] = "v13"
    for entry in data["special_tokens"]:
        entry["token_str"] = {32: "[ARGS]", 33: "[CALL_ID]"}.get(entry["rank"], entry["token_str"])
    path = pathlib.Path(tempfile.mkdtemp()) / "tekken_tiny_v13.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    request = ChatCompletionRequest.from_openai(messages=messages, tools=tools)
    return MistralTokenizer.from_file(str(path)).encode_chat_completion(request).tokens


def test_v13_tool_loop_streamed(served, v13, monkeypatch):
    ids = [v13.token_id("[TOOL_CALLS]"), *v13.encode("get_weather"), v13.token_id("[ARGS]"),
           *v13.encode('{"city": "Rome", "unit": "c"}'),
           v13.token_id("[TOOL_CALLS]"), *v13.encode("local_time"), v13.token_id("[ARGS]"),
           *v13.encode('{"tz": "CET"}')]
    script_logits(monkeypatch, ScriptedLogits(ids, v13.eos_id))
    _, deltas, finish = _collect(served.client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], stream=True))
    assert finish == ["tool_calls"]
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, {"arguments": ""})
            if tc.id:
                entry.update(id=tc.id, name=tc.function.name)
            entry["arguments"] += tc.function.arguments or ""
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "local_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Rome", "unit": "c"}
    assert json.loads(calls[1]["arguments"]) == {"tz": "CET"}
    assert all(len(c["id"]) == 9 for c in calls.values())
    assert served.finished[-1].result.prompt_token_ids == _reference_prompt_v13(ASK, [WEATHER, TIME])

    script_logits(monkeypatch, ScriptedLogits(v13.encode("Sunny, 14:05."), v13.eos_id))
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[i]["id"], "type": "function",
         "function": {"name": calls[i]["name"], "arguments": calls[i]["arguments"]}} for i in (0, 1)]}
    messages = ASK + [assistant, {"role": "tool", "tool_call_id": calls[1]["id"], "content": "14:05"},
                      {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"}]
    reply = served.client.chat.completions.create(model="m", messages=messages, tools=[WEATHER, TIME])
    assert reply.choices[0].message.content == "Sunny, 14:05." and reply.choices[0].finish_reason == "stop"
    # results given out of call order: v13 puts them back in call order, as mistral-common does
    assert served.finished[-1].result.prompt_token_ids == _reference_prompt_v13(messages, [WEATHER, TIME])


@pytest.mark.parametrize("seed", range(3))
def test_v13_required_call_validates(served, v13, seed):
    reply = served.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], seed=seed,
                                                  tool_choice="required", temperature=1.0, max_tokens=200)
    for call in reply.choices[0].message.tool_calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments),
                            {**WEATHER["function"]["parameters"], "additionalProperties": False})


@pytest.mark.parametrize("seed", range(4))
def test_auto_with_a_response_format_is_a_valid_call_or_a_valid_reply(served, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    reply = served.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], seed=seed,
                                                  response_format=fmt, temperature=1.0, max_tokens=200)
    message = reply.choices[0].message
    if message.tool_calls:
        assert reply.choices[0].finish_reason == "tool_calls"
        for call in message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments),
                                {**WEATHER["function"]["parameters"], "additionalProperties": False})
    else:
        jsonschema.validate(json.loads(message.content), {**SCHEMA, "additionalProperties": False})


def test_auto_with_a_response_format_still_lets_the_model_call(served, script):
    """The random model above always takes the JSON branch; scripted, it takes the call branch
    through the same grammar (a scripted token the grammar refused would end in an error)."""
    script("[TOOL_CALLS]", CALL_TEXT)
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    reply = served.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], response_format=fmt)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris", "unit": "c"}
