"""OpenAI's Responses API through the official `openai` client, unmodified, on the tiny model
with its projector: whole and streamed (the semantic events, in the order the client's stream
helper accumulates), an image, a tool round continued by previous_response_id, text.format from
a pydantic model, and the refusals. The prompt each gets is compared with the chat completion
of the same conversation (the one request model under both)."""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("llguidance")
from PIL import Image  # noqa: E402

from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import ThreadExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402
from tramontane.engine.server.responses_api import ResponseStore  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
CALL_TEXT = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": SCHEMA}]


@pytest.fixture(scope="module")
def served():
    engine = LocalEngine(MODEL, MMPROJ, device="cpu", context_length=2048)
    executor = ThreadExecutor(engine)
    server = OpenAIServer(executor, port=0, on_finished=lambda f: server.finished.append(f)).start()
    server.finished = []
    server.engine = engine
    yield server
    server.stop()
    executor.shutdown()
    engine.close()


def gpt(served):
    return openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=60)


def photo(seed: int) -> str:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (42, 56, 3), dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def last_prompt(served) -> list[int]:
    return served.finished[-1].result.prompt_token_ids


def test_text_whole_and_streamed_with_instructions(served, script):
    c = gpt(served)
    script("Bonjour.")
    r = c.responses.create(model="m", instructions="Be brief.", input="hi", max_output_tokens=20)
    assert r.status == "completed" and r.output_text == "Bonjour." and r.id.startswith("resp_")
    assert r.usage.input_tokens == len(last_prompt(served)) and r.usage.output_tokens > 0
    responses_prompt = last_prompt(served)
    script("Bonjour.")
    c.chat.completions.create(model="m", max_tokens=20, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert last_prompt(served) == responses_prompt  # one request model under both APIs
    script("Bonjour.")
    events = list(c.responses.create(model="m", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "hi"}]}], max_output_tokens=20, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Bonjour."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == "Bonjour." and events[-1].response.usage.output_tokens > 0
    script("Bonjour.")
    with c.responses.stream(model="m", input="hi", max_output_tokens=20) as stream:  # the client's accumulator
        final = stream.get_final_response()
    assert final.output_text == "Bonjour."
    assert c.responses.retrieve(final.id).output_text == "Bonjour."


def test_an_image_reaches_the_prompt_as_in_a_chat_completion(served, script):
    url = photo(3)
    script("A square.")
    r = gpt(served).responses.create(model="m", max_output_tokens=10, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": url}]}])
    assert r.output_text == "A square."
    responses_prompt = last_prompt(served)
    assert served.engine.tokenizer.token_id("[IMG]") in responses_prompt
    script("A square.")
    gpt(served).chat.completions.create(model="m", max_tokens=10, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}])
    assert last_prompt(served) == responses_prompt


def test_a_tool_round_whole_and_streamed_then_previous_response_id(served, script):
    c = gpt(served)
    script("[TOOL_CALLS]", CALL_TEXT)
    first = c.responses.create(model="m", input="Weather in Paris?", tools=TOOLS, max_output_tokens=60)
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert not [o for o in first.output if o.type == "message"]  # the wire format never as text
    script("[TOOL_CALLS]", CALL_TEXT)
    events = list(c.responses.create(model="m", input="Weather in Paris?", tools=TOOLS, max_output_tokens=60,
                                     stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(deltas) == done.arguments == call.arguments
    assert not [e for e in events if e.type == "response.output_text.delta"]
    script("21 degrees.")
    second = c.responses.create(model="m", previous_response_id=first.id, tools=TOOLS, max_output_tokens=20,
                                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}])
    assert second.output_text == "21 degrees." and second.previous_response_id == first.id
    continued = last_prompt(served)
    script("21 degrees.")  # the same conversation as chat messages: the same prompt
    c.chat.completions.create(model="m", max_tokens=20, tools=[
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": SCHEMA}}],
        messages=[{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
                      "name": "get_weather", "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "21 C"}])
    assert last_prompt(served) == continued


def test_a_call_cut_by_max_output_tokens_is_incomplete_with_the_call_so_far(served, script):
    script("[TOOL_CALLS]", CALL_TEXT)
    limit = 1 + len(served.engine.tokenizer.encode(CALL_TEXT)) - 3
    r = gpt(served).responses.create(model="m", input="Weather?", tools=TOOLS, max_output_tokens=limit)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert '{"city": "Paris"}'.startswith(call.arguments) and call.arguments.startswith('{"city"')


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    sunny: bool


def test_text_format_from_a_pydantic_model(served):
    r = gpt(served).responses.parse(model="m", input="Weather?", text_format=City, max_output_tokens=80,
                                    temperature=1.0, extra_body={"seed": 5})
    assert isinstance(r.output_parsed, City)
    # the schema pydantic writes itself leaves additionalProperties unset: closed by default
    r = gpt(served).responses.create(model="m", input="Weather?", max_output_tokens=80, temperature=1.0, extra_body={"seed": 7},
                                     text={"format": {"type": "json_schema", "name": "city",
                                                      "schema": City.model_json_schema()}})
    assert set(json.loads(r.output_text)) == {"city", "sunny"}


def test_refusals_name_the_field(served):
    c = gpt(served)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        c.responses.create(model="m", input="hi", previous_response_id="resp_nope")
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        c.responses.create(model="m", input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match=r"input\[0\].content\[0\].image_url"):
        c.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}])
    with pytest.raises(openai.BadRequestError, match="background"):
        c.responses.create(model="m", input="hi", background=True)


def test_a_prompt_over_the_context_names_input(served):
    """Counted after encoding (its tools make it too long), the refusal named `messages`, a field
    the Responses API has not got (pydantic-ai's tool runs met it on the tiny model's context)."""
    many = [dict(TOOLS[0], name=f"tool_{i}", description="Looks the weather up in one city. " * 8)
            for i in range(40)]
    with pytest.raises(openai.BadRequestError) as info:
        gpt(served).responses.create(model="m", input="hi", tools=many, max_output_tokens=5)
    assert info.value.body["param"] == "input" and info.value.body["message"].startswith("input: ")


def test_the_store_is_bounded_in_count_and_bytes():
    from tramontane.engine.api import ChatMessage

    store = ResponseStore(capacity=3, max_bytes=100)
    for i in range(5):
        store.put(f"r{i}", [ChatMessage.text("user", "x" * 10)])
    assert [store.get(f"r{i}") is None for i in range(5)] == [True, True, False, False, False]
    store.put("big", [ChatMessage.text("user", "y" * 90)])
    assert store.get("r3") is None and store.get("r4") is not None and store.get("big") is not None  # 100 bytes


def test_reasoning_effort_by_the_one_rule(served, script):
    """The Responses API's `reasoning.effort` (the openai client's `reasoning=`): one of
    mistral-common's names is accepted, changing nothing for these formats, and repeated in the
    response; any other value, or a reasoning that is no object, is refused naming the field."""
    c = gpt(served)
    script("Bonjour.")
    r = c.responses.create(model="m", input="hi", max_output_tokens=20, reasoning={"effort": "high"})
    assert r.output_text == "Bonjour." and r.reasoning.effort == "high"
    script("Bonjour.")
    plain = c.responses.create(model="m", input="hi", max_output_tokens=20)
    assert plain.output_text == "Bonjour." and plain.reasoning is None
    for reasoning, field in [({"effort": "extreme"}, "reasoning.effort"), ("high", "reasoning")]:
        with pytest.raises(openai.BadRequestError) as info:
            c.responses.create(model="m", input="hi", max_output_tokens=5, reasoning=reasoning)
        assert info.value.body["param"] == field and field in info.value.message
