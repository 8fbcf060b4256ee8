"""A chat bound to a server gets a reasoning model's thought apart from its answer (issue 36, item 5),
against a real llama-server (tests/support/llama_cpp.py; skipped without TRAMONTANE_LLAMA_CPP_BIN)
and against this project's own `serve`, on the same file.

The file is the tiny model rewritten to write a fixed chain (tests/support/chain_model.py):
after the prompt's [/INST], `[THINK]and the[/THINK]porting`, then EOS, whatever the question.
It carries a Mistral reasoning template (Jinja: [SYSTEM_PROMPT], [TOOL_CALLS]name[ARGS], no
[CALL_ID]), which llama.cpp's chat code takes for Ministral 3 / Magistral's format; with
`--jinja` and `--reasoning-format deepseek` llama-server parses [THINK]...[/THINK] out of the
reply into `reasoning_content` (message and streamed deltas). `serve` splits it at the think
tokens (engine/runtime/reasoning.py). Each server's reply is read by RemoteEngine streamed and
not streamed (its path for a server that answers one JSON completion), and what the window would
store of it (the reply's row, read back as a ThinkPart and the answer) is what it stores of the
same model's local reply. serve's cases run without llama.cpp too.
"""
from __future__ import annotations

import time

import pytest

from tramontane.engine.api import ChatMessage, ReasoningPiece, SamplingParams, ThinkPart
from tramontane.engine.remote import client
from tramontane.engine.remote.client import RemoteEngine
from tramontane.engine.remote.transport import fetch_models

from support.chain_model import build_chain_model
from support.llama_cpp import llama_server, llama_server_binary, post_json
from support.served import local_server

QUESTION = "Hello, who are you?"
PARAMS = SamplingParams(max_tokens=32, temperature=0.0, seed=0)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    return build_chain_model(tmp_path_factory.mktemp("chain_model") / "chain-tiny-f32.gguf")


@pytest.fixture(scope="module")
def llama_url(chain, tmp_path_factory):
    llama_server_binary()  # skip (or fail where required) before anything else starts
    with llama_server(chain.path, tmp_path_factory.mktemp("llama_server_reasoning"), "--alias", "tiny",
                      "--ctx-size", "512", "--jinja", "--reasoning-format", "deepseek") as url:
        yield url


@pytest.fixture(scope="module")
def serve_url(chain):
    with local_server(chain.path, context_length=512) as server:
        yield server.url


@pytest.fixture(scope="module")
def local(chain):
    """The same file's reply on our own engine in process: the chain, split."""
    from tramontane.engine.runtime.local import LocalEngine

    engine = LocalEngine(chain.path, None, device="cpu", context_length=512)
    try:
        result = engine.chat([ChatMessage.text("user", QUESTION)], PARAMS)
        yield engine, result
    finally:
        engine.close()


def test_both_engines_write_the_chain(chain, llama_url, local):
    """The construction, checked on each engine before anything is read from a server: ours
    writes the chain greedily and splits it; llama.cpp's raw completion (no chat parsing) writes
    the same ids, then EOS, after the prompt its template renders."""
    engine, result = local
    assert engine.tokenizer.think_ids == (chain.think, chain.end_think)  # v13 and can think
    assert result.prompt_token_ids[-1] == chain.start  # our prompt ends with [/INST]
    assert result.token_ids == chain.ids and result.finish_reason == "stop"
    assert (result.reasoning, result.text) == (chain.thought, chain.answer) == ("and the", "porting")

    rendered = post_json(llama_url + "/apply-template", {"messages": [{"role": "user", "content": QUESTION}]})
    assert rendered["prompt"] == f"[INST]{QUESTION}[/INST]"  # llama-server's prompt ends with [/INST] too
    raw = post_json(llama_url + "/completion", {"prompt": rendered["prompt"], "n_predict": 32, "temperature": 0.0,
                                                "return_tokens": True, "cache_prompt": False})
    assert raw["tokens"] == [*chain.ids, chain.eos] and raw["stop_type"] == "eos"
    assert raw["content"] == chain.thought + chain.answer  # the think tokens are not text for /completion


def test_llama_server_returns_the_thought_in_reasoning_content(chain, llama_url):
    """What llama-server itself sends (read with urllib): message.reasoning_content and the answer
    as content, and in the stream reasoning_content deltas before content deltas."""
    import json
    import urllib.request

    body = {"model": "tiny", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 32,
            "temperature": 0.0, "seed": 0}
    whole = post_json(llama_url + "/v1/chat/completions", body)
    message = whole["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (chain.thought, chain.answer)
    assert whole["choices"][0]["finish_reason"] == "stop"

    request = urllib.request.Request(llama_url + "/v1/chat/completions", json.dumps({**body, "stream": True}).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        lines = response.read().decode().splitlines()
    deltas = [c["delta"] for line in lines if line.startswith("data: ") and line != "data: [DONE]"
              for c in json.loads(line[6:]).get("choices", [])]
    kinds = [(k, v) for d in deltas for k, v in d.items() if k in ("reasoning_content", "content") and v]
    assert "".join(v for k, v in kinds if k == "reasoning_content") == chain.thought
    assert "".join(v for k, v in kinds if k == "content") == chain.answer
    assert [k for k, _ in kinds] == sorted((k for k, _ in kinds), key=lambda k: k != "reasoning_content")


def remote_reply(url: str, streamed: bool, monkeypatch, params: SamplingParams = PARAMS, **extra) -> tuple:
    """RemoteEngine's reply from the server at `url` (…/v1), and the pieces it streamed: as it
    asks (stream: true), or with the request made non-streamed (the server answers one JSON
    completion, RemoteEngine's path for a server that ignores stream); `extra` fields added to
    the request."""
    real_payload = client.chat_payload

    def payload(*args, **kwargs):
        body = {**real_payload(*args, **kwargs), **extra}
        if not streamed:
            body["stream"] = False
            body.pop("stream_options", None)
        return body

    monkeypatch.setattr(client, "chat_payload", payload)
    model = fetch_models(url)[0].id
    engine = RemoteEngine(url, model, read_timeout=60)
    pieces: list[str] = []
    result = engine.chat([ChatMessage.text("user", QUESTION)], params, on_piece=pieces.append)
    return engine, result, pieces


def stored_parts(engine, result, tmp_path) -> list:
    """The reply as the window saves it (its worker's reasoning fields) and reads it back for the
    next turn: the assistant message's parts."""
    from tramontane.app.chat_session import thought_fields
    from tramontane.app.reasoning import Thought
    from tramontane.app.store import Store
    from tramontane.app.worker import thought_cut

    thought = Thought()
    for piece in [result.reasoning] if result.reasoning else []:
        thought.add(piece, time.monotonic())
    with Store(tmp_path) as store:
        chat = store.create_chat("c")
        store.add_message(chat, "user", QUESTION)
        reply = store.begin_reply(chat)
        ended = thought.ended(time.monotonic(), thought_cut(engine, result))
        store.finish_reply(reply, result.text, result.stats, **thought_fields(result.reasoning, ended))
        messages = store.engine_messages(chat)
    assert [m.role for m in messages] == ["user", "assistant"]
    return messages[1].parts


def server_url(server: str, request) -> str:
    # serve's cases run without llama.cpp too
    if server == "llama-server":
        return request.getfixturevalue("llama_url") + "/v1"
    return request.getfixturevalue("serve_url")


def check_split(chain, server, streamed, reply, local, tmp_path) -> None:
    """RemoteEngine's reply is the chain's thought apart from its answer, streamed as it came, and
    the window keeps of it what it keeps of the local model's reply."""
    engine, result, pieces = reply
    assert result.finish_reason == "stop" and result.error is None
    assert (result.reasoning, result.text) == (chain.thought, chain.answer)
    # streamed as it came: the thought's pieces (ReasoningPiece) first, then the answer's
    thought = [p for p in pieces if isinstance(p, ReasoningPiece)]
    answer = [p for p in pieces if not isinstance(p, ReasoningPiece)]
    assert "".join(thought) == chain.thought and "".join(answer) == chain.answer
    assert pieces == thought + answer
    if streamed and server == "llama-server":  # a delta a token (serve may join the pieces of a burst)
        assert len(thought) == len(chain.thought_ids) and len(answer) == len(chain.answer_ids)
    assert result.stats.generated_tokens >= len(chain.ids)
    # what the window keeps: the same parts as the local model's reply
    local_engine, local_result = local
    parts = stored_parts(engine, result, tmp_path / "d")
    assert parts == stored_parts(local_engine, local_result, tmp_path / "local") == \
        [ThinkPart(chain.thought, closed=True), chain.answer]


SERVERS = pytest.mark.parametrize("server", ["llama-server", "serve"])
STREAMED = pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "not-streamed"])


@STREAMED
@SERVERS
def test_a_chat_bound_to_a_server_gets_the_thought_apart(server, streamed, chain, local, request, monkeypatch,
                                                         tmp_path):
    reply = remote_reply(server_url(server, request), streamed, monkeypatch)
    check_split(chain, server, streamed, reply, local, tmp_path)


@STREAMED
@SERVERS
def test_a_thought_left_in_the_content_comes_apart(server, streamed, chain, local, request, monkeypatch, tmp_path):
    """reasoning_format "none" (llama-server's --reasoning-format none, per request here; serve
    takes the same field): the server leaves the thought unparsed, [THINK]...[/THINK] at the
    start of the content. The chat still shows and keeps it apart, as a local chat does."""
    url = server_url(server, request)
    raw = post_json(url + "/chat/completions", {"model": fetch_models(url)[0].id, "max_tokens": 32, "temperature": 0.0,
                                                "messages": [{"role": "user", "content": QUESTION}],
                                                "reasoning_format": "none"})
    message = raw["choices"][0]["message"]
    assert message["content"] == f"[THINK]{chain.thought}[/THINK]{chain.answer}"
    assert not message.get("reasoning_content")
    reply = remote_reply(url, streamed, monkeypatch, reasoning_format="none")
    check_split(chain, server, streamed, reply, local, tmp_path)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
@STREAMED
@SERVERS
def test_a_reply_cut_by_max_tokens_splits_as_the_local_one(server, streamed, max_tokens, chain, request, monkeypatch,
                                                          tmp_path):
    """Cut inside the thought (1: only [THINK] written; 2, 3: part of it, never closed) or inside
    the answer (5): the remote reply's thought, answer and stored parts are the local model's for
    the same limit. (4, the thought closed and no answer yet, is left out: a server says nothing
    of a [/THINK] it parsed, and the window takes a reply with no answer that did not end by
    itself for a thought cut off.)"""
    from tramontane.engine.runtime.local import LocalEngine

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=0)
    engine, result, _ = remote_reply(server_url(server, request), streamed, monkeypatch, params)
    local_engine = LocalEngine(chain.path, None, device="cpu", context_length=512)
    try:
        local_result = local_engine.chat([ChatMessage.text("user", QUESTION)], params)
        assert local_result.finish_reason == result.finish_reason == "length"
        assert (result.reasoning, result.text) == (local_result.reasoning, local_result.text)
        assert stored_parts(engine, result, tmp_path / "d") == \
            stored_parts(local_engine, local_result, tmp_path / "local")
    finally:
        local_engine.close()
