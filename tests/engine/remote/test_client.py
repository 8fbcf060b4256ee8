"""RemoteEngine against a loopback fake of vLLM's OpenAI server (tests/support/fakevllm.py)."""
from __future__ import annotations

import io
import logging
import pickle
import socket
import threading
import time

import pytest
from PIL import Image

from tramontane.engine.api import ChatMessage, EngineError, ImagePart, SamplingParams
from tramontane.engine.remote.client import RemoteEngine, image_mime, sampling_payload
from tramontane.engine.remote.transport import RemoteError, fetch_models, parse_base_url

from support.fakevllm import FakeVLLM, split_tokens

KEY = "sk-test-7f3a9c1e-SECRET"
MODEL = "mistral-small-3.1"
REPLY = "The quick brown fox jumps over the lazy dog near the river bank today."


@pytest.fixture
def server():
    with FakeVLLM(api_key=KEY, models=[MODEL, "ministral-3b"], reply=REPLY,
                  max_model_len=8192) as fake:
        yield fake


def engine_for(fake, **kw) -> RemoteEngine:
    kw.setdefault("read_timeout", 10)
    return RemoteEngine(fake.url, kw.pop("model", MODEL), kw.pop("api_key", KEY), **kw)


def user(text: str, *images: ImagePart) -> list[ChatMessage]:
    return [ChatMessage("user", [text, *images])]


def image_bytes(fmt: str, color=(200, 30, 40), size=(7, 5)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# the happy path

def test_streams_reply_maps_messages_and_fills_stats(server):
    server.chunk_delay_s = 0.01
    pieces: list[str] = []
    seen: list[float] = []  # when each piece arrived, by this test's own clock

    def on_piece(text: str) -> None:
        seen.append(time.perf_counter())
        pieces.append(text)

    engine = engine_for(server)
    messages = [ChatMessage.text("system", "Be brief."), ChatMessage.text("user", "Hi there"),
                ChatMessage.text("assistant", "Hello!"), ChatMessage.text("user", "Tell me")]
    start = time.perf_counter()
    result = engine.chat(messages, SamplingParams(max_tokens=64), on_piece=on_piece)

    assert result.text == REPLY
    assert "".join(pieces) == REPLY and len(pieces) == len(split_tokens(REPLY))
    assert result.finish_reason == "stop" and result.error is None
    assert result.token_ids == [] and result.prompt_token_ids == []

    chat_request = next(r for r in server.requests if r.path == "/v1/chat/completions")
    body = chat_request.body
    assert chat_request.headers["Authorization"] == f"Bearer {KEY}"
    assert body["model"] == MODEL and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi there"},
                                {"role": "assistant", "content": "Hello!"},
                                {"role": "user", "content": "Tell me"}]

    usage = server.last_usage
    stats = result.stats
    assert result.usage == usage
    assert stats.prompt_tokens == usage["prompt_tokens"] == FakeVLLM.count_prompt_tokens(body)
    assert stats.generated_tokens == usage["completion_tokens"] == len(split_tokens(REPLY)) + 1
    assert stats.prefilled_tokens == stats.prompt_tokens and stats.reused_tokens == 0
    assert stats.context_used == usage["total_tokens"]
    assert stats.context_size == 8192  # from /v1/models' max_model_len, fetched after the reply
    # the times agree with what the caller saw: the first piece, then the pieces' rate
    assert abs(stats.ttft_s - (seen[0] - start)) < 0.05
    assert stats.prefill_tok_s == pytest.approx(stats.prompt_tokens / (seen[0] - start), rel=0.5)
    observed_rate = (len(seen) - 1) / (seen[-1] - seen[0])
    assert stats.decode_tok_s == pytest.approx(observed_rate, rel=0.3)
    assert stats.decode_tok_s < 110  # the server sent one token per 10 ms at most


def test_non_ascii_reply_and_prompt(server):
    server.reply = "Ça va ? 日本語のテキスト 🌬️ tramontane — ok"
    pieces = []
    result = engine_for(server).chat(user("Qu'en penses-tu, 風?"), SamplingParams(),
                                     on_piece=pieces.append)
    assert result.text == server.reply == "".join(pieces)
    assert server.requests[0].body["messages"][0]["content"] == "Qu'en penses-tu, 風?"


def test_models_list(server):
    models = fetch_models(server.url, KEY)
    assert [m.id for m in models] == [MODEL, "ministral-3b"]
    assert models[0].max_model_len == 8192
    assert [m.id for m in engine_for(server).list_models()] == [MODEL, "ministral-3b"]


def test_images_go_as_data_urls_with_mime_from_bytes(server):
    png, jpeg = image_bytes("PNG"), image_bytes("JPEG", (10, 200, 90))
    webp = image_bytes("WEBP", (1, 2, 250))
    # names lie on purpose: the MIME type must come from the bytes
    message = ChatMessage("user", ["Compare ", ImagePart(png, "a.jpg"), "with",
                                   ImagePart(jpeg, "b.png"), ImagePart(webp, "c.gif"), "?"])
    result = engine_for(server).chat([message], SamplingParams(max_tokens=4))
    assert result.finish_reason == "length"

    request = server.requests[-2]  # the chat, then the models lookup for the context size
    assert request.images == [("image/png", png), ("image/jpeg", jpeg), ("image/webp", webp)]
    content = request.body["messages"][0]["content"]
    assert [p["type"] for p in content] == ["text", "image_url", "text", "image_url",
                                            "image_url", "text"]
    assert content[0] == {"type": "text", "text": "Compare "}
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")


@pytest.mark.parametrize("fmt,mime", [("GIF", "image/gif"), ("BMP", "image/bmp"),
                                      ("TIFF", "image/tiff")])
def test_image_mime_other_formats(fmt, mime):
    assert image_mime(ImagePart(image_bytes(fmt))) == mime


def test_unknown_image_bytes_named_in_error(server):
    with pytest.raises(RemoteError, match="notes.txt: not a PNG") as info:
        engine_for(server).chat(user("look", ImagePart(b"hello world", "notes.txt")),
                                SamplingParams())
    assert info.value.kind == "config"
    assert not [r for r in server.requests if r.method == "POST"]  # nothing was sent


def test_sampling_defaults_send_only_openai_fields():
    assert sampling_payload(SamplingParams()) == {"max_tokens": 1024, "temperature": 0.15,
                                                  "top_p": 1.0}


def test_sampling_settings_reach_the_server(server):
    params = SamplingParams(max_tokens=40, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
                            repetition_penalty=1.1, seed=1234, stop=["\n\n"])
    engine_for(server).chat(user("hi"), params)
    body = server.requests[-2].body
    assert {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p",
                                 "repetition_penalty", "seed", "stop")} == {
        "max_tokens": 40, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "repetition_penalty": 1.1, "seed": 1234, "stop": ["\n\n"]}
    assert "ignore_eos" not in body


def test_finish_length_and_stop_string(server):
    engine = engine_for(server)
    result = engine.chat(user("hi"), SamplingParams(max_tokens=3))
    assert result.finish_reason == "length"
    assert result.text == "".join(split_tokens(REPLY)[:3])
    assert result.stats.generated_tokens == 3

    result = engine.chat(user("hi"), SamplingParams(stop=["fox"]))
    assert result.finish_reason == "stop_string"
    assert result.text == REPLY[:REPLY.index("fox")]


def test_stream_options_refused_then_retried_without(server):
    server.reject_stream_options = True
    result = engine_for(server).chat(user("hi"), SamplingParams())
    assert result.text == REPLY and result.finish_reason == "stop"
    posts = [r for r in server.requests if r.method == "POST"]
    assert "stream_options" in posts[0].body and "stream_options" not in posts[1].body
    # no usage: completion tokens counted from the token chunks (the EOS chunk included)
    assert result.usage is None
    assert result.stats.generated_tokens == server.last_usage["completion_tokens"]


def test_server_that_ignores_stream_true(server):
    server.ignore_stream = True
    pieces = []
    result = engine_for(server).chat(user("hi"), SamplingParams(), on_piece=pieces.append)
    assert result.text == REPLY == "".join(pieces)
    assert result.stats.prompt_tokens == server.last_usage["prompt_tokens"]


# ---------------------------------------------------------------------------------------------
# errors in words

def test_unreachable_connection_refused():
    engine = RemoteEngine(f"http://127.0.0.1:{free_port()}/v1", MODEL, KEY)
    with pytest.raises(RemoteError, match="connection refused") as info:
        engine.chat(user("hi"), SamplingParams())
    assert info.value.kind == "unreachable"


def test_unreachable_dns(monkeypatch):
    def no_such_host(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    engine = RemoteEngine("http://gpu-box.invalid:8000", MODEL, KEY)
    with pytest.raises(RemoteError, match="'gpu-box.invalid' does not resolve") as info:
        engine.chat(user("hi"), SamplingParams())
    assert info.value.kind == "unreachable"


def test_untrusted_tls_certificate(tmp_path):
    """https to a server whose certificate nobody signed: refused, in words."""
    import shutil
    import subprocess
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    with FakeVLLM(models=[MODEL]).use_tls(str(cert), str(key)) as fake:
        assert fake.url.startswith("https://")
        with pytest.raises(RemoteError, match="TLS failed.*CERTIFICATE_VERIFY_FAILED") as info:
            RemoteEngine(fake.url, MODEL).chat(user("hi"), SamplingParams())
    assert info.value.kind == "unreachable"


def test_wrong_or_missing_api_key(server):
    with pytest.raises(RemoteError, match=r"refused the API key \(401") as info:
        engine_for(server, api_key="sk-wrong").chat(user("hi"), SamplingParams())
    assert info.value.kind == "auth" and info.value.status == 401
    with pytest.raises(RemoteError, match=r"needs an API key \(401"):
        engine_for(server, api_key=None).chat(user("hi"), SamplingParams())
    with pytest.raises(RemoteError, match="refused the API key"):
        fetch_models(server.url, "sk-wrong")


@pytest.mark.parametrize("style", ["legacy", "nested"])
def test_unknown_model_lists_available(server, style):
    server.error_style = style
    with pytest.raises(RemoteError) as info:
        engine_for(server, model="mistral-large").chat(user("hi"), SamplingParams())
    err = info.value
    assert err.kind == "model_not_found" and err.status == 404
    assert "'mistral-large'" in str(err) and f"{MODEL}, ministral-3b" in str(err)
    assert err.available_models == [MODEL, "ministral-3b"]


def test_wrong_base_url_path(server):
    engine = RemoteEngine(server.url.replace("/v1", "/api"), MODEL, KEY)
    with pytest.raises(RemoteError, match="check the base URL") as info:
        engine.chat(user("hi"), SamplingParams())
    assert info.value.kind == "protocol"


@pytest.mark.parametrize("style", ["legacy", "nested"])
def test_too_many_images_passes_server_message(server, style):
    server.error_style = style
    server.max_images = 1
    png = ImagePart(image_bytes("PNG"))
    with pytest.raises(RemoteError, match=r"rejected the chat request \(400\): At most 1 "
                                          r"image\(s\) may be provided") as info:
        engine_for(server).chat(user("two", png, png), SamplingParams())
    assert info.value.kind == "rejected" and info.value.status == 400


def test_too_many_tokens_passes_server_message(server):
    with pytest.raises(RemoteError, match="maximum context length is 8192 tokens"):
        engine_for(server).chat(user("hi"), SamplingParams(max_tokens=9000))


@pytest.mark.parametrize("status", [500, 503])
def test_server_error(server, status):
    server.fault, server.fault_status = "status", status
    with pytest.raises(RemoteError, match=rf"server error \({status}.*engine dead") as info:
        engine_for(server).chat(user("hi"), SamplingParams())
    assert info.value.kind == "server" and info.value.status == status


def test_stall_before_first_token_times_out(server):
    server.fault, server.fault_after = "stall", 0
    engine = engine_for(server, read_timeout=0.3)
    t0 = time.perf_counter()
    with pytest.raises(RemoteError, match="sent nothing for 0.3 s") as info:
        engine.chat(user("hi"), SamplingParams())
    assert info.value.kind == "timeout"
    assert time.perf_counter() - t0 < 2


def test_stall_mid_stream_keeps_partial_text(server):
    server.fault, server.fault_after = "stall", 4
    pieces = []
    result = engine_for(server, read_timeout=0.3).chat(user("hi"), SamplingParams(),
                                                      on_piece=pieces.append)
    assert result.finish_reason == "interrupted"
    assert result.text == "".join(split_tokens(REPLY)[:4]) == "".join(pieces)
    assert "sent nothing for 0.3 s" in result.error


def test_cut_stream_returns_partial_text_as_interrupted(server):
    server.fault, server.fault_after = "cut", 5
    pieces = []
    result = engine_for(server).chat(user("hi"), SamplingParams(), on_piece=pieces.append)
    assert result.finish_reason == "interrupted"
    assert result.text == "".join(split_tokens(REPLY)[:5]) == "".join(pieces)
    assert "connection broke mid-stream" in result.error
    assert result.stats.generated_tokens == 5  # no usage arrived: counted from chunks


def test_cut_before_any_text_raises(server):
    server.fault, server.fault_after = "cut", 0
    with pytest.raises(RemoteError, match="connection broke mid-stream"):
        engine_for(server).chat(user("hi"), SamplingParams())


def test_malformed_stream_line(server):
    server.fault, server.fault_after = "malformed", 3
    result = engine_for(server).chat(user("hi"), SamplingParams())
    assert result.finish_reason == "interrupted"
    assert result.text == "".join(split_tokens(REPLY)[:3])
    assert "malformed stream line" in result.error

    server.fault_after = 0
    with pytest.raises(RemoteError, match="malformed stream line") as info:
        engine_for(server).chat(user("hi"), SamplingParams())
    assert info.value.kind == "malformed"

    server.fault = "deep"  # valid JSON too deep for json.loads: was a RecursionError
    with pytest.raises(RemoteError, match="malformed stream line") as info:
        engine_for(server).chat(user("hi"), SamplingParams())
    assert info.value.kind == "malformed"


def test_error_event_mid_stream(server):
    server.fault, server.fault_after = "error_event", 2
    result = engine_for(server).chat(user("hi"), SamplingParams())
    assert result.finish_reason == "interrupted"
    assert result.text == "".join(split_tokens(REPLY)[:2])
    assert "CUDA out of memory" in result.error


@pytest.mark.parametrize("url,display", [
    ("127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
    ("http://gpu.lan:8000/v1/", "http://gpu.lan:8000/v1"),
    ("https://api.example.org/openai/v1", "https://api.example.org:443/openai/v1"),
    ("http://[::1]:9000", "http://[::1]:9000/v1"),
])
def test_base_url_forms(url, display):
    assert parse_base_url(url).display == display


@pytest.mark.parametrize("url,words", [
    ("ftp://host/v1", "expected http"), ("", "expected http"),
    ("http://user:pw@host/v1", "not in the URL"), ("http://host:99999", "port"),
])
def test_bad_base_url(url, words):
    with pytest.raises(RemoteError, match=words) as info:
        RemoteEngine(url, MODEL)
    assert info.value.kind == "config"
    assert isinstance(info.value, EngineError)


# ---------------------------------------------------------------------------------------------
# cancel

def test_cancel_mid_stream_is_prompt(server):
    server.chunk_delay_s = 0.5  # a slow server: the next chunk is far away
    cancel = threading.Event()
    pieces: list[str] = []
    cancelled_at: list[float] = []

    def on_piece(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) == 2:
            threading.Timer(0.05, lambda: (cancelled_at.append(time.perf_counter()),
                                           cancel.set())).start()

    result = engine_for(server).chat(user("hi"), SamplingParams(), on_piece=on_piece,
                                     cancel=cancel)
    elapsed = time.perf_counter() - cancelled_at[0]
    assert result.finish_reason == "cancelled"
    assert result.text == "".join(pieces) == "".join(split_tokens(REPLY)[:2])
    assert elapsed < 1.0, elapsed


def test_cancel_while_server_is_silent(server):
    server.fault, server.fault_after = "stall", 0
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.perf_counter()
    result = engine_for(server, read_timeout=60).chat(user("hi"), SamplingParams(),
                                                      cancel=cancel)
    assert result.finish_reason == "cancelled" and result.text == ""
    assert time.perf_counter() - t0 < 1.3


def test_cancel_set_before_start_sends_nothing(server):
    cancel = threading.Event()
    cancel.set()
    result = engine_for(server).chat(user("hi"), SamplingParams(), cancel=cancel)
    assert result.finish_reason == "cancelled" and not server.requests


# ---------------------------------------------------------------------------------------------
# the key stays secret

def _chain(exc: BaseException) -> str:
    parts = []
    while exc is not None:
        parts += [str(exc), repr(exc), repr(exc.args)]
        exc = exc.__cause__ or exc.__context__
    return " ".join(parts)


def test_api_key_never_in_repr_logs_or_errors(server, caplog):
    caplog.set_level(logging.DEBUG)
    engine = engine_for(server)
    seen: list[str] = [repr(engine), str(engine), engine.description, engine.base_url,
                       repr(vars(engine))]
    result = engine.chat(user("hi", ImagePart(image_bytes("PNG"))), SamplingParams())
    seen.append(repr(result))

    failures = [
        lambda: engine_for(server, model="nope").chat(user("hi"), SamplingParams()),
        lambda: engine_for(server, api_key=KEY + "x").chat(user("hi"), SamplingParams()),
        lambda: fetch_models(server.url, KEY + "x"),
        lambda: RemoteEngine(f"http://127.0.0.1:{free_port()}", MODEL, KEY).chat(
            user("hi"), SamplingParams()),
        lambda: RemoteEngine(server.url, MODEL, KEY + "\nX-Injected: 1"),
        lambda: pickle.dumps(engine),
    ]
    for fail in failures:
        with pytest.raises(Exception) as info:
            fail()
        seen.append(_chain(info.value))
    server.fault, server.fault_after = "cut", 2
    seen.append(repr(engine.chat(user("hi"), SamplingParams())))
    server.fault, server.fault_status = "status", 500
    with pytest.raises(RemoteError) as info:
        engine.chat(user("hi"), SamplingParams())
    seen.append(_chain(info.value))

    seen += [r.getMessage() for r in caplog.records]
    assert any("POST" in r.getMessage() for r in caplog.records)  # debug logging did run
    leaks = [s for s in seen if "7f3a9c1e" in s]
    assert not leaks


def test_key_echoed_by_server_is_redacted(server):
    server.fault, server.fault_status = "status", 500
    server.error_style = "nested"
    original = server.error_body
    server.error_body = lambda message, t, c: original(f"bad token {KEY}", t, c)
    with pytest.raises(RemoteError) as info:
        engine_for(server).chat(user("hi"), SamplingParams())
    assert KEY not in str(info.value) and "bad token <hidden>" in str(info.value)


@pytest.mark.parametrize("status,kind,words", [
    (413, "rejected", r"rejected the chat request \(413\): fault"),
    (422, "rejected", r"rejected the chat request \(422\): fault"),
    (429, "rejected", r"busy or rate-limited \(429\): fault"),
    (418, "protocol", r"answered 418"),
])
def test_other_statuses_in_words(server, status, kind, words):
    server.fault, server.fault_status = "status", status
    with pytest.raises(RemoteError, match=words) as info:
        engine_for(server).chat(user("hi"), SamplingParams())
    assert info.value.kind == kind and info.value.status == status
