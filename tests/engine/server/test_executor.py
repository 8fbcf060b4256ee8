"""The server on BatchExecutor: concurrent clients (the official `openai` client, each in its own
thread) get the replies the engine gives each of them alone, a new conversation with a known
system prompt reports cached tokens, a request's `n` choices decode as rows of one batch, and every
served sequence takes blocks of the engine's one KV pool."""
from __future__ import annotations

import threading

import pytest

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")

from tramontane.engine.api import ChatMessage, EngineError, SamplingParams  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.runtime.prefix_cache import BLOCK_TOKENS  # noqa: E402
from tramontane.engine.server.executor import BatchExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.batch_runs import Recorder  # noqa: E402

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


def test_n_choices_decode_as_rows_of_one_batch_and_equal_one_greedy_run(served, reference):
    engine, _, server = served
    messages = [{"role": "user", "content": "Name three winds of the Mediterranean, one per line, and why."}]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    want = reference.chat([ChatMessage.text("user", messages[0]["content"])], greedy, session_key="ref-n").text
    rec = Recorder(engine.model)
    try:
        reply = client(server).chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0,
                                                       n=3, extra_body={"ignore_eos": True})
    finally:
        rec.close()
    assert [(c.index, c.message.content) for c in reply.choices] == [(0, want), (1, want), (2, want)]
    assert any(step.count(1) >= 3 for step in rec.steps)  # the three decoded as rows of one step
    prompt_rows = sum(n for step in rec.steps for n in step if n > 1)
    assert prompt_rows <= reply.usage.prompt_tokens  # the prompt read once

    streamed = client(server).chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0,
                                                      n=3, stream=True, extra_body={"ignore_eos": True})
    texts = ["", "", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [want] * 3


def test_served_sequences_take_blocks_of_the_engines_one_pool():
    # Serving allocates no KV beside the engine's pool (what the plan counted): every sequence,
    # of any lane, takes its blocks, and each may be the whole context (no slot carved out of it).
    engine = LocalEngine(MODEL, device="cpu", context_length=512)
    try:
        pool, nbytes = engine.pool, engine.pool.nbytes
        params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        executor = BatchExecutor(engine, slots=1, priority_slots=1, step_rows=64)
        try:
            assert executor.scheduler.pool is pool and executor.served_model().context_size == 512
            text = executor.submit(lambda e: e.chat([ChatMessage.text("user", "hi")], params).text).result(timeout=120)
            assert pool.in_use() == 0 and pool.named() > 0  # let go of, its content kept by name
        finally:
            executor.shutdown()
        assert text == engine.chat([ChatMessage.text("user", "hi")], params, session_key="after").text  # its own chats still work
        executor = BatchExecutor(engine, slots=2, priority_slots=1)  # three at once: each still the whole context
        try:
            assert executor.scheduler.pool is pool and executor.served_model().context_size == 512
        finally:
            executor.shutdown()
        assert engine.pool is pool and pool.nbytes == nbytes
    finally:
        engine.close()
