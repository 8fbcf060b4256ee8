"""Request checking and conversation keys of the OpenAI server, without HTTP or a model."""
import base64
import dataclasses
import io

import pytest
from PIL import Image

from tramontane.engine.api import ChatMessage, GenerationResult, GenerationStats, ImagePart
from tramontane.engine.server.openai_api import (
    ApiError, ConversationKeys, RequestLimits, ServedModel, parse_chat_request,
    parse_completion_request, stop_reason, usage)
from tramontane.engine.api import SamplingParams

VISION = ServedModel("tiny", has_vision=True, context_size=512)
TEXT_ONLY = ServedModel("tiny", has_vision=False, context_size=512)
LIMITS = RequestLimits()


def png_url(size=(9, 7)) -> tuple[str, bytes]:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buf, "PNG")
    data = buf.getvalue()
    return "data:image/png;base64," + base64.b64encode(data).decode(), data


def chat(**fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat_request(body, VISION, LIMITS)


def refused(body, model=VISION, limits=LIMITS, parse=parse_chat_request) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body, model, limits)
    return info.value


def test_sampling_fields_map_to_the_engine_params():
    job = chat(temperature=0.7, top_p=0.9, max_tokens=12, stop="END", seed=3, top_k=5, min_p=0.1,
               repetition_penalty=1.1, stream=True, stream_options={"include_usage": True})
    p = job.params
    assert (p.temperature, p.top_p, p.max_tokens, p.stop, p.seed, p.top_k, p.min_p, p.repetition_penalty) == \
        (0.7, 0.9, 12, ["END"], 3, 5, 0.1, 1.1)
    assert job.stream and job.include_usage
    # max_completion_tokens wins over the deprecated max_tokens; no limit = the whole context.
    assert chat(max_tokens=5, max_completion_tokens=9).params.max_tokens == 9
    assert chat().params.max_tokens == 512
    assert chat().params.temperature == SamplingParams().temperature  # the window's default


@pytest.mark.parametrize("field, value, words", [
    ("temperature", -1, "temperature: must be in [0, 2]"),
    ("temperature", "hot", "temperature: must be a number"),
    ("top_p", 0, "top_p: must be in (0, 1]"),
    ("max_tokens", -2, "max_tokens: must be at least 1"),
    ("max_tokens", 0, "max_tokens: must be at least 1"),
    ("max_completion_tokens", 0, "max_completion_tokens: must be at least 1"),
    ("n", 9, "n: at most 8 choices"),
    ("n", 0, "n: must be at least 1"),
    ("max_tokens", 2.5, "max_tokens: must be an integer"),
    ("stop", [1, 2], "stop: must be a string or a list of strings"),
    ("stream", "yes", "stream: must be true or false"),
    ("seed", 1 << 70, "seed: must be a 64-bit integer"),
    ("presence_penalty", 0.5, "presence_penalty: not supported"),
    ("frequency_penalty", -0.2, "frequency_penalty: not supported"),
    ("logprobs", "yes", "logprobs: must be true or false"),
    ("tools", {"type": "function"}, "tools: must be a list"),
    ("response_format", "json", "response_format: must be an object"),
    ("reasoning_effort", "extreme", "reasoning_effort: must be one of none, minimal, low"),
    ("reasoning_effort", 3, "reasoning_effort: must be one of"),
])
def test_bad_or_unsupported_fields_are_refused_by_name(field, value, words):
    err = refused({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], field: value})
    assert err.status == 400 and words in err.message and err.param == field
    assert err.body()["error"]["type"] == "invalid_request_error"


def test_a_known_reasoning_effort_is_accepted_and_changes_nothing():
    """mistral-common's names, as vLLM accepts them for formats before v15 (runtime.reasoning)."""
    for effort in ("none", "low", "high"):
        assert chat(reasoning_effort=effort).params == chat().params


def test_neutral_values_of_unsupported_fields_are_accepted():
    job = chat(n=1, presence_penalty=0, frequency_penalty=0.0, logprobs=False, tools=[],
               tool_choice="auto", response_format={"type": "text"}, user="someone")
    assert job.messages[0].text_content == "hi"


def test_messages_become_chat_messages_with_images_in_order():
    url, data = png_url()
    job = chat(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": "and this"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": "again"}])
    m = job.messages
    assert [x.role for x in m] == ["system", "user", "assistant", "user"]
    assert m[1].parts[0] == "look" and m[1].parts[2] == "and this"
    assert isinstance(m[1].parts[1], ImagePart) and m[1].parts[1].data == data


@pytest.mark.parametrize("messages, status, words", [
    ([], 400, "messages: must be a non-empty list"),
    ([{"role": "wizard", "content": "x"}], 400, "messages[0].role: must be system, user, assistant or tool"),
    ([{"role": "tool", "content": "x"}], 400, "messages[0].tool_call_id: a tool message must name"),
    ([{"role": "user", "content": [{"type": "input_audio"}]}], 400, "messages[0].content[0].type: 'input_audio'"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}]}],
     400, "only data: URLs are accepted, not https URLs"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}],
     400, "not valid base64"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGVsbG8gd29ybGQh"}}]}],
     400, "not a PNG, JPEG"),
])
def test_bad_messages_name_the_field(messages, status, words):
    err = refused({"messages": messages})
    assert err.status == status and words in err.message, err.message


def test_images_are_refused_on_a_text_only_model_and_past_the_limits():
    url, data = png_url()
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    err = refused(body, model=TEXT_ONLY)
    assert err.status == 400 and "has no vision projector" in err.message and err.code == "model_has_no_vision"
    err = refused(body, limits=RequestLimits(max_image_bytes=len(data) // 2))
    assert err.status == 413 and "larger than the limit" in err.message
    two = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}] * 2}]}
    err = refused(two, limits=RequestLimits(max_images=1))
    assert err.status == 413 and "at most 1 images" in err.message


def test_any_model_name_means_the_loaded_one_unless_the_server_is_strict():
    hi = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat_request({"model": "gpt-4o", **hi}, VISION, LIMITS).messages
    assert parse_chat_request(hi, VISION, LIMITS).messages
    strict = dataclasses.replace(VISION, aliases=("my-alias",), strict=True)
    err = refused({"model": "gpt-4o", **hi}, model=strict)
    assert err.status == 404 and err.code == "model_not_found" and "'tiny', 'my-alias'" in err.message
    assert parse_chat_request({"model": "my-alias", **hi}, strict, LIMITS).messages
    assert refused({"model": 7, **hi}).param == "model"


def test_an_assistant_message_last_is_a_prefix_to_continue():
    job = parse_chat_request({"messages": [{"role": "user", "content": "hi"},
                                           {"role": "assistant", "content": "Once upon"}]}, VISION, LIMITS)
    assert job.continue_final and job.messages[-1].role == "assistant"
    assert not chat().continue_final


def test_completion_prompts_are_text_or_token_ids():
    assert parse_completion_request({"prompt": "Once"}, VISION, LIMITS).prompt == "Once"
    assert parse_completion_request({"prompt": [1, 5, 9]}, VISION, LIMITS).prompt == [1, 5, 9]
    assert parse_completion_request({"prompt": ["Once"]}, VISION, LIMITS).prompt == "Once"
    several = parse_completion_request({"prompt": ["a", [1, 2], "c"], "n": 2}, VISION, LIMITS)
    assert several.prompts == ["a", [1, 2], "c"] and several.n == 2
    for bad in (None, [], [1, "x"], 5, ["a", 5], [[]], ["x"] * 33):
        assert "prompt:" in refused({"prompt": bad}, parse=parse_completion_request).message
    assert parse_completion_request({"prompt": "x", "echo": True}, VISION, LIMITS).echo
    with_alternatives = parse_completion_request({"prompt": "x", "echo": True, "logprobs": 2}, VISION, LIMITS)
    assert with_alternatives.echo and with_alternatives.tool_request.top_logprobs == 2  # the prompt's too
    scored = parse_completion_request({"prompt": "x", "echo": True, "logprobs": 0}, VISION, LIMITS)
    assert scored.echo and scored.tool_request.top_logprobs == 0  # each prompt token's own log-probability
    assert parse_completion_request({"prompt": "x", "logprobs": 5}, VISION, LIMITS).tool_request.top_logprobs == 5
    for wrong in (6, -1, True, "2"):
        assert "logprobs: must be an integer 0..5" in refused({"prompt": "x", "logprobs": wrong},
                                                              parse=parse_completion_request).message


def msgs(*texts):
    roles = ["user", "assistant"]
    return [ChatMessage.text(roles[i % 2], t) for i, t in enumerate(texts)]


def test_conversation_keys_follow_a_growing_conversation_and_keep_others_apart():
    keys = ConversationKeys()
    k1 = keys.key_for(msgs("hello"))
    assert k1.startswith("openai:")
    keys.remember(msgs("hello"), "hi there", k1)
    assert keys.key_for(msgs("hello")) == k1  # the same request again (regenerate)
    assert keys.key_for(msgs("hello", "hi there", "how are you")) == k1  # the next turn
    other = keys.key_for(msgs("bonjour"))
    assert other != k1
    # A different reply in the history is a different conversation from that point on: the
    # longest known prefix ("hello") still names k1, whose KV the engine keeps up to there.
    assert keys.key_for(msgs("hello", "something else", "x")) == k1
    assert keys.key_for(msgs("hola", "hi there", "how are you")) not in (k1, other)


def test_conversation_digests_see_images_and_part_boundaries():
    keys = ConversationKeys()
    a = [ChatMessage("user", ["look", ImagePart(b"\x89PNG one")])]
    b = [ChatMessage("user", ["look", ImagePart(b"\x89PNG two")])]
    ka = keys.key_for(a)
    keys.remember(a, "r", ka)
    assert keys.key_for(b) != ka
    assert keys.key_for([ChatMessage("user", ["lo", "ok", ImagePart(b"\x89PNG one")])]) != ka


def test_conversation_keys_are_bounded():
    keys = ConversationKeys(capacity=4)
    for i in range(10):
        keys.remember(msgs(f"q{i}"), "a", f"openai:{i}")
    assert len(keys._keys) == 4
    assert keys.key_for(msgs("q9")) == "openai:9"
    assert keys.key_for(msgs("q0")) != "openai:0"


def result(text, reason, ids=(1, 2), prompt=10, reused=4):
    stats = GenerationStats(prompt_tokens=prompt, reused_tokens=reused, generated_tokens=len(ids),
                            finish_reason=reason)
    return GenerationResult(text, list(ids), [], stats)


def test_usage_and_stop_reason():
    assert usage(result("x", "stop")) == {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                                          "prompt_tokens_details": {"cached_tokens": 4}}
    params = SamplingParams(stop=["zz", "END"])
    assert stop_reason(result("abc", "stop_string"), params, "abcEND and more") == "END"
    assert stop_reason(result("abc", "stop"), params, "abc") is None
