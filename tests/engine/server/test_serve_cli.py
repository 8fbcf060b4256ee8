"""`tramontane-cli serve`: options, the safety refusals before loading, and a served request."""
import argparse
import socket
import threading
import time

import pytest

from tramontane.engine.api import ChatMessage, EngineError, SamplingParams
from tramontane.engine.cli import serve
from tramontane.engine.remote.client import RemoteEngine
from tramontane.engine.remote.transport import RemoteError

from support import FIXTURES

MODEL = str(FIXTURES / "mistral3_tiny-f32.gguf")


def parse(*argv):
    parser = argparse.ArgumentParser()
    serve.add_parsers(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv, words", [
    (["--host", "0.0.0.0"], "--allow-network"),
    (["--host", "192.168.1.4", "--allow-network"], "needs an API key"),
    (["--api-key-env", "TRAMONTANE_TEST_NO_SUCH_VAR"], "TRAMONTANE_TEST_NO_SUCH_VAR is not set"),
    (["--port", "70000"], "--port must be 0-65535"),
    (["--max-queue", "0"], "--max-queue must be at least 1"),
])
def test_unsafe_or_bad_options_are_refused_before_loading(argv, words):
    args = parse("--model", "/nonexistent/model.gguf", *argv)  # never opened: refused first
    with pytest.raises(EngineError, match=words):
        serve.serve_main(args)


def test_serve_answers_until_stopped_and_needs_its_key(monkeypatch):
    monkeypatch.setenv("TRAMONTANE_TEST_KEY", "sk-cli-key")
    port = free_port()
    args = parse("--model", MODEL, "--port", str(port), "--device", "cpu", "--api-key-env", "TRAMONTANE_TEST_KEY")
    stop = threading.Event()
    errors = []
    thread = threading.Thread(target=lambda: errors.append(serve.serve_main(args, stop)))
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                RemoteEngine(url, "mistral3_tiny-f32", "sk-cli-key", connect_timeout=1).list_models()
                break
            except RemoteError:
                assert time.monotonic() < deadline and thread.is_alive(), errors
                time.sleep(0.1)
        reply = RemoteEngine(url, "mistral3_tiny-f32", "sk-cli-key").chat(
            [ChatMessage.text("user", "hi")], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        assert reply.stats.generated_tokens == 3
        with pytest.raises(RemoteError) as info:
            RemoteEngine(url, "mistral3_tiny-f32", "sk-wrong").list_models()
        assert info.value.kind == "auth"
    finally:
        stop.set()
        thread.join(30)
    assert errors == [0]
