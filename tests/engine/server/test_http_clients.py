"""The server meets clients where they are: any model name, aliases, routes without /v1, /health,
`n` choices, lists of prompts, an assistant prefix continued as mistral-common encodes it, OpenAI's
over-context error, and no file path in any message. References: the official `openai` client,
mistral-common's encoder, and the same engine called in-process."""
from __future__ import annotations

import dataclasses
import http.client
import json
import shutil

import pytest

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")

from tramontane.engine.api import ChatMessage, SamplingParams  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import ThreadExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.engines import local_engine_fixture  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
NAME = "mistral3_tiny-f32"


def start(engine, **kw) -> tuple[OpenAIServer, ThreadExecutor]:
    executor = ThreadExecutor(engine)
    return OpenAIServer(executor, port=0, **kw).start(), executor


def client(url: str) -> "openai.OpenAI":
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def raw(url: str, method: str, path: str, body: bytes | None = None, headers=None) -> tuple[int, dict]:
    host, port = url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


engine = local_engine_fixture(MODEL)


@pytest.fixture(scope="module")
def served(engine):
    finished = []
    server, executor = start(engine, aliases=("gpt-4o-mini", "local"), on_finished=finished.append)
    server.finished = finished
    yield server
    server.stop()
    executor.shutdown()


@pytest.fixture(scope="module")
def reference():
    e = LocalEngine(MODEL, None, device="cpu")
    yield e
    e.close()


def test_any_model_name_is_answered_by_the_loaded_model_and_aliases_are_listed(served):
    c = client(served.url)
    r = c.chat.completions.create(model="gpt-4-turbo", messages=[{"role": "user", "content": "hi"}],
                                  max_tokens=2, temperature=0)
    assert r.model == NAME  # the reply names what answered
    assert c.completions.create(model="whatever", prompt="x", max_tokens=1).model == NAME
    assert [m.id for m in c.models.list().data] == [NAME, "gpt-4o-mini", "local"]
    assert c.models.retrieve("local").id == "local"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("not-listed")


def test_strict_model_restores_404_for_unlisted_names(engine):
    server, executor = start(engine, aliases=("local",), strict_model=True)
    try:
        c = client(server.url)
        with pytest.raises(openai.NotFoundError) as info:
            c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert info.value.body["code"] == "model_not_found" and "'local'" in info.value.body["message"]
        assert c.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=1).model == NAME
    finally:
        server.stop()
        executor.shutdown()


def test_routes_answer_with_and_without_v1_and_health_is_llama_servers(served):
    base = served.url[: -len("/v1")]
    c = client(base)  # a base URL without /v1
    assert c.models.list().data[0].id == NAME
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.usage.completion_tokens <= 2
    for path in ("/health", "/v1/health"):
        assert raw(served.url, "GET", path) == (200, {"status": "ok"})


class Loading:
    """An executor with no model yet."""

    def served_model(self):
        return None

    def submit(self, job):
        raise AssertionError("nothing runs while loading")


def test_health_is_503_while_the_model_loads():
    server = OpenAIServer(Loading(), port=0, api_key="sk-k").start()
    try:
        status, body = raw(server.url, "GET", "/health")  # no key needed: a load balancer's probe
        assert status == 503 and body["error"]["code"] == 503 and body["error"]["type"] == "unavailable_error"
        status, body = raw(server.url, "GET", "/v1/models", headers={"Authorization": "Bearer sk-k"})
        assert status == 503 and body["error"]["code"] == "model_not_loaded"
    finally:
        server.stop()


def test_n_choices_share_the_prompt_and_each_equals_the_in_process_reply(served, reference):
    messages = [{"role": "user", "content": "Tell me a story."}]
    params = SamplingParams(max_tokens=8, temperature=0.9, top_k=40, seed=77, ignore_eos=True)
    want = [reference.chat([ChatMessage.text("user", "Tell me a story.")],
                           dataclasses.replace(params, seed=77 + i), session_key=f"n-{i}") for i in range(3)]
    assert len({w.text for w in want}) > 1  # the seeds differ, so the choices do
    before = len(served.finished)
    r = client(served.url).chat.completions.create(
        model=NAME, messages=messages, n=3, max_tokens=8, temperature=0.9, seed=77,
        extra_body={"top_k": 40, "ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == [w.text for w in want]
    n_prompt = len(want[0].prompt_token_ids)
    assert r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 24
    runs = [f.result for f in served.finished[before:]]
    assert len(runs) == 3
    # The prompt is prefilled once: each later choice recomputes only its last token.
    assert [x.stats.prefilled_tokens for x in runs[1:]] == [1, 1]
    # Streamed: the same choices, told apart by index.
    stream = client(served.url).chat.completions.create(
        model=NAME, messages=messages, n=3, max_tokens=8, temperature=0.9, seed=77, stream=True,
        stream_options={"include_usage": True}, extra_body={"top_k": 40, "ignore_eos": True})
    texts, finishes, last = {}, {}, None
    for chunk in stream:
        last = chunk
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert texts == {i: w.text for i, w in enumerate(want)} and finishes == {0: "length", 1: "length", 2: "length"}
    assert last.usage.completion_tokens == 24 and last.usage.prompt_tokens == n_prompt


def test_a_list_of_prompts_gets_choices_indexed_across_prompts(served, reference):
    tok = reference.tokenizer
    prompts = ["Once upon a time", "The sea"]
    params = SamplingParams(max_tokens=5, temperature=0.8, seed=5, ignore_eos=True)
    want = [reference.complete([tok.bos_id, *tok.encode(p)], dataclasses.replace(params, seed=5 + i))
            for p in prompts for i in range(2)]
    r = client(served.url).completions.create(model=NAME, prompt=prompts, n=2, max_tokens=5, temperature=0.8,
                                              seed=5, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [w.text for w in want]
    assert r.usage.prompt_tokens == len(want[0].prompt_token_ids) + len(want[2].prompt_token_ids)
    assert r.usage.completion_tokens == 20
    ids = [[tok.bos_id, *tok.encode(p)] for p in prompts]  # token-id prompts too
    r = client(served.url).completions.create(model=NAME, prompt=ids, max_tokens=5, temperature=0.8, seed=5,
                                              extra_body={"ignore_eos": True})
    assert [c.text for c in r.choices] == [want[0].text, want[2].text]


def test_an_assistant_message_last_is_continued_as_mistral_commons_prefix(served, reference):
    pytest.importorskip("mistral_common")
    from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    mc = MistralTokenizer.from_file(str(FIXTURES / "tekken_tiny.json"))
    for prefix in ("Once upon a time, ", "The answer is"):
        want_ids = mc.encode_chat_completion(ChatCompletionRequest(messages=[
            SystemMessage(content="Be brief."), UserMessage(content="Tell me a story."),
            AssistantMessage(content=prefix, prefix=True)])).tokens
        want = reference.complete(want_ids, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
        r = client(served.url).chat.completions.create(model=NAME, messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."},
            {"role": "assistant", "content": prefix}], max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
        assert served.finished[-1].result.prompt_token_ids == want_ids  # no </s>, no [INST]
        assert r.choices[0].message.content == want.text


def test_over_context_is_openais_context_length_exceeded(served):
    c = client(served.url)
    for call in (lambda: c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "word " * 600}]),
                 lambda: c.completions.create(model=NAME, prompt=[5] * 600),
                 lambda: c.completions.create(model=NAME, prompt=["fine", "word " * 600])):
        with pytest.raises(openai.BadRequestError) as info:
            call()
        err = info.value.body
        assert err["type"] == "invalid_request_error" and err["code"] == "context_length_exceeded", err
        assert "maximum context length is 512 tokens" in err["message"]


def test_max_tokens_zero_is_refused(served):
    with pytest.raises(openai.BadRequestError) as info:
        client(served.url).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=0)
    assert info.value.body["param"] == "max_tokens"


class Broken:
    """An engine whose generation fails with an OS error naming a file (a disk gone away)."""

    def __init__(self, engine, path):
        self._engine, self._path = engine, path

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate_from(self, *a, **kw):
        raise FileNotFoundError(2, "No such file or directory", self._path)

    chat = complete = generate_from


def test_no_api_message_names_a_file_path(tmp_path):
    hidden = tmp_path / "very private folder"
    hidden.mkdir()
    path = hidden / MODEL.name
    shutil.copyfile(MODEL, path)
    engine = LocalEngine(path, None, device="cpu")
    server, executor = start(engine)
    broken = OpenAIServer(ThreadExecutor(Broken(engine, str(hidden / "kv.bin"))), port=0).start()
    messages = []
    try:
        url = server.url
        cases = [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 600}]}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 100_000}]}),
            ("/v1/completions", {"prompt": [5] * 600}),
            ("/v1/completions", {"prompt": [10 ** 6]}),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 0}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
            ("/v1/nowhere", {}),
        ]
        for route, body in cases:
            status, reply = raw(url, "POST", route, json.dumps(body).encode())
            assert status >= 400
            messages.append(reply["error"]["message"])
        status, reply = raw(broken.url, "POST", "/v1/chat/completions",
                            json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
        assert status == 500
        messages.append(reply["error"]["message"])
        engine.close()  # now every request meets the engine's "closed" error, which names its file
        status, reply = raw(url, "POST", "/v1/chat/completions",
                            json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode())
        assert status == 400
        messages.append(reply["error"]["message"])
    finally:
        broken.stop()
        server.stop()
        executor.shutdown()
    assert all(messages) and len(messages) == 9
    for message in messages:
        assert str(hidden) not in message and "private" not in message, message
    assert "kv.bin" in messages[-2] and MODEL.name in messages[-1]  # the file's own name stays: it says which


def test_serve_cli_takes_aliases_strict_model_and_connection_limits():
    import argparse

    from tramontane.engine.api import EngineError
    from tramontane.engine.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_parsers(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", "m.gguf", "--alias", "a", "--alias", "b", "--strict-model",
                              "--header-timeout", "5", "--idle-timeout", "9", "--max-connections", "3"])
    assert args.alias == ["a", "b"] and args.strict_model and args.header_timeout == 5.0
    assert args.idle_timeout == 9.0 and args.max_connections == 3 and args.body_timeout == 300.0
    for bad, words in ((["--max-connections", "0"], "--max-connections must be at least 1"),
                       (["--header-timeout", "0"], "--header-timeout must be more than 0"),
                       (["--alias", " "], "--alias needs a name")):
        with pytest.raises(EngineError, match=words):
            serve.serve_main(parser.parse_args(["serve", "--model", "/nonexistent/m.gguf", *bad]))
