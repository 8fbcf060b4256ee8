"""Reasoning models' prompts (issue 36): thoughts in earlier assistant turns and in system
messages, with tools, images and system prompts, token-exact with mistral-common's
`encode_chat_completion` for v13 (think chunks) and, for v7 / v11 (no think chunks), the same
conversation without its thoughts; the chat-format version and thinking read from the file,
also from the real templates the family's GGUF files carry; and every catalogue model's chat
(its shipped system prompt with the chat's, images, thoughts, tools) for its version.

Reference: mistral-common's tokenizers of support.tekken_versions, with Mistral Small 3.1's image
settings so images are encoded by its own image encoder; ours gets mistral-common's rows/cols per
image through `image_grid` and must place the tokens where it does.
"""
from __future__ import annotations

import io
import os

import pytest

from tramontane.engine.api import ChatMessage, EngineError, ImagePart, ThinkPart, ToolCall, ToolSpec
from tramontane.engine.mistral3.chat_format import encode_chat

from support.tekken_versions import (LATER_CONTROLS, SMALL31_IMAGE, TEMPLATES, our_tokenizer, pil_image, reference_grid,
                                     reference_tokenizer)

pytest.importorskip("mistral_common")
from PIL import Image  # noqa: E402
from mistral_common.protocol.instruct.chunk import ImageChunk, TextChunk, ThinkChunk  # noqa: E402
from mistral_common.protocol.instruct.messages import (  # noqa: E402
    AssistantMessage, SystemMessage, ToolMessage, UserMessage)
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import ToolCall as RefToolCall  # noqa: E402


@pytest.fixture(scope="module", params=[7, 11, 13], ids=lambda v: f"v{v}")
def pair(request, tmp_path_factory):
    version = request.param
    return version, our_tokenizer(version), reference_tokenizer(version, tmp_path_factory.mktemp("mc"),
                                                                 image=SMALL31_IMAGE)


def _png(w: int, h: int, color=(200, 30, 60)) -> ImagePart:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return ImagePart(buf.getvalue(), f"{w}x{h}.png")


IMG_A = _png(60, 30)  # 3 cols x 2 rows
IMG_B = _png(100, 200, (10, 200, 10))  # 4 x 8


# ----------------------------------------------------------------------------- to mistral-common

def _chunk(part):
    if isinstance(part, str):
        return TextChunk(text=part)
    if isinstance(part, ThinkPart):
        return ThinkChunk(thinking=part.text, closed=part.closed)
    return ImageChunk(image=pil_image(part))


def _content(parts, keep_thoughts: bool):
    parts = [p for p in parts if keep_thoughts or not isinstance(p, ThinkPart)]
    if all(isinstance(p, str) for p in parts):
        return "".join(parts) if len(parts) <= 1 else [TextChunk(text=p) for p in parts]
    return [_chunk(p) for p in parts]


def _ref_message(m: ChatMessage, keep_thoughts: bool):
    content = _content(m.parts, keep_thoughts)
    if m.role == "system":
        return SystemMessage(content=content)
    if m.role == "user":
        return UserMessage(content=content)
    if m.role == "tool":
        return ToolMessage(content=content, tool_call_id=m.tool_call_id)
    calls = [RefToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
             for c in m.tool_calls] or None
    return AssistantMessage(content=content or None, tool_calls=calls)


def _reference_ids(ref, messages, tools, keep_thoughts: bool) -> list[int]:
    request = ChatCompletionRequest(
        messages=[_ref_message(m, keep_thoughts) for m in messages],
        tools=[Tool(function=Function(name=t.name, description=t.description, parameters=t.parameters))
               for t in tools] if tools else None)
    return ref.encode_chat_completion(request).tokens


# ----------------------------------------------------------------------------- conversations

def S(*parts):
    return ChatMessage("system", list(parts))


def U(*parts):
    return ChatMessage("user", list(parts))


def A(*parts, calls=()):
    return ChatMessage("assistant", list(parts), list(calls))


def T(call_id, text):
    return ChatMessage("tool", [text], tool_call_id=call_id)


def Th(text, closed=True):
    return ThinkPart(text, closed)


# the shape of the system prompt Magistral 1.2 and Ministral 3 Reasoning ship: text, a thought, text
THINK_TEMPLATE = S("# HOW YOU SHOULD THINK AND ANSWER\n\nFirst draft your thinking process.\n\n"
                   "Your thinking process must follow the template below:",
                   Th("Your thoughts or/and draft, like working through an exercise on scratch paper."),
                   "Here, provide a self-contained response.")
WEATHER = ToolSpec("get_weather", "Weather now in a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
CALL = ToolCall("a1B2c3D4e", "get_weather", '{"city": "Paris"}')

CONVERSATIONS = {
    "system_template_then_question": ([THINK_TEMPLATE, U("What is 2+2?")], None),
    "earlier_thought_and_answer": (
        [THINK_TEMPLATE, U("What is 2+2?"), A(Th("Two and two.\nThat is 4."), "It is **4**."),
         U("And 3+3?")], None),
    "thought_keeps_trailing_spaces": ([U("q"), A(Th("hmm "), "answer  "), U("next")], None),
    "unclosed_thought_then_text": ([U("q"), A(Th("I was cut off", closed=False), "partial"), U("go on")], None),
    "thought_only_reply": ([U("q"), A(Th("only thinking")), U("well?")], None),
    "empty_thought": ([U("q"), A(Th(""), "a"), U("b")], None),
    "merged_assistants_thought_ends_a_text_run": (
        [U("q"), A("before"), A(Th("mid"), "after one"), A("after two "), U("ok")], None),
    "thoughts_of_several_turns": (
        [S("Be brief."), U("one"), A(Th("t1"), "a1"), U("two"), A(Th("t2"), "a2"), U("three")], None),
    "thought_then_tool_call_and_result": (
        [THINK_TEMPLATE, U("Weather in Paris?"), A(Th("I should call the tool."), calls=[CALL]),
         T(CALL.id, "21 degrees"), A(Th("The tool said 21."), "It is 21 °C."), U("Thanks")], [WEATHER]),
    "images_with_thinking_system_prompt": (
        [THINK_TEMPLATE, U("What is in these?", IMG_A, "and", IMG_B), A(Th("Red, then green."), "Two boxes."),
         U("Which is taller?", IMG_B)], None),
    "plain_system_user_image": ([S("You describe images."), U(IMG_A, "describe")], None),
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_prompt_ids_match_mistral_common(pair, name):
    """v13 encodes the thoughts as mistral-common does; v7 and v11 have no think chunks, so an
    earlier turn's thought is left out (the conversation mistral-common is given has none) and a
    system thought is refused."""
    version, tok, ref = pair
    messages, tools = CONVERSATIONS[name]
    if version < 13 and any(isinstance(p, ThinkPart) for m in messages if m.role == "system" for p in m.parts):
        with pytest.raises(EngineError, match=r"tekken-v\d+\.gguf: .*cannot hold a thought"):
            encode_chat(tok, messages, reference_grid(ref), tools=tools)
        return
    ours = encode_chat(tok, messages, reference_grid(ref), tools=tools).ids
    if version < 13 and name == "thought_only_reply":
        # without its thought the reply is empty, which mistral-common refuses: ours is </s>
        # (the empty-reply rule), between the two user turns mistral-common encodes
        assert ours == [*_reference_ids(ref, messages[:1], None, False), tok.eos_id,
                        *_reference_ids(ref, messages[2:], None, False)[1:]]
        return
    assert ours == _reference_ids(ref, messages, tools, keep_thoughts=version >= 13)


def test_a_v13_thought_is_its_control_tokens(pair):
    version, tok, _ = pair
    if version < 13:
        pytest.skip("v13 only")
    begin, end = tok.think_ids
    ids = encode_chat(tok, [U("q"), A(Th("x"), "y"), U("z")]).ids
    inst_end = ids.index(tok.token_id("[/INST]"))
    assert ids[inst_end + 1] == begin and ids[inst_end + 2:inst_end + 2 + len(tok.encode("x"))] == tok.encode("x")
    assert end in ids
    unclosed = encode_chat(tok, [U("q"), A(Th("x", closed=False), "y"), U("z")]).ids
    assert end not in unclosed and begin in unclosed


@pytest.mark.parametrize("messages", [[U(Th("user thoughts?"))], [U("q"), A("a"), T("a1B2c3D4e", "r"),
                                                                   ChatMessage("tool", [Th("x")], tool_call_id="z")]])
def test_thoughts_outside_assistant_and_system_messages_are_refused(pair, messages):
    _, tok, _ = pair
    with pytest.raises(EngineError, match="cannot hold a thought"):
        encode_chat(tok, messages)


# ----------------------------------------------------------------------------- the file says

def test_version_and_thinking_are_read_from_the_file(pair):
    version, tok, _ = pair
    assert tok.version == version
    assert tok.can_think == (version == 13)
    assert tok.think_ids == ((tok.token_id("[THINK]"), tok.token_id("[/THINK]")) if version == 13 else None)


def test_a_v11_vocabulary_with_think_tokens_cannot_think():
    """Mistral Small 3.2's tekken has the [THINK] slots too; its v11 format has no think chunks."""
    tok = our_tokenizer(11)
    assert tok.has_control("[THINK]") and tok.version == 11 and not tok.can_think


def test_a_template_that_writes_thoughts_is_v13_even_with_call_ids():
    tok = our_tokenizer(13, template=TEMPLATES[11] + "{{- '[THINK]' + thinking + '[/THINK]' }}")
    assert tok.version == 13 and tok.can_think


def test_without_the_end_think_control_the_model_cannot_think():
    tok = our_tokenizer(13, controls={k: v for k, v in LATER_CONTROLS.items() if v != "[/THINK]"})
    assert tok.version == 13 and not tok.can_think and tok.think_ids is None


def test_thought_text_typed_by_a_user_is_text():
    """Typing "[THINK]" never makes the control token."""
    tok = our_tokenizer(13)
    ids = encode_chat(tok, [U("[THINK]not a thought[/THINK]")]).ids
    assert tok.token_id("[THINK]") not in ids and tok.token_id("[/THINK]") not in ids


# ----------------------------------------------------------------------------- real files' templates

REAL_TEMPLATES = os.path.join(os.path.dirname(__file__), "chat_templates")  # see its README


@pytest.mark.parametrize("name, version", [
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", 11),
    ("unsloth-mistral-Devstral-Small-2507.jinja", 13),  # what llama.cpp writes for every v13 file
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", 13),
])
def test_the_templates_real_files_carry_tell_their_version(name, version):
    """The chat templates the family's GGUF files carry (llama.cpp's converter writes the first two
    by tokenizer version; Ministral 3 Reasoning's is its own) make the version its tokenizer is: a
    v13 file whose template writes no [THINK] (Devstral 1.1's, which Magistral 1.1/1.2 files made from
    Mistral's format carry too) still thinks, and Small 3.2's v11, with the [THINK] slots, does not."""
    with open(os.path.join(REAL_TEMPLATES, name), encoding="utf-8") as f:
        template = f.read()
    tok = our_tokenizer(version, template=template)
    assert tok.version == version and tok.can_think == (version == 13)
    assert our_tokenizer(7, template=template).version == 7  # a v7 vocabulary (no [ARGS]) stays v7


# ----------------------------------------------------------------------------- the catalogue's models

# Each catalogue model's chat format (its tekken file's version): Mistral Small 3.1 and Devstral 1.0
# v7 (no [ARGS]; llama.cpp names their template "mistral-v7-tekken"), Mistral Small 3.2 v11 ([CALL_ID]
# calls, [TOOL_CONTENT] results), and Magistral 1.1 / 1.2, Devstral 1.1 and every Ministral 3 v13
# ([TOOL_CALLS]name[ARGS], [THINK] chunks). A row added to the catalogue needs its version here.
CATALOGUE_VERSIONS = {
    "mistral-small-3.1-24b-instruct": 7, "devstral-small-2505-24b": 7,
    "mistral-small-3.2-24b-instruct": 11,
    "magistral-small-1.1-24b": 13, "magistral-small-1.2-24b": 13, "devstral-small-2507-24b": 13,
    "ministral-3-3b-instruct": 13, "ministral-3-8b-instruct": 13, "ministral-3-14b-instruct": 13,
    "ministral-3-3b-reasoning": 13, "ministral-3-8b-reasoning": 13, "ministral-3-14b-reasoning": 13,
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mc_catalogue")
    return {v: (our_tokenizer(v), reference_tokenizer(v, folder, image=SMALL31_IMAGE)) for v in (7, 11, 13)}


def test_every_catalogue_model_has_its_chat_format():
    from tramontane.engine.library.catalog import load_catalog

    assert {e.id for e in load_catalog()} == set(CATALOGUE_VERSIONS)


def _catalogue_conversation(entry, can_think: bool):
    """A chat on the entry as the window sends it: the model's shipped system prompt composed with
    the chat's own, an image where it sees, an earlier thought where it reasons, a tool round where
    it calls tools, then the next question."""
    from tramontane.app.model_prompt import compose_system_prompt

    thought = [Th("Let me look first.\nThen answer.")] if "reasoning" in entry.capabilities else []
    messages = [S("Answer briefly."), U("What is in this picture?", IMG_A) if entry.vision else U("Weather in Paris?")]
    tools = [WEATHER] if "tools" in entry.capabilities else None
    if tools:
        messages += [A(*thought, calls=[CALL]), T(CALL.id, "21 degrees"), A(*thought, "It is 21 °C.")]
    else:
        messages += [A(*thought, "A red box.")]
    messages.append(U("Thanks. And tomorrow?"))
    return compose_system_prompt(messages, entry.system_prompt, can_think), tools


@pytest.mark.parametrize("entry_id", sorted(CATALOGUE_VERSIONS))
def test_each_catalogue_models_chat_matches_mistral_common(tokenizers, entry_id):
    """Every catalogue model's prompt ids equal mistral-common's for its version: its shipped system
    prompt (the [THINK] template of the reasoning models as a think chunk) with the chat's, images,
    earlier thoughts, tool calls and results."""
    from tramontane.engine.library.catalog import load_catalog

    entry = next(e for e in load_catalog() if e.id == entry_id)
    version = CATALOGUE_VERSIONS[entry_id]
    tok, ref = tokenizers[version]
    messages, tools = _catalogue_conversation(entry, tok.can_think)
    if entry.system_prompt:
        assert messages[0].parts[-len(entry.system_prompt):] == list(entry.system_prompt)  # after the chat's
    ours = encode_chat(tok, messages, reference_grid(ref) if entry.vision else None, tools=tools).ids
    assert ours == _reference_ids(ref, messages, tools, keep_thoughts=True)
    thoughts = sum(isinstance(p, ThinkPart) for m in messages for p in m.parts)
    assert (ours.count(tok.think_ids[0]) if tok.can_think else 0) == thoughts  # each one a think chunk
