"""Anthropic's Messages API and Ollama's API through their official clients, unmodified, on the
tiny model: whole and streamed replies, and a tool round (the scripted-logits hook makes the
random model write the call)."""
from __future__ import annotations

import json
import re

import pytest

anthropic = pytest.importorskip("anthropic", reason="the official client is the reference (test extra)")
ollama = pytest.importorskip("ollama", reason="the official client is the reference (test extra)")
openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")
pytest.importorskip("llguidance")

from tramontane.engine.api import SamplingParams  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import ThreadExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
CALL_TEXT = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}


@pytest.fixture(scope="module")
def served():
    engine = LocalEngine(MODEL, device="cpu", context_length=2048)
    executor = ThreadExecutor(engine)
    server = OpenAIServer(executor, port=0, ollama_port=0).start()
    server.engine = engine
    yield server
    server.stop()
    executor.shutdown()
    engine.close()


def claude(served):
    return anthropic.Anthropic(base_url=served.url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=60)


def test_anthropic_message_whole_and_streamed(served, script):
    script("Bonjour.")
    m = claude(served).messages.create(model="m", max_tokens=20, system="Be brief.",
                                       messages=[{"role": "user", "content": "hi"}])
    assert m.type == "message" and m.role == "assistant" and m.stop_reason == "end_turn"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "Bonjour."
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    script("Bonjour.")
    with claude(served).messages.stream(model="m", max_tokens=20,
                                        messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Bonjour." and final.content[0].text == "Bonjour." and final.stop_reason == "end_turn"


def test_anthropic_stream_starts_with_the_prompts_token_count(served, script):
    """message_start's usage holds the prompt's tokens, as Anthropic sends it (clients that show
    context use read it there; it said 0 until message_delta): the count_tokens answer."""
    script("Bonjour.")
    messages = [{"role": "user", "content": "hi there"}]
    events = list(claude(served).messages.create(model="m", max_tokens=20, messages=messages, stream=True))
    assert events[0].type == "message_start"
    counted = claude(served).messages.count_tokens(model="m", messages=messages).input_tokens
    assert events[0].message.usage.input_tokens == counted > 0
    assert events[-2].type == "message_delta" and events[-2].usage.input_tokens == counted


def test_anthropic_tool_round(served, script):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}]
    script("[TOOL_CALLS]", CALL_TEXT)
    c = claude(served)
    first = c.messages.create(model="m", max_tokens=60, tools=tools,
                              messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    script("21 degrees.")
    second = c.messages.create(model="m", max_tokens=20, tools=tools, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}]}])
    assert second.content[0].text == "21 degrees."
    assert c.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}]).input_tokens > 0


def test_anthropic_structured_outputs_constrain_the_text(served):
    """Anthropic's structured outputs: `output_config.format` (what the client's `messages.parse`
    and LangChain's ChatAnthropic json_schema method send) and the beta's `output_format`
    (pydantic-ai's NativeOutput) were ignored: the random model's text came back unparsable."""
    from typing import Literal

    from pydantic import BaseModel

    class Place(BaseModel):  # the client drops maxLength from what it sends (Anthropic's rule): an enum
        city: Literal["Paris", "Lyon"]
        coastal: bool

    c = claude(served)
    ask = [{"role": "user", "content": "Where?"}]
    for seed in (3, 4, 5):
        parsed = c.messages.parse(model="m", max_tokens=200, messages=ask, output_format=Place,
                                  extra_body={"seed": seed, "temperature": 1.0}).parsed_output
        assert isinstance(parsed, Place)
        beta = c.messages.create(model="m", max_tokens=200, messages=ask,
                                 extra_body={"seed": seed, "temperature": 1.0, "output_format": {"type": "json_schema", "schema": SCHEMA}})
        assert set(json.loads(beta.content[0].text)) == {"city"}  # closed by default, as response_format
    effort = c.messages.create(model="m", max_tokens=5, messages=ask, output_config={"effort": "high"})
    assert effort.stop_reason in ("max_tokens", "end_turn")  # mistral-common's effort names: accepted
    for body, words in [({"output_config": {"format": {"type": "xml"}}}, "output_config.format.type"),
                        ({"output_config": {"verbosity": "low"}}, "output_config.verbosity"),
                        ({"output_format": {"type": "json_schema", "schema": SCHEMA},
                          "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "not both")]:
        with pytest.raises(anthropic.BadRequestError, match=words):
            c.messages.create(model="m", max_tokens=5, messages=ask, extra_body=body)


def test_anthropic_errors_in_anthropic_shape(served):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude(served).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    assert info.value.body["type"] == "error" and "offline" in info.value.body["error"]["message"]


def test_ollama_chat_generate_and_listing(served, script):
    c = ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}")
    script("Bonjour.")
    r = c.chat(model="m", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 20})
    assert r.message.content == "Bonjour." and r.done and r.done_reason == "stop"
    script("Bonjour.")
    pieces = list(c.chat(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(p.message.content for p in pieces) == "Bonjour." and pieces[-1].done
    script("Bonjour.")
    assert c.generate(model="m", prompt="hi").response == "Bonjour."
    assert [m.model for m in c.list().models] == ["mistral3_tiny-f32"]
    assert "tools" in c.show("m").capabilities
    with pytest.raises(ollama.ResponseError):
        c.pull("llama3")


def test_ollama_tool_round_and_format(served, script):
    c = ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
    script("[TOOL_CALLS]", CALL_TEXT)
    r = c.chat(model="m", messages=[{"role": "user", "content": "Weather?"}], tools=tools)
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    script("21 degrees.")
    r2 = c.chat(model="m", tools=tools, messages=[{"role": "user", "content": "Weather?"}, r.message,
                                                  {"role": "tool", "content": "21 C", "tool_name": "get_weather"}])
    assert r2.message.content == "21 degrees."


def test_ollama_format_schema_is_closed_by_default(served):
    c = ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}")
    out = c.chat(model="m", messages=[{"role": "user", "content": "x"}], format=SCHEMA,
                 options={"temperature": 1.0, "seed": 3, "num_predict": 200})
    assert set(json.loads(out.message.content)) == {"city"}  # closed by default: no invented keys


def gpt(served):
    return openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=60)


def cut_call(served, script) -> int:
    """Scripts a call and returns a token limit that cuts it inside its arguments."""
    tok = served.engine.tokenizer
    script("[TOOL_CALLS]", CALL_TEXT)
    return 1 + len(tok.encode(CALL_TEXT)) - 3


def check_cut(name: str, arguments: str) -> None:
    assert name == "get_weather"
    assert '{"city": "Paris"}'.startswith(arguments) and arguments.startswith('{"city"')


OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]


def test_a_call_cut_by_max_tokens_is_length_with_the_call_so_far_on_every_api(served, script):
    c = gpt(served)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                  tools=OPENAI_TOOLS, max_tokens=cut_call(served, script))
    choice = r.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content  # never the wire format
    (call,) = choice.message.tool_calls
    check_cut(call.function.name, call.function.arguments)
    chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                            tools=OPENAI_TOOLS, max_tokens=cut_call(served, script), stream=True))
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "length"
    check_cut(deltas[0].function.name, "".join(d.function.arguments or "" for d in deltas))
    m = claude(served).messages.create(model="m", max_tokens=cut_call(served, script), messages=[
        {"role": "user", "content": "Weather?"}], tools=[{"name": "get_weather", "input_schema": SCHEMA}])
    assert m.stop_reason == "max_tokens" and [b.type for b in m.content] == ["tool_use"]
    assert m.content[0].name == "get_weather"  # its input unfinished: Anthropic's input is an object
    o = ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}").chat(
        model="m", messages=[{"role": "user", "content": "Weather?"}], tools=OPENAI_TOOLS,
        options={"num_predict": cut_call(served, script)})
    assert o.done_reason == "length" and not o.message.content
    assert o.message.tool_calls[0].function.name == "get_weather"


def test_a_call_cut_after_its_first_argument_keeps_it_whole_and_streamed(served, script):
    # the anthropic SDK reads a streamed input with a partial JSON parser: the whole reply's input
    # is what the client makes of the stream (it was {} whenever the call was cut)
    tok = served.engine.tokenizer
    text = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]'
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}
    cut = 1 + len(tok.encode(text)) - 4
    tools = [{"name": "get_weather", "input_schema": schema}]
    ask = [{"role": "user", "content": "Weather?"}]
    script("[TOOL_CALLS]", text)
    whole = claude(served).messages.create(model="m", max_tokens=cut, messages=ask, tools=tools)
    script("[TOOL_CALLS]", text)
    with claude(served).messages.stream(model="m", max_tokens=cut, messages=ask, tools=tools) as stream:
        streamed = stream.get_final_message()
    assert whole.stop_reason == streamed.stop_reason == "max_tokens"
    assert whole.content[0].input == streamed.content[0].input == {"city": "Paris"}
    script("[TOOL_CALLS]", text)
    o = ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}").chat(
        model="m", messages=ask, options={"num_predict": cut},
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": schema}}])
    assert o.message.tool_calls[0].function.arguments == {"city": "Paris"}


def test_a_control_token_in_a_tool_replys_text_is_left_out_whole_and_streamed(served, script):
    """With tools offered, control tokens are written by name (to read the calls back): a stream
    sent those names as content ("ang<SPECIAL_584> by...", which LangChain and litellm showed on
    the random model) while the whole reply left them out, and content before a call kept them."""
    ask = [{"role": "user", "content": "Weather?"}]
    oc = ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}")
    for pieces, calls in [(("Bon", "<SPECIAL_20>", "jour."), 0),
                          (("Bon", "<SPECIAL_20>", "jour.", "[TOOL_CALLS]", CALL_TEXT), 1)]:
        script(*pieces)
        whole = gpt(served).chat.completions.create(model="m", messages=ask, tools=OPENAI_TOOLS, max_tokens=60)
        assert whole.choices[0].message.content == "Bonjour." and len(whole.choices[0].message.tool_calls or []) == calls
        script(*pieces)
        chunks = list(gpt(served).chat.completions.create(model="m", messages=ask, tools=OPENAI_TOOLS, max_tokens=60,
                                                          stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Bonjour."
        script(*pieces)
        assert "".join(p.message.content for p in oc.chat(model="m", messages=ask, tools=OPENAI_TOOLS, stream=True,
                                                          options={"num_predict": 60})) == "Bonjour."
        script(*pieces)
        with claude(served).messages.stream(model="m", max_tokens=60, messages=ask,
                                            tools=[{"name": "get_weather", "input_schema": SCHEMA}]) as stream:
            assert "".join(stream.text_stream) == "Bonjour."


def test_capabilities_are_one_answer_in_models_and_show(served):
    listing = gpt(served).models.list().model_dump()
    shown = ollama.Client(host=f"http://127.0.0.1:{served.ollama_port}").show("m").capabilities
    assert listing["data"][0]["capabilities"] == ["completion", "tools"] == shown  # no projector: no vision
    assert listing["models"][0]["capabilities"] == shown


def test_vllms_structured_outputs_are_honoured_or_refused(served):
    c = gpt(served)
    free = {"temperature": 1.0, "seed": 11, "max_tokens": 40}
    ask = [{"role": "user", "content": "Pick."}]
    r = c.chat.completions.create(model="m", messages=ask, extra_body={"guided_choice": ["red", "green"]}, **free)
    assert r.choices[0].message.content in ("red", "green")
    r = c.completions.create(model="m", prompt="Pick", extra_body={"structured_outputs": {"choice": ["up", "down"]}},
                             **free)
    assert r.choices[0].text in ("up", "down")
    r = c.chat.completions.create(model="m", messages=ask, extra_body={"guided_regex": "[0-9]{3}/[a-z]{2}"}, **free)
    assert re.fullmatch(r"[0-9]{3}/[a-z]{2}", r.choices[0].message.content)
    r = c.chat.completions.create(model="m", messages=ask, extra_body={"guided_json": SCHEMA}, **free)
    assert set(json.loads(r.choices[0].message.content)) == {"city"}
    r = c.completions.create(model="m", prompt="Say", extra_body={"guided_grammar": 'start: "yes" | "no"'}, **free)
    assert r.choices[0].text in ("yes", "no")
    for extra, words in [({"guided_grammar": 'root ::= "yes"'}, "Lark"),
                         ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
                         ({"guided_choice": ["a"], "guided_regex": "a"}, "one structured output"),
                         ({"structured_outputs": {"structural_tag": "x"}}, "structural_tag")]:
        with pytest.raises(openai.BadRequestError, match=words):
            c.chat.completions.create(model="m", messages=ask, extra_body=extra, max_tokens=5)


def test_llama_servers_grammar_and_schema_fields_constrain_the_reply(served):
    """llama-server's `grammar` (GBNF), `json_schema` and `response_format: {type: json_object,
    schema}`, as its own server suite sends them (they were answered unconstrained)."""
    c = gpt(served)
    free = {"temperature": 1.0, "seed": 11, "max_tokens": 40}
    ask = [{"role": "user", "content": "Pick."}]
    r = c.completions.create(model="m", prompt="Say", extra_body={"grammar": 'root ::= ("yes" | "no") "!"'}, **free)
    assert r.choices[0].text in ("yes!", "no!")
    r = c.chat.completions.create(model="m", messages=ask, extra_body={"json_schema": SCHEMA}, **free)
    assert set(json.loads(r.choices[0].message.content)) == {"city"}
    r = c.chat.completions.create(model="m", messages=ask, **free,
                                  response_format={"type": "json_object", "schema": SCHEMA})
    assert set(json.loads(r.choices[0].message.content)) == {"city"}
    with pytest.raises(openai.BadRequestError, match="GBNF"):
        c.chat.completions.create(model="m", messages=ask, extra_body={"grammar": "root ::= ("}, max_tokens=5)

def test_completions_logprobs_in_the_legacy_shape_and_echo(served):
    c = gpt(served)
    r = c.completions.create(model="m", prompt="Once upon", max_tokens=6, temperature=0, logprobs=2,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs

    def reference(engine):
        tok = engine.tokenizer
        return engine.complete([tok.bos_id, *tok.encode("Once upon")],
                               SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True))

    want = served.executor.submit(reference).result()
    kept = [e for e in want.logprobs if not served.engine.tokenizer.is_control(e.token_id)]
    assert lp.tokens == [e.token for e in kept] and len(lp.top_logprobs) == len(kept)
    assert lp.token_logprobs == pytest.approx([e.logprob for e in kept], abs=1e-5)
    assert all(len(top) == 2 and max(top.values()) >= lp.token_logprobs[i] - 1e-6
               for i, top in enumerate(lp.top_logprobs))
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert r.choices[0].text == want.text
    chunks = list(c.completions.create(model="m", prompt="Once upon", max_tokens=6, temperature=0, logprobs=2,
                                       stream=True, extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks) == want.text
    streamed = legacy_logprobs_of(chunks)  # each chunk its own tokens', in order, offsets into the whole text
    assert streamed["tokens"] == lp.tokens and streamed["text_offset"] == lp.text_offset
    assert streamed["token_logprobs"] == pytest.approx(lp.token_logprobs, abs=1e-5)
    assert all(ch.choices[0].logprobs.tokens for ch in chunks if ch.choices[0].text)
    echoed = c.completions.create(model="m", prompt="Once upon", max_tokens=6, temperature=0, echo=True,
                                  extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == "Once upon" + want.text
    chunks = list(c.completions.create(model="m", prompt="Once upon", max_tokens=6, temperature=0, echo=True,
                                       stream=True, extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks) == "Once upon" + want.text
    for extra in ({"logprobs": 6},):  # echo with logprobs 1-5 gives the prompt's alternatives (test_echo_and_speculation)
        with pytest.raises(openai.BadRequestError, match="logprobs|echo"):
            c.completions.create(model="m", prompt="x", max_tokens=2, **extra)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_top_logprobs_always_hold_the_sampled_token(served, stream):
    """OpenAI's legacy logprobs: "the API will always return the logprob of the sampled token,
    so there may be up to logprobs+1 elements": logprobs 0 gives {token: its logprob} at each
    place, and a sampled token outside the top k is added to them (vLLM's tests check the same)."""
    c = gpt(served)
    for k in (0, 1):
        r = c.completions.create(model="m", prompt="Once upon", max_tokens=12, temperature=1.5, seed=7,
                                 logprobs=k, stream=stream, extra_body={"ignore_eos": True})
        lp = legacy_logprobs_of(list(r)) if stream else vars(r.choices[0].logprobs)
        assert lp["tokens"] and len(lp["top_logprobs"]) == len(lp["tokens"])
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            assert token in top and top[token] == pytest.approx(value, abs=1e-5)
            assert 1 <= len(top) <= k + 1
        if k == 0:
            assert all(len(top) == 1 for top in lp["top_logprobs"])


def legacy_logprobs_of(chunks) -> dict:
    """A text completion stream's logprobs, the chunks' lists joined."""
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for ch in chunks:
        if ch.choices and ch.choices[0].logprobs is not None:
            for name, values in joined.items():
                values += getattr(ch.choices[0].logprobs, name)
    return joined


def test_a_streamed_chats_chunks_carry_the_logprobs_of_their_own_tokens(served, script):
    """OpenAI streams each content chunk with the logprobs of the tokens it shows (llama.cpp's
    server suite checks the tokens' text against the chunk's); they were all on the last chunk."""
    c = gpt(served)
    ask = dict(model="m", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=40,
               temperature=0, logprobs=True, top_logprobs=2)
    story = "Once upon a time, a café by the sea sold naïve crêpes."
    script(story)
    whole = c.chat.completions.create(**ask).choices[0]
    assert whole.message.content == story
    script(story)
    chunks = [ch for ch in c.chat.completions.create(**ask, stream=True) if ch.choices]
    shown = [ch for ch in chunks if ch.choices[0].delta.content]
    assert len(shown) > 1 and all(ch.choices[0].logprobs is not None for ch in shown)
    for ch in shown:  # the chunk's text is its tokens' bytes
        entries = ch.choices[0].logprobs.content
        assert entries and b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == \
            ch.choices[0].delta.content
    streamed = [e for ch in chunks if ch.choices[0].logprobs is not None for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in whole.logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in whole.logprobs.content], abs=1e-5)
    assert [[t.token for t in e.top_logprobs] for e in streamed] == \
        [[t.token for t in e.top_logprobs] for e in whole.logprobs.content]


def test_chat_logprobs_never_show_a_control_token_the_content_leaves_out(served, script):
    script("[TOOL_CALLS]", CALL_TEXT)
    r = gpt(served).chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                            tools=OPENAI_TOOLS, max_tokens=60, logprobs=True)
    assert r.choices[0].message.tool_calls and r.choices[0].logprobs.content
    assert "[TOOL_CALLS]" not in [e.token for e in r.choices[0].logprobs.content]
