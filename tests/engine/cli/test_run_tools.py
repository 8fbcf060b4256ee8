"""`tramontane-cli run --messages --tools --response-format`: the prompt is mistral-common's
encoding of the same OpenAI conversation, the reply is constrained, `--json` carries tool_calls."""
from __future__ import annotations

import json
import os

import pytest

from tramontane.engine.cli.main import main as cli_main

from support.scripted import ScriptedLogits, script_logits
from support import FIXTURES

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("mistral_common")
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

MODEL = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "maxLength": 8}},
                                               "required": ["city"]}}}]
MESSAGES = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Nice?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Nice\"}"}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny, 24"},
    {"role": "assistant", "content": "Sunny and 24."},
    {"role": "user", "content": "And Lyon?"},
]


@pytest.fixture
def files(tmp_path):
    def write(name, obj):
        path = tmp_path / name
        path.write_text(json.dumps(obj), encoding="utf-8")
        return str(path)
    return write


def run_json(capsys, *args) -> dict:
    assert cli_main(["run", "--model", MODEL, "--device", "cpu", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def reference_prompt(messages, tools, tmp_path):
    data = json.loads((FIXTURES / "tekken_tiny.json").read_text(encoding="utf-8"))
    data["config"]["version"] = "v7"
    path = tmp_path / "tekken_tiny_v7.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    request = ChatCompletionRequest.from_openai(messages=messages, tools=tools)
    return MistralTokenizer.from_file(str(path)).encode_chat_completion(request).tokens


def test_messages_and_tools_give_mistral_commons_prompt(capsys, files, tmp_path):
    out = run_json(capsys, "--messages", files("m.json", MESSAGES), "--tools", files("t.json", TOOLS),
                   "--max-tokens", "3", "--temperature", "0")
    assert out["prompt_token_ids"] == reference_prompt(MESSAGES, TOOLS, tmp_path)


def test_a_tool_call_reply_is_in_json_as_tool_calls(capsys, files, monkeypatch, tmp_path):
    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.mistral3.tokenizer import Tokenizer

    with open_gguf(MODEL) as gf:
        tok = Tokenizer.from_gguf(gf)
    ids = [tok.token_id("[TOOL_CALLS]"), *tok.encode('[{"name": "get_weather", "arguments": {"city": "Lyon"}}]')]
    script_logits(monkeypatch, ScriptedLogits(ids, tok.eos_id))
    out = run_json(capsys, "--messages", files("m.json", MESSAGES), "--tools", files("t.json", TOOLS))
    assert out["finish_reason"] == "tool_calls" and out["text"] == ""
    (call,) = out["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Lyon"} and len(call["id"]) == 9


@pytest.mark.parametrize("seed", range(3))
def test_required_tool_choice_constrains_a_random_model(capsys, files, seed):
    out = run_json(capsys, "--prompt", "hi", "--tools", files("t.json", TOOLS), "--tool-choice", "required",
                   "--temperature", "1", "--seed", str(seed), "--max-tokens", "200")
    schema = {**TOOLS[0]["function"]["parameters"], "additionalProperties": False}
    if out["finish_reason"] == "tool_calls":
        assert out["tool_calls"] and out["text"] == ""
        for call in out["tool_calls"]:
            assert call["function"]["name"] == "get_weather"
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        return
    # a random model may keep adding calls to the array until the token limit: the calls so far
    # come back as tool_calls (the last one's arguments unfinished, as OpenAI answers), and every
    # call it finished is still one the schema allows
    assert out["finish_reason"] == "length"
    if out.get("tool_calls"):
        assert out["text"] == "" and all(c["function"]["name"] == "get_weather" for c in out["tool_calls"])
        for call in out["tool_calls"][:-1]:
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        return
    assert out["text"].startswith("[{")
    decoder, text, at, calls = json.JSONDecoder(), out["text"], 1, 0
    while True:
        try:
            call, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        assert set(call) <= {"name", "arguments", "id"} and call["name"] == "get_weather"
        jsonschema.validate(call["arguments"], schema)
        calls += 1
        if not text.startswith(", ", at):
            break
        at += 2
    assert calls >= 1


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99}},
          "required": ["ok", "n"], "additionalProperties": False}


@pytest.mark.parametrize("as_response_format", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_response_format_file_constrains_the_reply(capsys, files, seed, as_response_format):
    spec = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}} if as_response_format else SCHEMA
    out = run_json(capsys, "--prompt", "hi", "--response-format", files("s.json", spec),
                   "--temperature", "1", "--seed", str(seed), "--max-tokens", "100")
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert "tool_calls" not in out


@pytest.mark.parametrize("name, content, words", [
    ("m.json", "[{\"role\": \"tool\", \"content\": \"x\"}]", "m.json: messages[0].tool_call_id"),
    ("m.json", "not json", "m.json: the messages is not valid JSON"),
    ("t.json", "{\"type\": \"function\"}", "t.json: tools: must be a list"),
    ("s.json", "{\"type\": \"no-such\"}", "s.json: response_format: the schema cannot be used"),
])
def test_bad_files_are_one_error_naming_the_file(capsys, tmp_path, name, content, words):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    flag = {"m.json": "--messages", "t.json": "--tools", "s.json": "--response-format"}[name]
    args = ["run", "--model", MODEL, "--device", "cpu", flag, str(path)]
    if flag != "--messages":
        args += ["--prompt", "hi"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_prompt_or_messages_is_required(capsys):
    assert cli_main(["run", "--model", MODEL, "--device", "cpu"]) == 2
    assert "give --prompt or --messages" in capsys.readouterr().err
