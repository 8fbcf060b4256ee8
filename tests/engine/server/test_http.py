"""The OpenAI-compatible server on a loopback port, driven by the official `openai` client and by
Tramontane's own RemoteEngine, checked against the same engine called in-process."""
from __future__ import annotations

import base64
import http.client
import io
import json
import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest
from PIL import Image

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")

from tramontane.engine.api import ChatMessage, EngineError, ImagePart, SamplingParams  # noqa: E402
from tramontane.engine.remote.client import RemoteEngine  # noqa: E402
from tramontane.engine.remote.transport import RemoteError  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import ThreadExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer, check_bind  # noqa: E402
from tramontane.engine.server.openai_api import RequestLimits  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
NAME = "mistral3_tiny-f32"
KEY = "sk-local-5d1e-SECRET"


class Served:
    """An engine behind a server, plus what the server reported after each generation."""

    def __init__(self, engine, **server_kw):
        self.engine = engine
        self.finished: list = []
        self.executor = ThreadExecutor(engine)
        self.server = OpenAIServer(self.executor, port=0, on_finished=self.finished.append, **server_kw).start()
        self.url = self.server.url

    def client(self, **kw) -> "openai.OpenAI":
        kw.setdefault("api_key", "unused")
        return openai.OpenAI(base_url=self.url, max_retries=0, timeout=kw.pop("timeout", 60), **kw)

    def wait_finished(self, n: int, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while len(self.finished) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.finished) >= n, f"{len(self.finished)} generations finished, expected {n}"
        return self.finished[n - 1]

    def close(self):
        self.server.stop()
        self.executor.shutdown()


@pytest.fixture(scope="module")
def served():
    s = Served(LocalEngine(MODEL, MMPROJ, device="cpu"))
    yield s
    s.close()
    s.engine.close()


@pytest.fixture(scope="module")
def reference():
    """The same files in-process: what the window would answer."""
    engine = LocalEngine(MODEL, MMPROJ, device="cpu")
    yield engine
    engine.close()


def ask(engine, messages, params: SamplingParams):
    return engine.chat(messages, params, session_key=f"ref-{time.monotonic_ns()}")


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def photo(seed: int, size=(56, 42)) -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def raw_post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    """One request without any client library in the way (for bodies a client will not send)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


# ----------------------------------------------------------------------------- answers

def test_models_lists_the_loaded_model(served):
    models = served.client().models.list().data
    assert [m.id for m in models] == [NAME]
    assert models[0].model_extra["max_model_len"] == served.engine.context_size
    assert served.client().models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        served.client().models.retrieve("gpt-4o")


def test_non_streaming_reply_equals_the_in_process_reply(served, reference):
    messages = [ChatMessage.text("system", "You are terse."), ChatMessage.text("user", "Name three rivers.")]
    want = ask(reference, messages, greedy(12, ignore_eos=True))
    r = served.client().chat.completions.create(
        model=NAME, messages=[{"role": "system", "content": "You are terse."},
                              {"role": "user", "content": "Name three rivers."}],
        max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.model == NAME
    # a string, as OpenAI and llama-server send (about ten of llama.cpp's own server tests read it)
    assert isinstance(r.system_fingerprint, str) and r.system_fingerprint.startswith("fp_")
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    assert r.usage.completion_tokens == 12 and r.usage.total_tokens == len(want.prompt_token_ids) + 12
    assert served.finished[-1].result.token_ids == want.token_ids


def test_streaming_reply_equals_the_in_process_reply_piece_by_piece(served, reference):
    messages = [ChatMessage.text("user", "Stream me something.")]
    pieces: list[str] = []
    want = reference.chat(messages, greedy(20, ignore_eos=True), on_piece=pieces.append, session_key="stream")
    stream = served.client().chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Stream me something."}], max_tokens=20,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == want.text == "".join(pieces)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    assert len({c.system_fingerprint for c in chunks}) == 1 and chunks[0].system_fingerprint.startswith("fp_")


def test_a_growing_conversation_prefills_only_its_new_tokens(served):
    client = served.client()
    served.engine.pool.forget_all()  # nothing of the other tests' requests stays named: a cold start
    turn1 = [{"role": "user", "content": "Tell me about the sea, the tides and the waves. " * 6}]
    r1 = client.chat.completions.create(model=NAME, messages=turn1, max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
    first = served.finished[-1].result
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    # Another conversation in between takes the slot; the first one's blocks stay in the prefix cache.
    client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Unrelated."}],
                                   max_tokens=4, temperature=0)
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "And the mountains?"}]
    r2 = client.chat.completions.create(model=NAME, messages=turn2, max_tokens=8, temperature=0,
                                        stream=True, stream_options={"include_usage": True})
    usage = list(r2)[-1].usage
    second = served.finished[-1].result
    # What the KV held: turn 1's prompt and every generated token but the last (never fed back).
    held = first.prompt_token_ids + first.token_ids[:-1]
    common = next((i for i, (a, b) in enumerate(zip(held, second.prompt_token_ids)) if a != b),
                  min(len(held), len(second.prompt_token_ids)))
    # another conversation ran in between: turn 1's blocks stayed in the pool, every position of them
    assert usage.prompt_tokens_details.cached_tokens == common >= len(first.prompt_token_ids) > 0
    assert usage.prompt_tokens == len(second.prompt_token_ids)
    assert served.finished[-1].result.stats.prefilled_tokens == usage.prompt_tokens - common


def test_an_image_request_has_the_windows_prompt_ids_and_reply(served, reference):
    data = photo(7)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    window = [ChatMessage("user", ["What is in this picture?", ImagePart(data, "photo.png")])]
    want = ask(reference, window, greedy(10, ignore_eos=True))
    assert any(s for s in reference.encode(window).image_spans)
    r = served.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}]}],
        max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    got = served.finished[-1].result
    assert got.prompt_token_ids == want.prompt_token_ids == reference.encode(window).ids
    assert r.choices[0].message.content == want.text and got.token_ids == want.token_ids


def test_stop_strings_and_max_tokens(served, reference):
    messages = [ChatMessage.text("user", "Count for me.")]
    full = ask(reference, messages, greedy(24, ignore_eos=True))
    stop = full.text[len(full.text) // 2: len(full.text) // 2 + 2]
    cut = full.text[:full.text.index(stop)]
    client = served.client()
    body = dict(model=NAME, messages=[{"role": "user", "content": "Count for me."}], temperature=0,
                extra_body={"ignore_eos": True})
    r = client.chat.completions.create(max_tokens=24, stop=[stop, "\u2603never"], **body)
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop
    r = client.chat.completions.create(max_completion_tokens=3, **body)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    assert served.finished[-1].result.token_ids == full.token_ids[:3]


def test_raw_completions_continue_the_prompt_text_or_ids(served, reference):
    tok = reference.tokenizer
    ids = [tok.bos_id, *tok.encode("Once upon a time")]
    want = reference.complete(ids, greedy(6, ignore_eos=True))
    client = served.client()
    r = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == want.text and r.usage.prompt_tokens == len(ids)
    stream = client.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in stream) == want.text
    # Raw prompts share one KV entry: the same prompt again reuses all but its last token.
    assert served.finished[-1].result.stats.reused_tokens == len(ids) - 1


def test_remote_engine_gets_the_local_reply_for_the_same_seed_and_settings(served, reference):
    messages = [ChatMessage.text("system", "Be creative."), ChatMessage.text("user", "A short poem?")]
    params = SamplingParams(max_tokens=16, temperature=0.9, top_k=50, top_p=0.95, min_p=0.02,
                            repetition_penalty=1.1, seed=1234, ignore_eos=True)
    want = ask(reference, messages, params)
    remote = RemoteEngine(served.url, NAME, read_timeout=30)
    pieces: list[str] = []
    got = remote.chat(messages, params, on_piece=pieces.append)
    assert got.text == want.text == "".join(pieces)
    assert got.finish_reason == want.finish_reason == "length"
    assert got.stats.prompt_tokens == len(want.prompt_token_ids) and got.stats.generated_tokens == 16
    # A stop string comes back as the window's "stop_string" through vLLM's stop_reason.
    stop = want.text[5:7]
    stopped = remote.chat(messages, SamplingParams(**{**params.__dict__, "stop": [stop]}))
    assert stopped.finish_reason == "stop_string" and stopped.text == want.text[:want.text.index(stop)]
    assert remote.list_models()[0].max_model_len == served.engine.context_size


# ----------------------------------------------------------------------------- errors

def test_errors_come_in_openais_shape_with_the_right_status(served):
    client = served.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}}]}])
    assert "only data: URLs are accepted" in info.value.body["message"]
    assert info.value.body["param"] == "messages[0].content[0].image_url.url"
    with pytest.raises(openai.BadRequestError, match="presence_penalty: not supported"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                       presence_penalty=0.4)
    # The engine's own refusals too: a prompt longer than the context is a 400 in words.
    with pytest.raises(openai.BadRequestError, match="maximum context length is 512 tokens") as info:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "word " * 600}])
    assert info.value.body["code"] == "context_length_exceeded" and info.value.body["param"] == "messages"
    status, body = raw_post(served.url, "/v1/chat/completions", b'{"model": "x", "messages": [')
    assert status == 400 and body["error"]["message"].startswith("request body: not valid JSON")
    assert body["error"]["type"] == "invalid_request_error"
    status, body = raw_post(served.url, "/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and body["error"]["message"] == "request body: JSON nested too deeply"
    status, body = raw_post(served.url, "/v1/chat/completions", b'{"messages": "\xff"}')
    assert status == 400 and body["error"]["message"] == "request body: not UTF-8 text"
    status, body = raw_post(served.url, "/v1/embeddings", b"{}")
    assert status == 404 and "no such endpoint" in body["error"]["message"]
    # The server is still answering.
    assert client.models.list().data[0].id == NAME


def test_a_wrong_or_missing_api_key_is_401():
    s = Served(LocalEngine(MODEL, None, device="cpu"), api_key=KEY)
    try:
        with pytest.raises(openai.AuthenticationError) as info:
            s.client(api_key="sk-wrong").models.list()
        assert info.value.body["code"] == "invalid_api_key" and KEY not in json.dumps(info.value.body)
        status, body = raw_post(s.url, "/v1/chat/completions", b"{}")
        assert status == 401 and body["error"]["type"] == "authentication_error"
        assert s.client(api_key=KEY).models.list().data[0].id == NAME
        assert KEY not in repr(s.server)
    finally:
        s.close()
        s.engine.close()


def test_an_image_on_a_text_only_model_and_an_oversized_body_are_refused():
    s = Served(LocalEngine(MODEL, None, device="cpu"), limits=RequestLimits(max_body_bytes=200_000))
    try:
        client = s.client()
        url = "data:image/png;base64," + base64.b64encode(photo(1)).decode()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": [
                {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}]}])
        assert info.value.body["code"] == "model_has_no_vision"
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x" * 300_000}])
        assert info.value.status_code == 413 and "larger than the limit of" in info.value.body["message"]
        # The connection that was refused did not take the server down.
        r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.usage.completion_tokens <= 2
    finally:
        s.close()
        s.engine.close()


def test_web_pages_are_refused_unless_their_origin_is_allowed(served):
    status, body = raw_post(served.url, "/v1/chat/completions", b"{}", {"Origin": "https://evil.example"})
    assert status == 403 and "Origin 'https://evil.example'" in body["error"]["message"]
    status, body = raw_post(served.url, "/v1/chat/completions", b"{}", {"Host": "evil.example:80"})
    assert status == 403 and "localhost names" in body["error"]["message"]
    s = Served(LocalEngine(MODEL, None, device="cpu"), cors_origins=("http://localhost:3000",))
    try:
        host, port = s.url.split("//")[1].split("/")[0].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 204 and resp.getheader("Access-Control-Allow-Origin") == "http://localhost:3000"
        conn.request("GET", "/v1/models", headers={"Origin": "http://localhost:3000"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Access-Control-Allow-Origin") == "http://localhost:3000"
        resp.read()
        conn.close()
    finally:
        s.close()
        s.engine.close()


def test_binding_beyond_loopback_needs_the_flag_and_a_key():
    check_bind("127.0.0.1", False, None)
    check_bind("::1", False, None)
    check_bind("localhost", False, None)
    with pytest.raises(EngineError, match="--allow-network"):
        check_bind("0.0.0.0", False, KEY)
    with pytest.raises(EngineError, match="needs an API key"):
        check_bind("0.0.0.0", True, None)
    check_bind("0.0.0.0", True, KEY)


class Gate:
    """An executor whose engine thread first waits on a gate: requests pile up behind it."""

    def __init__(self, inner: ThreadExecutor):
        self.inner = inner
        self.open = threading.Event()
        self.inner.submit(lambda engine: self.open.wait(30))

    def served_model(self):
        return self.inner.served_model()

    def submit(self, job) -> Future:
        return self.inner.submit(job)


def test_a_full_queue_is_503_and_a_client_that_leaves_the_queue_costs_nothing():
    engine = LocalEngine(MODEL, None, device="cpu")
    executor = ThreadExecutor(engine)
    gate = Gate(executor)
    finished = []
    server = OpenAIServer(gate, port=0, limits=RequestLimits(max_queue=1), on_finished=finished.append).start()
    try:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=0.5)
        # This one waits behind the gate and gives up: its job is dropped before it runs.
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        deadline = time.monotonic() + 10
        while server.tasks.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.tasks.pending == 0
        # Now one waits (in a thread) and the next is refused with 503.
        waiting = threading.Thread(target=lambda: openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
                                   .chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a"}],
                                                            max_tokens=2))
        waiting.start()
        while not server.tasks.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "b"}], max_tokens=2)
        assert info.value.status_code == 503 and info.value.response.headers["Retry-After"] == "1"
        assert info.value.body["code"] == "server_busy"
        gate.open.set()
        waiting.join(30)
        assert [f.result.stats.prompt_tokens > 0 for f in finished] == [True]  # only the one that waited ran
    finally:
        gate.open.set()
        server.stop()
        executor.shutdown()
        engine.close()


class SlowEngine:
    """The engine with 5 ms per piece, so a reply is still running when the client leaves."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    @staticmethod
    def _slow(on_piece):
        def slow(piece):
            time.sleep(0.005)
            if on_piece is not None:
                on_piece(piece)
        return slow

    def generate_from(self, prompt, params, on_piece=None, cancel=None, session_key=None):
        return self._engine.generate_from(prompt, params, on_piece=self._slow(on_piece), cancel=cancel,
                                          session_key=session_key)

    def chat(self, messages, params, on_piece=None, cancel=None, session_key=None, tools=None):
        # the server encodes short chats through chat(): slow there too, or a fast machine
        # finishes 400 tokens before the client's 0.4 s timeout
        return self._engine.chat(messages, params, on_piece=self._slow(on_piece), cancel=cancel,
                                 session_key=session_key, tools=tools)


def test_a_client_cut_mid_stream_or_mid_wait_stops_the_generation():
    s = Served(SlowEngine(LocalEngine(MODEL, None, device="cpu")))
    try:
        body = dict(model=NAME, messages=[{"role": "user", "content": "Go on forever."}], max_tokens=400,
                    temperature=0, extra_body={"ignore_eos": True})
        stream = s.client().chat.completions.create(stream=True, **body)
        got = [next(iter(stream)) for _ in range(3)]
        assert got[0].choices[0].delta.role == "assistant"
        stream.close()  # the client hangs up after a few tokens
        cut = s.wait_finished(1).result
        assert cut.finish_reason == "cancelled" and 1 <= cut.stats.generated_tokens < 400
        # Non-streaming: the client times out while the reply is being generated.
        with pytest.raises(openai.APITimeoutError):
            s.client(timeout=0.4).chat.completions.create(**body)
        cut = s.wait_finished(2).result
        assert cut.finish_reason == "cancelled" and cut.stats.generated_tokens < 400
        # And the server goes on answering.
        r = s.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3
    finally:
        s.close()
        s.engine._engine.close()


def test_the_server_stops_cleanly_and_refuses_a_taken_port(served):
    with pytest.raises(EngineError, match="cannot serve on 127.0.0.1"):
        OpenAIServer(served.executor, port=served.server.port).start()
    engine = LocalEngine(MODEL, None, device="cpu")
    s = Served(engine)
    assert RemoteEngine(s.url, NAME).list_models()[0].id == NAME
    s.close()
    engine.close()
    with pytest.raises(RemoteError, match="connection refused"):
        RemoteEngine(s.url, NAME, connect_timeout=2).list_models()
