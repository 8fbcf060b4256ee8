"""RemoteEngine against a real OpenAI-compatible server: llama-cpp-python's
`python -m llama_cpp.server` on a tiny fixture model, on a loopback port.

Skipped unless llama-cpp-python and its server extras are installed in this interpreter.
The streamed reply is checked against the same server's non-streamed answer (greedy, same
seed), fetched with plain urllib, so the SSE client is measured against the server's own
other code path, not against itself.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tramontane.engine.api import ChatMessage, SamplingParams
from tramontane.engine.remote.client import RemoteEngine
from tramontane.engine.remote.http import RemoteError, fetch_models

from support import FIXTURES  # noqa: E402

FIXTURE = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")


def _require_server() -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    for module in ("uvicorn", "fastapi", "sse_starlette", "starlette_context",
                   "pydantic_settings"):
        pytest.importorskip(module, reason=f"llama-cpp-python[server] extra missing: {module}")
    if not os.path.exists(FIXTURE):
        pytest.skip(f"fixture model missing: {FIXTURE}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    _require_server()
    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", FIXTURE,
             "--model_alias", "tiny", "--host", "127.0.0.1", "--port", str(port),
             "--n_ctx", "512", "--n_threads", "2"],
            stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited ({proc.returncode}):\n"
                            f"{log_path.read_text(errors='replace')[-3000:]}")
            try:
                fetch_models(url, timeout=2)
                break
            except RemoteError:
                if time.monotonic() > deadline:
                    pytest.fail("llama_cpp.server did not come up within 90 s")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_streams_a_reply_from_llama_cpp_server(llama_server):
    assert "tiny" in [m.id for m in fetch_models(llama_server)]
    engine = RemoteEngine(llama_server, "tiny", read_timeout=60)
    messages = [ChatMessage.text("user", "Hello, who are you?")]
    params = SamplingParams(max_tokens=12, temperature=0.0, seed=0)
    pieces: list[str] = []
    result = engine.chat(messages, params, on_piece=pieces.append)

    assert result.finish_reason in ("stop", "length")
    assert result.text == "".join(pieces)
    assert result.stats.ttft_s > 0
    if result.finish_reason == "length":
        assert result.stats.generated_tokens == 12
    if result.usage is not None:
        assert result.stats.prompt_tokens == result.usage["prompt_tokens"] > 0

    # The same request, not streamed, straight through urllib: the same greedy text.
    body = json.dumps({"model": "tiny", "max_tokens": 12, "temperature": 0.0, "seed": 0,
                       "messages": [{"role": "user", "content": "Hello, who are you?"}]})
    request = urllib.request.Request(llama_server + "/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        reference = json.load(response)
    assert result.text == reference["choices"][0]["message"]["content"]

