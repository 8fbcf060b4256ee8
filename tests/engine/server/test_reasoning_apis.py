"""A reasoning model's thought through every API, read by each one's official client, whole and
streamed, on the tiny model made to think (a thinking vocabulary, scripted logits): OpenAI's
`reasoning_content` (vLLM's mistral reasoning parser's field, with llama.cpp's
`reasoning_format` values), and a tool call after the thought still parsed."""
from __future__ import annotations

import pytest

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")
pytest.importorskip("llguidance")

from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import ThreadExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.scripted import ScriptedLogits, script_logits  # noqa: E402
from support.thinking import thinking_tokenizer  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
THOUGHT, ANSWER = "Two and two.", "Four."
HI = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]


@pytest.fixture(scope="module")
def served():
    engine = LocalEngine(MODEL, device="cpu", context_length=1024)
    engine.tokenizer = thinking_tokenizer(MODEL)
    executor = ThreadExecutor(engine)
    server = OpenAIServer(executor, port=0, ollama_port=0).start()
    server.engine = engine
    yield server
    server.stop()
    executor.shutdown()
    engine.close()


@pytest.fixture
def think(served, monkeypatch):
    """Scripts the reply: [THINK] thought [/THINK] then the answer's pieces (names of control
    tokens as their ids)."""
    tok = served.engine.tokenizer

    def set_reply(thought: str, *answer: str):
        start, end = tok.think_ids
        ids = [start, *tok.encode(thought), end]
        for piece in answer:
            ids += [tok.token_id(piece)] if piece in ("[TOOL_CALLS]", "[ARGS]") else tok.encode(piece)
        script_logits(monkeypatch, ScriptedLogits(ids, tok.eos_id))

    return set_reply


def gpt(served):
    return openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=60)


def _streamed(served, **extra):
    chunks = list(gpt(served).chat.completions.create(model="m", messages=HI, max_tokens=60, stream=True, **extra))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    return thought, "".join(d.content or "" for d in deltas), deltas


def test_openai_reasoning_content_whole_and_streamed(served, think):
    think(THOUGHT, ANSWER)
    message = gpt(served).chat.completions.create(model="m", messages=HI, max_tokens=60).choices[0].message
    assert message.reasoning_content == THOUGHT and message.content == ANSWER
    think(THOUGHT, ANSWER)
    thought, content, deltas = _streamed(served)
    assert thought == THOUGHT and content == ANSWER
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not getattr(d, "reasoning_content", None) for d in deltas[first_answer:])  # the thought first


@pytest.mark.parametrize("fmt, reasoning, content", [
    ("deepseek", THOUGHT, ANSWER), ("auto", THOUGHT, ANSWER),
    ("none", None, f"[THINK]{THOUGHT}[/THINK]{ANSWER}"),
    ("deepseek-legacy", THOUGHT, f"[THINK]{THOUGHT}[/THINK]{ANSWER}")])
def test_llama_cpps_reasoning_formats(served, think, fmt, reasoning, content):
    think(THOUGHT, ANSWER)
    message = gpt(served).chat.completions.create(model="m", messages=HI, max_tokens=60,
                                                  extra_body={"reasoning_format": fmt}).choices[0].message
    assert getattr(message, "reasoning_content", None) == reasoning and message.content == content
    think(THOUGHT, ANSWER)
    thought, streamed, _ = _streamed(served, extra_body={"reasoning_format": fmt})
    assert (thought or None) == reasoning and streamed == content


def test_an_unknown_reasoning_format_is_refused_by_name(served):
    with pytest.raises(openai.BadRequestError) as info:
        gpt(served).chat.completions.create(model="m", messages=HI, extra_body={"reasoning_format": "hidden"})
    assert "reasoning_format" in str(info.value)


def test_openai_tool_call_after_the_thought(served, think):
    call = ("[TOOL_CALLS]", "get_weather", "[ARGS]", '{"city": "Paris"}')
    think(THOUGHT, *call)
    message = gpt(served).chat.completions.create(model="m", messages=HI, max_tokens=80, tools=TOOLS).choices[0].message
    assert message.reasoning_content == THOUGHT and not message.content
    (tool,) = message.tool_calls
    assert tool.function.name == "get_weather" and tool.function.arguments == '{"city": "Paris"}'
    think(THOUGHT, *call)
    chunks = list(gpt(served).chat.completions.create(model="m", messages=HI, max_tokens=80, tools=TOOLS,
                                                      stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == THOUGHT
    assert not "".join(d.content or "" for d in deltas)
    calls = [t for d in deltas for t in (d.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    assert "".join(t.function.arguments or "" for t in calls) == '{"city": "Paris"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
