"""The edges clients and peers' suites trip on: llama-server's --cors-origin forms (`localhost`
for any page served from this machine, an origin without a scheme), the key as `x-api-key` as
well as Bearer, and JSON Schemas closed by default on the OpenAI path (a pydantic model's schema
leaves additionalProperties unset), OpenAI's `logit_bias`, through the official `openai` client."""
from __future__ import annotations

import http.client
import json

import pytest

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("llguidance")

from tramontane.engine.api import ChatMessage  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import ThreadExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402
from tramontane.engine.server.security import OriginRule  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
KEY = "sk-edge-test"


@pytest.fixture(scope="module")
def served():
    engine = LocalEngine(MODEL, device="cpu", context_length=2048)
    executor = ThreadExecutor(engine)
    server = OpenAIServer(executor, port=0, api_key=KEY, cors_origins=("localhost", "example.com:3000")).start()
    server.engine = engine
    yield server
    server.stop()
    executor.shutdown()
    engine.close()


def request(served, method: str, path: str, headers: dict) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, dict(resp.getheaders()), json.loads(body) if body else None
    finally:
        conn.close()


@pytest.mark.parametrize("origin, allowed", [
    ("http://localhost:5173", True), ("https://127.0.0.1", True), ("http://[::1]:8000", True),
    ("http://127.8.0.1:1", True), ("http://example.com:3000", True), ("https://EXAMPLE.com:3000/", True),
    ("http://example.com:3001", False), ("http://localhost.evil.com", False), ("http://evil.com", False),
    ("file://localhost", False)])
def test_cors_origin_forms_as_llama_server_reads_them(served, origin, allowed):
    assert any(OriginRule(r).allows(origin) for r in ("localhost", "example.com:3000")) is allowed
    status, headers, _ = request(served, "OPTIONS", "/v1/chat/completions", {
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    if allowed:
        assert status == 204 and headers["Access-Control-Allow-Origin"] == origin
    else:
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers, _ = request(served, "GET", "/v1/models", {"Origin": origin, "x-api-key": KEY})
    assert (status == 200) is allowed


def test_the_key_as_bearer_or_x_api_key(served):
    assert request(served, "GET", "/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200
    assert request(served, "GET", "/v1/models", {"x-api-key": KEY})[0] == 200
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, _, body = request(served, "GET", "/v1/models", headers)
        assert status == 401 and "x-api-key" in body["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.url, api_key="wrong", max_retries=0).models.list()


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    degrees: int
    sunny: bool


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_pydantic_schema_is_closed_by_default_on_chat_completions(served, seed):
    c = openai.OpenAI(base_url=served.url, api_key=KEY, max_retries=0, timeout=120)
    schema = Weather.model_json_schema()
    assert "additionalProperties" not in schema  # what instructor and LangChain send as it is
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}], max_tokens=120,
                                  temperature=1.0, seed=seed, response_format={
                                      "type": "json_schema", "json_schema": {"name": "weather", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    assert Weather.model_validate_json(r.choices[0].message.content).model_fields_set == {"city", "degrees", "sunny"}
    assert set(json.loads(r.choices[0].message.content)) == {"city", "degrees", "sunny"}
    parsed = c.chat.completions.parse(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                      max_tokens=120, temperature=1.0, seed=seed, response_format=Weather)
    assert isinstance(parsed.choices[0].message.parsed, Weather)


A, B = 1097, 1098  # the tiny tokenizer's byte tokens "a" and "b" (1000 control slots, then the bytes)


def test_logit_bias_moves_the_draw_on_chat_and_completions(served):
    """OpenAI's logit_bias (llama.cpp's suite and LangChain send it): added to the logits before
    sampling, so +100 makes a token all but certain and -100 bans it; it was refused before."""
    c = openai.OpenAI(base_url=served.url, api_key=KEY, max_retries=0, timeout=120)
    chat = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                     temperature=1.0, seed=3, logit_bias={str(A): 100})
    assert chat.choices[0].message.content == "aaaa"
    text = c.completions.create(model="m", prompt="Once", max_tokens=4, temperature=0.0,
                                logit_bias={str(A): -100, str(B): 100})
    assert text.choices[0].text == "bbbb"


@pytest.mark.parametrize("bias, words", [
    ({"2048": 1}, "token id 2048 is not in the model's vocabulary (0..2047)"),
    ({"x": 1}, "'x' is not a token id"),
    ({str(A): 101}, "must be a number in [-100, 100], got 101"),
])
def test_a_logit_bias_outside_openais_bounds_is_refused_by_name(served, bias, words):
    c = openai.OpenAI(base_url=served.url, api_key=KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as refused:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                  logit_bias=bias)
    assert words in refused.value.body["message"] and refused.value.body["param"] == "logit_bias"


def post(served, path: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {KEY}",
                                                      "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


PREFILL = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]


@pytest.mark.parametrize("flags, messages, words", [
    ({"add_generation_prompt": True, "continue_final_message": True}, PREFILL,
     "continue_final_message: cannot be true with add_generation_prompt true"),
    ({"continue_final_message": True}, PREFILL[:1], "needs a last message from the assistant to continue, got one from user"),
    ({"continue_final_message": "yes"}, PREFILL, "continue_final_message: must be true or false"),
])
def test_vllms_continuation_flags_that_contradict_the_messages_are_refused(served, flags, messages, words):
    """vLLM's add_generation_prompt / continue_final_message (llama.cpp's suite sends them): a
    contradiction was answered as a continuation (200), as if the flags were not there."""
    status, body = post(served, "/v1/chat/completions", {"messages": messages, "max_tokens": 2, **flags})
    assert status == 400 and words in body["error"]["message"]


def test_continue_final_message_continues_the_last_assistant_message(served):
    status, body = post(served, "/v1/chat/completions", {
        "messages": PREFILL, "max_tokens": 2, "temperature": 0, "add_generation_prompt": False,
        "continue_final_message": True})
    status_plain, plain = post(served, "/v1/chat/completions", {"messages": PREFILL, "max_tokens": 2, "temperature": 0})
    assert status == status_plain == 200
    assert body["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


def post(served, path: str, body) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Authorization": f"Bearer {KEY}",
                                                                   "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_tokenize_and_detokenize_in_llama_servers_and_vllms_shapes(served):
    """llama-server's /tokenize ({content, add_special, with_pieces}: its server suite, and
    clients counting tokens, call it) and vLLM's ({prompt | messages, add_special_tokens}), and
    /detokenize for both (they were 404)."""
    tok = served.engine.tokenizer
    text = "What is the capital of France? 媽 🤗"
    ids = tok.encode(text)
    status, body = post(served, "/tokenize", {"content": text})
    assert status == 200 and body["tokens"] == ids and body["count"] == len(ids)  # llama-server: no BOS
    assert post(served, "/tokenize", {"content": text, "add_special": True})[1]["tokens"] == [tok.bos_id, *ids]
    assert post(served, "/tokenize", {"prompt": text})[1]["tokens"] == [tok.bos_id, *ids]  # vLLM: BOS
    assert post(served, "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"] == ids
    pieces = post(served, "/tokenize", {"content": text, "with_pieces": True})[1]["tokens"]
    assert [p["id"] for p in pieces] == ids
    whole = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert whole.decode("utf-8") == text  # a piece that is not whole UTF-8 comes as its bytes
    chat = [{"role": "user", "content": text}]
    status, body = post(served, "/tokenize", {"messages": chat})
    assert status == 200 and body["tokens"] == list(served.engine.encode([ChatMessage.text("user", text)]).ids)
    assert body["tokens"][0] == tok.bos_id and body["count"] == len(body["tokens"])
    status, body = post(served, "/detokenize", {"tokens": [tok.bos_id, *ids]})
    assert status == 200 and body["content"] == body["prompt"] == tok.piece(tok.bos_id) + text
    for path, bad, param in [("/tokenize", {}, "content"), ("/tokenize", {"content": text, "prompt": text}, "content"),
                             ("/tokenize", {"content": 3}, "content"),
                             ("/tokenize", {"messages": chat, "add_special_tokens": True}, "add_special_tokens"),
                             ("/tokenize", {"content": text, "add_special": "yes"}, "add_special"),
                             ("/detokenize", {"tokens": "1 2"}, "tokens"),
                             ("/detokenize", {"tokens": [1, tok.vocab_size]}, "tokens[1]")]:
        status, body = post(served, path, bad)
        assert status == 400 and body["error"]["param"] == param, (path, bad, body)


@pytest.mark.parametrize("prompt, param", [([5, 99999], "prompt"), ([-1], "prompt"),
                                           (["a", [1, 2048]], "prompt[1]")])
def test_a_prompt_token_id_outside_the_vocabulary_is_refused_naming_the_prompt(served, prompt, param):
    """OpenAI's error names the field (`param`), as the other refusals do; it was null."""
    c = openai.OpenAI(base_url=served.url, api_key=KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as refused:
        c.completions.create(model="m", prompt=prompt, max_tokens=2)
    assert refused.value.param == param and "vocabulary (0..2047)" in refused.value.message
