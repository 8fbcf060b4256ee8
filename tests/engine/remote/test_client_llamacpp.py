"""RemoteEngine against a real OpenAI-compatible server: llama.cpp's own `llama-server` on the
tiny fixture model, on a loopback port (tests/support/llama_cpp.py: built by scripts/llama_cpp.sh,
found through TRAMONTANE_LLAMA_CPP_BIN; skipped without it, failed in CI).

The streamed reply is checked against the same server's non-streamed answer (greedy, same seed,
the prompt evaluated afresh), fetched with plain urllib, so the SSE client is measured against
the server's own other code path, not against itself.
"""
from __future__ import annotations

import pytest

from tramontane.engine.api import ChatMessage, SamplingParams
from tramontane.engine.remote.client import RemoteEngine
from tramontane.engine.remote.transport import fetch_models

from support import FIXTURES
from support.llama_cpp import llama_server, post_json

FIXTURE = FIXTURES / "mistral3_tiny-f32.gguf"
QUESTION = "Hello, who are you?"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    # --no-jinja: the fixture's chat template is llama.cpp's built-in name "mistral-v7-tekken",
    # which only the built-in templates know (jinja would take the name itself as the prompt)
    with llama_server(FIXTURE, tmp_path_factory.mktemp("llama_server"), "--alias", "tiny",
                      "--ctx-size", "512", "--no-jinja") as url:
        yield url


def test_streams_a_reply_from_llama_server(base_url):
    server_url = base_url + "/v1"
    assert "tiny" in [m.id for m in fetch_models(server_url)]
    prompt = post_json(base_url + "/apply-template", {"messages": [{"role": "user", "content": QUESTION}]})
    assert prompt["prompt"] == f"[INST]{QUESTION}[/INST]"  # the question reaches the model
    engine = RemoteEngine(server_url, "tiny", read_timeout=60)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, seed=0)
    pieces: list[str] = []
    result = engine.chat([ChatMessage.text("user", QUESTION)], params, on_piece=pieces.append)

    assert result.finish_reason in ("stop", "length")
    assert result.text and result.text == "".join(pieces)
    assert result.stats.ttft_s > 0
    if result.finish_reason == "length":
        assert result.stats.generated_tokens == MAX_TOKENS

    # The same request, not streamed, straight through urllib: the same greedy text and counts.
    reference = post_json(server_url + "/chat/completions", {
        "model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 0, "cache_prompt": False,
        "messages": [{"role": "user", "content": QUESTION}]})
    choice = reference["choices"][0]
    assert result.text == choice["message"]["content"]
    assert result.finish_reason == choice["finish_reason"]
    assert result.stats.prompt_tokens == reference["usage"]["prompt_tokens"] > 0
    assert result.stats.generated_tokens == reference["usage"]["completion_tokens"]
