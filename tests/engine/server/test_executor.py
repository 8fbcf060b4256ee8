"""The server on BatchExecutor: concurrent clients (the official `openai` client, each in its own
thread) get the replies the engine gives each of them alone, and a new conversation with a
known system prompt reports cached tokens."""
from __future__ import annotations

import threading

import pytest

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")

from tramontane.engine.api import ChatMessage, SamplingParams  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.runtime.prefix_cache import BLOCK_TOKENS  # noqa: E402
from tramontane.engine.server.executor import BatchExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
SYSTEM = "You answer in short sentences and never repeat yourself. " * 6


@pytest.fixture(scope="module")
def served():
    engine = LocalEngine(MODEL, MMPROJ, device="cpu", context_length=512)
    executor = BatchExecutor(engine, slots=4, step_rows=32)
    server = OpenAIServer(executor, port=0).start()
    yield engine, executor, server
    server.stop()
    executor.shutdown()
    engine.close()


@pytest.fixture(scope="module")
def reference():
    engine = LocalEngine(MODEL, MMPROJ, device="cpu", context_length=512)
    yield engine
    engine.close()


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def test_concurrent_clients_get_what_each_gets_alone(served, reference):
    _, executor, server = served
    questions = [f"Question number {i}: tell me about the {w} wind." for i, w in
                 enumerate(["north", "south", "east", "west", "sea", "mountain"])]
    sizes = [6, 14, 9, 20, 4, 11]
    expected = [reference.chat([ChatMessage.text("user", q)], SamplingParams(max_tokens=n, temperature=0.0),
                               session_key=f"ref-{i}").text for i, (q, n) in enumerate(zip(questions, sizes))]
    got: list = [None] * len(questions)
    active_seen = []

    def ask(i):
        c = client(server)
        messages = [{"role": "user", "content": questions[i]}]
        if i % 2:  # streamed
            parts = c.chat.completions.create(model="x", messages=messages, max_tokens=sizes[i], temperature=0,
                                              stream=True)
            got[i] = "".join(ch.choices[0].delta.content or "" for ch in parts if ch.choices)
        else:
            got[i] = c.chat.completions.create(model="x", messages=messages, max_tokens=sizes[i],
                                               temperature=0).choices[0].message.content

    def watch(stop):
        while not stop.is_set():
            active_seen.append(executor.scheduler.active)
            stop.wait(0.002)

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,))
    watcher.start()
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    watcher.join()
    assert got == expected
    assert max(active_seen) >= 2  # they really ran together


def test_a_new_conversation_with_a_known_system_prompt_reports_cached_tokens(served):
    _, _, server = served
    c = client(server)
    first = c.chat.completions.create(model="x", max_tokens=3, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there."}])
    assert first.usage.prompt_tokens > 2 * BLOCK_TOKENS
    second = c.chat.completions.create(model="x", max_tokens=3, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Something completely different."}])
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 2 * BLOCK_TOKENS and cached < second.usage.prompt_tokens
