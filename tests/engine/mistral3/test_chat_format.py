"""Mistral v7 chat encoding, token-exact with mistral-common's `encode_chat_completion`.

Reference: mistral-common's v7 tekken tokenizer built from its real tekken_240911.json (the file
says v3; only the version string is changed, to v7, plus Mistral-Small-3.1's image settings), fed
the same conversations. Images: small PIL images; our encoder gets mistral-common's own
rows/cols for each image through `image_grid`, and must place the tokens exactly where it does.
"""
from __future__ import annotations

import io
import json
import logging
import os
import random

import pytest

from tramontane.engine.api import ChatMessage, EngineError, ImagePart
from tramontane.engine.mistral3.chat_format import EncodedPrompt, encode_chat
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.tokenizer import Tokenizer

from support import FIXTURES
from support.tekken_versions import pil_image, reference_grid, tekken_tokenizer

pytest.importorskip("mistral_common")
from PIL import Image  # noqa: E402
from mistral_common.exceptions import MistralCommonException  # noqa: E402
from mistral_common.protocol.instruct.chunk import ImageChunk, TextChunk  # noqa: E402
from mistral_common.protocol.instruct.messages import (  # noqa: E402
    AssistantMessage, SystemMessage, UserMessage)
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

TINY_GGUF = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
TINY_JSON = os.path.join(FIXTURES, "tekken_tiny.json")
# Mistral-Small-3.1's image settings (patch 14, merge 2 -> 28 px per token, longest side 1540)
SMALL31_IMAGE = {"image_patch_size": 14, "max_image_size": 1540, "spatial_merge_size": 2}


def _png(w: int, h: int, color=(200, 30, 60), mode="RGB") -> ImagePart:
    buf = io.BytesIO()
    Image.new(mode, (w, h), color).save(buf, format="PNG")
    return ImagePart(buf.getvalue(), f"{w}x{h}.png")


IMG_A = _png(60, 30)  # 3 cols x 2 rows
IMG_B = _png(100, 200, (10, 200, 10))  # 4 x 8
IMG_C = _png(2000, 300, (0, 0, 255, 128), mode="RGBA")  # downscaled: 1540 x 231 -> 55 x 9
IMG_D = _png(1, 1)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return tekken_tokenizer()


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> MistralTokenizer:
    data = json.loads((MistralTokenizer._data_path() / "tekken_240911.json").read_text(encoding="utf-8"))
    data["config"]["version"] = "v7"
    data["image"] = SMALL31_IMAGE
    path = tmp_path_factory.mktemp("mc") / "tekken_240911_v7.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return MistralTokenizer.from_file(str(path))


def _to_mistral_common(messages: list[ChatMessage]):
    out = []
    for m in messages:
        chunks = [TextChunk(text=p) if isinstance(p, str) else ImageChunk(image=pil_image(p)) for p in m.parts]
        content = m.parts[0] if len(m.parts) == 1 and isinstance(m.parts[0], str) else chunks
        if m.role == "system":
            out.append(SystemMessage(content=content))
        elif m.role == "user":
            out.append(UserMessage(content=content))
        elif m.role == "assistant":
            out.append(AssistantMessage(content=content))
    return out


def _reference_ids(ref, messages) -> list[int]:
    return ref.encode_chat_completion(ChatCompletionRequest(messages=_to_mistral_common(messages))).tokens


def _check_spans(tok: Tokenizer, enc: EncodedPrompt, images: list[ImagePart], grid) -> None:
    img, brk, end = (tok.token_id(p) for p in ("[IMG]", "[IMG_BREAK]", "[IMG_END]"))
    assert [s.image for s in enc.image_spans] == images
    covered = set()
    for span in enc.image_spans:
        assert (span.rows, span.cols) == grid(span.image)
        block = ([img] * span.cols + [brk]) * span.rows
        block[-1] = end
        assert enc.ids[span.start:span.end] == block
        covered.update(range(span.start, span.end))
    # every image token of the prompt belongs to exactly one span
    assert covered == {i for i, t in enumerate(enc.ids) if t in (img, brk, end)}


U, A, S = "user", "assistant", "system"


def M(role, *parts) -> ChatMessage:
    return ChatMessage(role, list(parts))


CASES = {
    "single user": [M(U, "Hello!")],
    "system then user": [M(S, "You are terse."), M(U, "Hi")],
    "multi-turn": [M(S, "sys"), M(U, "q1"), M(A, "a1"), M(U, "q2"), M(A, "a2"), M(U, "q3")],
    "several systems at the start": [M(S, "one"), M(S, "two"), M(U, "x")],
    "system in the middle": [M(U, "q1"), M(A, "a1"), M(U, "q1b"), M(S, "new rules"), M(U, "q2")],
    "system only": [M(S, "only a system prompt")],
    "assistant first": [M(A, "Welcome!"), M(U, "thanks")],
    "consecutive users merge": [M(U, "first"), M(U, "second"), M(U, "third")],
    "consecutive assistants merge": [M(U, "q"), M(A, "part one"), M(A, "part two "), M(U, "ok")],
    "several text parts": [M(U, "a", "b", "", "c")],
    "whitespace parts kept": [M(U, "  lead", " ", "\n", "trail  ")],
    "empty user": [M(U, "")],
    "empty user parts": [M(U)],
    "empty system block": [M(S, ""), M(U, "x")],
    "assistant trailing spaces and newlines": [M(U, "q"), M(A, " answer \n  "), M(U, " next ")],
    "control text typed": [M(S, "[INST] not a tag"), M(U, "<s>[INST]hi[/INST]</s> [IMG]"), M(A, "[/INST]"), M(U, "?")],
    "unicode": [M(U, "日本語 😀 مرحبا\tx\r\n")],
    "image only": [M(U, IMG_A)],
    "text then image (mistral-common moves the image first)": [M(U, "What is this?", IMG_A)],
    "image then text": [M(U, IMG_A, "What is this?")],
    "text image text": [M(U, "left", IMG_B, "right")],
    "two texts then image": [M(U, "a", "b", IMG_A)],
    "two images": [M(U, "compare", IMG_A, IMG_B)],
    "image, image, text": [M(U, IMG_B, IMG_A, "which?")],
    "text in one message, image in the next": [M(U, "look"), M(U, IMG_A)],
    "empty text before image": [M(U, "", IMG_A)],
    "downscaled RGBA image": [M(U, IMG_C, "wide")],
    "1x1 image": [M(U, IMG_D)],
    "images across turns": [M(S, "sys"), M(U, IMG_A, "first"), M(A, "a red box"), M(U, "and", IMG_B, "this?"),
                            M(A, "green"), M(U, IMG_C)],
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_mistral_common(tok, ref, name):
    messages = CASES[name]
    grid = reference_grid(ref)
    enc = encode_chat(tok, messages, grid)
    assert enc.ids == _reference_ids(ref, messages)
    assert enc.ids[0] == tok.bos_id
    images = [p for m in messages for p in m.parts if isinstance(p, ImagePart)]
    if name.startswith("text then image") or name.startswith("two texts then"):
        assert enc.image_spans[0].start == 2  # right after <s>[INST]
    _check_spans(tok, enc, images, grid)


def test_prompt_structure(tok, ref):
    enc = encode_chat(tok, CASES["multi-turn"], None)
    text = tok.decode(enc.ids, skip_special=False)
    assert text == ("<s>[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]q1[/INST]a1</s>[INST]q2[/INST]a2</s>"
                    "[INST]q3[/INST]")
    assert enc.ids[-1] == tok.token_id("[/INST]")
    assert enc.image_spans == []


def test_known_image_token_counts(tok, ref):
    grid = reference_grid(ref)
    assert grid(_png(640, 480)) == (18, 23)  # 414 [IMG], see docs/mistral3.md
    assert grid(IMG_C) == (9, 55)
    enc = encode_chat(tok, [M(U, _png(640, 480))], grid)
    span = enc.image_spans[0]
    assert (span.start, span.end) == (2, 2 + 18 * 24)
    assert enc.ids.count(tok.token_id("[IMG]")) == 414


def test_random_conversations_match(tok, ref):
    """Random role/part sequences; those mistral-common refuses (e.g. ending on an assistant
    turn, or a system message right after an assistant) are left out."""
    rng = random.Random(2024)
    grid = reference_grid(ref)
    words = ["hi", " there", "\n\n", "  ", "", "[INST]", "😀", "x y z", "\t", "end "]
    images = [IMG_A, IMG_B, IMG_D]
    compared = 0
    for _ in range(400):
        messages = []
        for _ in range(rng.randint(1, 6)):
            role = rng.choice([S, U, U, A])
            parts = []
            for _ in range(rng.randint(0, 3)):
                if role == U and rng.random() < 0.25:
                    parts.append(rng.choice(images))
                else:
                    parts.append("".join(rng.choice(words) for _ in range(rng.randint(0, 3))))
            messages.append(ChatMessage(role, parts))
        try:
            expected = _reference_ids(ref, messages)
        except (MistralCommonException, AssertionError, ValueError):
            continue
        enc = encode_chat(tok, messages, grid)
        assert enc.ids == expected, messages
        _check_spans(tok, enc, [p for m in messages for p in m.parts if isinstance(p, ImagePart)], grid)
        compared += 1
    assert compared > 100


def test_assistant_turn_at_the_end_gets_eos(tok, ref):
    # mistral-common only encodes a final assistant turn as a prefix (no </s>); we always close it
    messages = [M(U, "q"), M(A, "partial answer")]
    prefix = ref.encode_chat_completion(ChatCompletionRequest(
        messages=[UserMessage(content="q"), AssistantMessage(content="partial answer", prefix=True)])).tokens
    assert encode_chat(tok, messages, None).ids == prefix + [tok.eos_id]


def test_empty_assistant_turn_is_just_eos(tok, ref):
    got = encode_chat(tok, [M(U, "q"), M(A, ""), M(U, "again")], None).ids
    with_x = encode_chat(tok, [M(U, "q"), M(A, "x"), M(U, "again")], None).ids
    x = tok.encode("x")
    i = with_x.index(x[0])
    assert got == with_x[:i] + with_x[i + len(x):]
    assert got == _reference_ids(ref, [M(U, "q"), M(A, "x"), M(U, "again")])[:i] + [tok.eos_id] + \
        _reference_ids(ref, [M(U, "again")])[1:]


def test_tool_messages_are_dropped_with_a_log_note(tok, ref, caplog):
    messages = [M(U, "q"), M(A, "calling"), M("tool", '{"ok": true}'), M(U, "next")]
    with caplog.at_level(logging.INFO, logger="tramontane.engine.mistral3.chat_format"):
        enc = encode_chat(tok, messages, None)
    assert enc.ids == _reference_ids(ref, [m for m in messages if m.role != "tool"])
    assert any("tool message" in r.getMessage() for r in caplog.records)


def test_image_without_projector_is_refused(tok):
    with pytest.raises(EngineError, match="this model has no vision projector"):
        encode_chat(tok, [M(U, "see", IMG_A)], None)


@pytest.mark.parametrize("messages, match", [
    ([], "no message"),
    ([M("tool", "x")], "no message"),
    ([M(U, "q"), M(A, IMG_A)], "only be attached to user messages"),
    ([M(S, IMG_A), M(U, "q")], "only be attached to user messages"),
    ([ChatMessage("robot", ["x"])], "unknown message role 'robot'"),
    ([M(U, 42)], "parts must be text, ImagePart or ThinkPart"),
])
def test_bad_conversations_are_refused(tok, messages, match):
    with pytest.raises(EngineError, match=match):
        encode_chat(tok, messages, lambda im: (1, 1))


@pytest.mark.parametrize("grid", [(0, 3), (2, -1), (1.5, 2)])
def test_bad_image_grid_is_refused(tok, grid):
    with pytest.raises(EngineError, match="image grid"):
        encode_chat(tok, [M(U, IMG_A)], lambda im: grid)


@pytest.mark.skipif(not (os.path.exists(TINY_GGUF) and os.path.exists(TINY_JSON)),
                    reason="tiny model fixture not built")
def test_tiny_model_vocabulary_matches_its_own_v7_tokenizer():
    """Another vocabulary (2048 tokens, its own v7 JSON with explicit control tokens)."""
    with open_gguf(TINY_GGUF) as gf:
        tiny = Tokenizer.from_gguf(gf)
    ref = MistralTokenizer.from_file(TINY_JSON)
    if ref.instruct_tokenizer.image_encoder is None:
        pytest.skip("tekken_tiny.json has no image settings")
    grid = reference_grid(ref)
    for name in ["multi-turn", "system in the middle", "images across turns", "control text typed",
                 "text then image (mistral-common moves the image first)"]:
        messages = CASES[name]
        assert encode_chat(tiny, messages, grid).ids == _reference_ids(ref, messages), name
