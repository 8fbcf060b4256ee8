"""RemoteEngine against a real OpenAI-compatible server: llama.cpp's own `llama-server` on the
tiny fixture model, on a loopback port (tests/support/llama_cpp.py: built by scripts/llama_cpp.sh,
found through TRAMONTANE_LLAMA_CPP_BIN; skipped without it, failed in CI).

The streamed reply is checked against the same server's non-streamed answer (greedy, same seed,
the prompt evaluated afresh), fetched with plain urllib, so the SSE client is measured against
the server's own other code path, not against itself.
"""
from __future__ import annotations

import pytest

from tramontane.engine.api import ChatMessage, ImagePart, SamplingParams
from tramontane.engine.remote.client import RemoteEngine
from tramontane.engine.remote.transport import fetch_models

from support import FIXTURES
from support.llama_cpp import llama_server, post_json

FIXTURE = FIXTURES / "mistral3_tiny-f32.gguf"
MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
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


@pytest.fixture(scope="module")
def vision_url(tmp_path_factory):
    from support.gguf_edit import with_img_break

    work = tmp_path_factory.mktemp("llama_server_vision")
    # llama.cpp refuses a Pixtral projector without v.token_embd.img_break (ours reads the text
    # model's [IMG_BREAK] row instead): a copy that carries that row
    mmproj = with_img_break(MMPROJ, FIXTURE, work / MMPROJ.name)
    with llama_server(FIXTURE, work, "--alias", "tiny", "--ctx-size", "512", "--no-jinja",
                      "--mmproj", str(mmproj)) as url:
        yield url


def streamed_text(url: str, body: dict) -> str:
    """The deltas' content of the server's own event stream, read with urllib."""
    import json
    import urllib.request

    request = urllib.request.Request(url, json.dumps({**body, "stream": True}).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        lines = response.read().decode().splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    return "".join(c.get("delta", {}).get("content") or "" for e in events for c in e.get("choices", []))


def test_an_image_reaches_llama_server_and_the_reply_comes_back(vision_url):
    """Issue 36 item 5: a chat bound to a server sends its images. The reply is the server's own
    stream for the same image sent with urllib (its non-streamed answer can differ: llama-server
    streams no delta for bytes that are not UTF-8, and the random model writes some), and the
    prompt counts the image's tokens (llama.cpp's own count: more than the question alone)."""
    import base64

    from support.app_window import png_bytes

    server_url = vision_url + "/v1"
    png = png_bytes(64, 48, seed=3)
    engine = RemoteEngine(server_url, "tiny", read_timeout=60)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, seed=0)
    pieces: list[str] = []
    result = engine.chat([ChatMessage("user", [ImagePart(png, "picture.png"), "What is in the picture?"])],
                         params, on_piece=pieces.append)
    assert result.text == "".join(pieces) and result.finish_reason in ("stop", "length")

    def body(content) -> dict:
        return {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 0, "cache_prompt": False,
                "messages": [{"role": "user", "content": content}]}

    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    image_content = [{"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "What is in the picture?"}]
    with_image = post_json(server_url + "/chat/completions", body(image_content))
    text_only = post_json(server_url + "/chat/completions", body("What is in the picture?"))
    assert result.text == streamed_text(server_url + "/chat/completions", body(image_content))
    assert result.stats.prompt_tokens == with_image["usage"]["prompt_tokens"]
    assert result.stats.generated_tokens == with_image["usage"]["completion_tokens"]
    assert with_image["usage"]["prompt_tokens"] > text_only["usage"]["prompt_tokens"] + 4
