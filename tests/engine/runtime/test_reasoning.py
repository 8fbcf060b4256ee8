"""The reasoning splitter (issue 36): generated tokens routed to thought or answer at the
[THINK] / [/THINK] ids, streamed token by token through the tokenizer's own stream decoder.

References: mistral-common's own splitter of generated tokens into think and content chunks
(`mistral_common.experimental.think._split_content_and_think_chunks`, what its server turns
into ThinkChunk / TextChunk) for well-formed replies; vLLM's `mistral` reasoning parser's rules
(vllm/reasoning/mistral_reasoning_parser.py) for the malformed ones mistral-common refuses
(a [/THINK] with no [THINK]: all answer, the token dropped; text before [THINK]: answer).
"""
from __future__ import annotations

import pytest

from tramontane.engine.api import ThinkPart
from tramontane.engine.runtime.reasoning import (REASONING_EFFORTS, ReasoningDelta, ReasoningSplitter,
                                                   reasoning_effort_error, split_reasoning)

from support.tekken_versions import our_tokenizer

pytest.importorskip("mistral_common")
from mistral_common.experimental.think import _split_content_and_think_chunks  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return our_tokenizer(13)


def _reply(tok, *segments) -> list[int]:
    """Ids of a reply written as text segments and the names "[THINK]" / "[/THINK]"."""
    ids = []
    for seg in segments:
        ids += [tok.token_id(seg)] if seg in ("[THINK]", "[/THINK]") else tok.encode(seg)
    return ids


def _stream(tok, ids, control_text=False):
    """Push each id with the piece the tokenizer's stream decoder gives for it."""
    splitter = ReasoningSplitter(*tok.think_ids)
    decoder = tok.stream(skip_special=not control_text)
    deltas = [splitter.push(t, decoder.push(t)) for t in ids]
    deltas.append(splitter.push_many([], []))  # nothing: nothing added
    tail = decoder.flush()
    if tail:  # an unfinished character at the very end
        deltas.append(splitter._text(tail))
    return splitter, deltas


def _mistral_common_split(tok, ids):
    """(reasoning, content, closed) as mistral-common's chunks decode."""
    begin, end = tok.think_ids
    chunks = _split_content_and_think_chunks(ids, begin, end)
    thoughts = [c for c, is_think in chunks if is_think]
    reasoning = "".join(tok.decode(c) for c in thoughts)
    content = "".join(tok.decode(c) for c, is_think in chunks if not is_think)
    closed = bool(thoughts) and thoughts[-1][-1] == end
    return reasoning, content, closed, bool(thoughts)


WELL_FORMED = {
    "thought_then_answer": ("[THINK]", "Two and two.\nThat is 4.", "[/THINK]", "It is **4**."),
    "thought_only": ("[THINK]", "Thinking about it", "[/THINK]"),
    "unclosed_thought": ("[THINK]", "I ran out of tokens while"),
    "no_thought": ("Just an answer, no thinking.",),
    "text_before_the_thought": ("\n", "[THINK]", "hmm", "[/THINK]", "\nThe rest"),
    "empty_thought": ("[THINK]", "[/THINK]", "answer"),
    "unicode_split_across_tokens": ("[THINK]", "日本語 😀 🧠", "[/THINK]", "مرحبا 😀"),
    "emoji_right_before_the_end": ("[THINK]", "think 🧠", "[/THINK]", "🤖"),
}


def _cut_character(tok, text: str) -> list[int]:
    """The first byte tokens of a character whose bytes are tokens of their own (a model may
    stop a character half-way, then write a think token: the decoder flushes U+FFFD)."""
    ids = tok.encode(text)
    assert len(ids) > 1
    return ids[:-1]


@pytest.mark.parametrize("control_text", [False, True], ids=["plain", "control_text"])
@pytest.mark.parametrize("name", [*WELL_FORMED, "character_cut_by_think", "character_cut_by_end_think"])
def test_streamed_split_matches_mistral_common(tok, name, control_text):
    if name == "character_cut_by_think":
        ids = [*tok.encode("ok "), *_cut_character(tok, "🧠"), *_reply(tok, "[THINK]", "t", "[/THINK]", "a")]
    elif name == "character_cut_by_end_think":
        ids = [*_reply(tok, "[THINK]", "t "), *_cut_character(tok, "😀"), *_reply(tok, "[/THINK]", "a")]
    else:
        ids = _reply(tok, *WELL_FORMED[name])
    reasoning, content, closed, started = _mistral_common_split(tok, ids)
    splitter, deltas = _stream(tok, ids, control_text)
    assert (splitter.reasoning, splitter.content, splitter.closed, splitter.started) == \
        (reasoning, content, closed, started)
    # the deltas are the whole text, in order, each side once
    assert "".join(d.reasoning for d in deltas) == reasoning
    assert "".join(d.content for d in deltas) == content
    assert "[THINK]" not in splitter.reasoning + splitter.content  # the names are removed
    assert "[/THINK]" not in splitter.reasoning + splitter.content


def test_the_parts_encode_back_to_the_reply(tok):
    """parts() of a reply is what the chat format writes for it in a later turn."""
    from tramontane.engine.api import ChatMessage
    from tramontane.engine.mistral3.chat_format import encode_chat

    ids = _reply(tok, "[THINK]", "Two and two.", "[/THINK]", "It is 4.")
    splitter, _ = _stream(tok, ids)
    assert splitter.parts() == [ThinkPart("Two and two.", closed=True), "It is 4."]
    prompt = encode_chat(tok, [ChatMessage.text("user", "q"), ChatMessage("assistant", splitter.parts())]).ids
    assert prompt[prompt.index(tok.token_id("[/INST]")) + 1:-1] == ids
    cut, _ = _stream(tok, _reply(tok, "[THINK]", "cut off"))
    assert cut.parts() == [ThinkPart("cut off", closed=False)] and cut.thinking and not cut.answering


def test_streaming_says_which_side_each_token_is_on(tok):
    ids = _reply(tok, "[THINK]", "a", "[/THINK]", "b")
    splitter = ReasoningSplitter(*tok.think_ids)
    sides = []
    for t in ids:
        splitter.push(t, tok.piece(t) if not tok.is_control(t) else "")
        sides.append("thinking" if splitter.thinking else "answering")
    assert sides == ["thinking", "thinking", "answering", "answering"]
    assert splitter.push(tok.encode("c")[0], "c") == ReasoningDelta(content="c")


# vLLM's rules where mistral-common's splitter refuses the reply
@pytest.mark.parametrize("segments, reasoning, content, closed", [
    (("A reasoning section", "[/THINK]", "The rest"), "", "A reasoning sectionThe rest", False),
    (("[/THINK]", "The rest"), "", "The rest", False),
    (("[THINK]", "one", "[THINK]", " two", "[/THINK]", "answer"), "one two", "answer", True),
    (("[THINK]", "t", "[/THINK]", "a", "[THINK]", "b", "[/THINK]", "c"), "t", "abc", True),
])
def test_malformed_replies_follow_vllm(tok, segments, reasoning, content, closed):
    ids = _reply(tok, *segments)
    splitter, _ = _stream(tok, ids)
    assert (splitter.reasoning, splitter.content, splitter.closed) == (reasoning, content, closed)
    whole = split_reasoning(tok.think_ids, ids, [tok.decode([t]) for t in ids])
    assert (whole.reasoning, whole.content, whole.closed) == (reasoning, content, closed)


def test_a_prompt_that_opened_the_thought(tok):
    splitter = ReasoningSplitter(*tok.think_ids, thinking=True)
    ids = _reply(tok, "already thinking", "[/THINK]", "answer")
    splitter.push_many(ids, [tok.decode([t]) for t in ids])
    assert (splitter.reasoning, splitter.content, splitter.closed) == ("already thinking", "answer", True)


def test_only_a_model_that_thinks_gets_a_splitter(tok):
    assert ReasoningSplitter.for_tokenizer(tok) is not None
    assert ReasoningSplitter.for_tokenizer(our_tokenizer(7)) is None
    assert ReasoningSplitter.for_tokenizer(our_tokenizer(11)) is None  # v11: [THINK] slots, no thoughts
    with pytest.raises(ValueError):
        ReasoningSplitter(5, 5)
    with pytest.raises(ValueError):
        ReasoningSplitter(*tok.think_ids).push_many([1, 2], ["a"])


# ----------------------------------------------------------------------------- reasoning effort

def test_the_effort_names_are_mistral_commons_and_v13_has_no_effort_control(tmp_path):
    """What `reasoning_effort_error` accepts is mistral-common's ReasoningEffort, and the premise of
    accepting it without effect holds: mistral-common encodes a v13 request without an effort and
    refuses one with any (only a v15 tokenizer writes it), so no Mistral 3 model here has one."""
    from mistral_common.exceptions import InvalidRequestException
    from mistral_common.protocol.instruct.messages import UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest, ReasoningEffort

    from support.tekken_versions import reference_tokenizer

    assert REASONING_EFFORTS == tuple(e.value for e in ReasoningEffort)
    ref = reference_tokenizer(13, tmp_path)
    ref.encode_chat_completion(ChatCompletionRequest(messages=[UserMessage(content="q")]))
    for effort in REASONING_EFFORTS:
        with pytest.raises(InvalidRequestException, match="reasoning_effort"):
            ref.encode_chat_completion(ChatCompletionRequest(messages=[UserMessage(content="q")],
                                                             reasoning_effort=effort))


@pytest.mark.parametrize("value", [None, "none", "low", "medium", "high", "max"])
def test_an_effort_by_name_is_accepted(value):
    assert reasoning_effort_error(value) is None


@pytest.mark.parametrize("value", ["hidden", "HIGH", "", 3, True, ["high"]])
def test_another_effort_is_refused_naming_the_values(value):
    assert reasoning_effort_error(value) == (
        f"must be one of none, minimal, low, medium, high, xhigh, max, got {value!r}")
