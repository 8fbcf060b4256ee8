"""A reasoning model's thought through every API, read by each one's official client, whole and
streamed, on the tiny model made to think (a thinking vocabulary, scripted logits): OpenAI's
`reasoning_content` (vLLM's mistral reasoning parser's field, with llama.cpp's
`reasoning_format` values), Anthropic's `thinking` blocks, Ollama's `thinking`, the Responses
API's reasoning item; and a tool call after the thought still parsed."""
from __future__ import annotations

import pytest

anthropic = pytest.importorskip("anthropic", reason="the official client is the reference (test extra)")
ollama = pytest.importorskip("ollama", reason="the official client is the reference (test extra)")
openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")
pytest.importorskip("llguidance")

from tramontane.engine.api import ChatMessage, ThinkPart  # noqa: E402
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
    server = OpenAIServer(executor, port=0, ollama_port=0, on_finished=lambda f: server.finished.append(f)).start()
    server.finished = []
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


def test_anthropic_thinking_block_whole_and_streamed(served, think):
    c = anthropic.Anthropic(base_url=served.url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=60)
    think(THOUGHT, ANSWER)
    m = c.messages.create(model="m", max_tokens=60, messages=HI)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == THOUGHT and m.content[1].text == ANSWER
    think(THOUGHT, ANSWER)
    with c.messages.stream(model="m", max_tokens=60, messages=HI) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [(e.index, e.delta.type) for e in events if e.type == "content_block_delta"]
    assert {i for i, kind in deltas if kind == "thinking_delta"} == {0}  # a block of its own, first
    assert {i for i, kind in deltas if kind == "text_delta"} == {1}
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THOUGHT and final.content[1].text == ANSWER


def test_ollama_thinking_in_chat_and_generate_whole_and_streamed(served, think):
    c = ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}")
    think(THOUGHT, ANSWER)
    r = c.chat(model="m", messages=HI, think=True)
    assert r.message.thinking == THOUGHT and r.message.content == ANSWER
    think(THOUGHT, ANSWER)
    pieces = list(c.chat(model="m", messages=HI, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in pieces) == THOUGHT
    assert "".join(p.message.content for p in pieces) == ANSWER and pieces[-1].done
    think(THOUGHT, ANSWER)
    g = c.generate(model="m", prompt="hi", think=True)
    assert g.thinking == THOUGHT and g.response == ANSWER
    think(THOUGHT, ANSWER)
    pieces = list(c.generate(model="m", prompt="hi", think=True, stream=True))
    assert "".join(p.thinking or "" for p in pieces) == THOUGHT and "".join(p.response for p in pieces) == ANSWER


def test_responses_reasoning_item_before_the_message_whole_and_streamed(served, think):
    think(THOUGHT, ANSWER)
    r = gpt(served).responses.create(model="m", input="hi", max_output_tokens=60)
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == THOUGHT and r.output_text == ANSWER
    think(THOUGHT, ANSWER)
    with gpt(served).responses.stream(model="m", input="hi", max_output_tokens=60) as stream:
        events = list(stream)
        final = stream.get_final_response()
    thought = [e for e in events if e.type == "response.reasoning_text.delta"]
    answer = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in thought) == THOUGHT and "".join(e.delta for e in answer) == ANSWER
    assert {e.output_index for e in thought} == {0} and {e.output_index for e in answer} == {1}
    assert events.index(thought[-1]) < events.index(answer[0])
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done.text == THOUGHT and done.item_id == final.output[0].id == thought[0].item_id
    assert [item.type for item in final.output] == ["reasoning", "message"] and final.output_text == ANSWER


def test_an_earlier_thought_sent_back_is_in_the_prompt_as_the_window_sends_it(served, think):
    """An earlier assistant turn's thought, as OpenAI clients send it back (vLLM's
    `reasoning_content` or `reasoning`), as Anthropic's do (a `thinking` block), Ollama's
    (`thinking`), and in the
    Responses API (a reasoning item; the stored response of previous_response_id), is the think
    chunk mistral-common encodes before that turn's answer, the prompt a local chat gets (the
    Ministral 3 Reasoning cards ask for earlier traces kept); before, it was dropped."""
    engine = served.engine
    want = engine.encode([ChatMessage.text("user", "hi"), ChatMessage("assistant", [ThinkPart(THOUGHT), ANSWER]),
                          ChatMessage.text("user", "again")]).ids
    assert engine.tokenizer.think_ids[0] in want

    def prompt():
        return list(served.finished[-1].result.prompt_token_ids)

    for field in ("reasoning_content", "reasoning"):
        think(THOUGHT, ANSWER)
        gpt(served).chat.completions.create(model="m", max_tokens=20, messages=[
            *HI, {"role": "assistant", "content": ANSWER, field: THOUGHT}, {"role": "user", "content": "again"}])
        assert prompt() == list(want), field
    think(THOUGHT, ANSWER)
    claude = anthropic.Anthropic(base_url=served.url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=60)
    history = [*HI, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": THOUGHT, "signature": ""},
        {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": ANSWER}]},
        {"role": "user", "content": "again"}]
    claude.messages.create(model="m", max_tokens=20, messages=history)
    assert prompt() == list(want)
    assert claude.messages.count_tokens(model="m", messages=history).input_tokens == len(want)
    think(THOUGHT, ANSWER)  # Ollama's `thinking` on the assistant message
    ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}").chat(model="m", options={"num_predict": 20}, messages=[
        *HI, {"role": "assistant", "content": ANSWER, "thinking": THOUGHT}, {"role": "user", "content": "again"}])
    assert prompt() == list(want)
    think(THOUGHT, ANSWER)  # the Responses API: a reasoning item, and previous_response_id
    gpt(served).responses.create(model="m", max_output_tokens=20, input=[
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ANSWER}]},
        {"role": "user", "content": "again"}])
    assert prompt() == list(want)
    think(THOUGHT, ANSWER)
    first = gpt(served).responses.create(model="m", max_output_tokens=20, input="hi")
    think(THOUGHT, ANSWER)
    gpt(served).responses.create(model="m", max_output_tokens=20, input="again", previous_response_id=first.id)
    assert prompt() == list(want)
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\].reasoning_content"):
        gpt(served).chat.completions.create(model="m", max_tokens=5, messages=[
            *HI, {"role": "assistant", "content": ANSWER, "reasoning_content": 3}, {"role": "user", "content": "x"}])
