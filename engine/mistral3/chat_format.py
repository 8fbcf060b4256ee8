"""Mistral v7 (tekken) chat encoding, token-exact with mistral-common's `encode_chat_completion`.

    <s>[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]user 1[/INST]answer 1</s>[INST]user 2[/INST]

What mistral-common's v7 normaliser + InstructTokenizerV7 do, and so what we do:
- consecutive messages of the same role are merged into one; within the merged user/assistant
  message, runs of text parts are joined with "\\n\\n" (empty text parts skipped, whitespace
  kept as typed), an image part breaks the run;
- every system message stays where it stands, in its own [SYSTEM_PROMPT]…[/SYSTEM_PROMPT] block
  (several in a row give several blocks; an empty one gives an empty block);
- a user message becomes [INST]…[/INST]; if it is (after merging) exactly text then one image,
  the image is moved first (mistral-common's "image first" compatibility rule);
- an assistant message becomes its text with trailing spaces removed, then </s>;
- an image becomes rows × ([IMG]×cols + [IMG_BREAK]) with the last [IMG_BREAK] → [IMG_END].
Our own choices where mistral-common refuses: tool messages are dropped (logged); an empty
assistant message is just </s> (what a reply that stopped at once left in the KV cache).
No template from the model file is ever rendered.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Callable

from ..api import ChatMessage, EngineError, ImagePart
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)

TEXT_JOIN = "\n\n"  # mistral-common's join between text chunks and between merged messages

ImageGrid = Callable[[ImagePart], "tuple[int, int]"]  # image -> (rows, cols) of [IMG] tokens


@dataclass(frozen=True)
class ImageSpan:
    """Token positions [start, end) of one image's [IMG]/[IMG_BREAK]/[IMG_END] block."""

    start: int
    end: int
    image: ImagePart
    rows: int
    cols: int


@dataclass
class EncodedPrompt:
    ids: list[int]
    image_spans: list[ImageSpan] = field(default_factory=list)


@dataclass(frozen=True)
class _ControlIds:
    bos: int
    eos: int
    inst: int
    end_inst: int
    system: int
    end_system: int
    img: int
    img_break: int
    img_end: int

    @classmethod
    def of(cls, tok: Tokenizer) -> "_ControlIds":
        return cls(
            bos=tok.bos_id, eos=tok.eos_id,
            inst=tok.token_id("[INST]"), end_inst=tok.token_id("[/INST]"),
            system=tok.token_id("[SYSTEM_PROMPT]"), end_system=tok.token_id("[/SYSTEM_PROMPT]"),
            img=tok.token_id("[IMG]"), img_break=tok.token_id("[IMG_BREAK]"),
            img_end=tok.token_id("[IMG_END]"),
        )


def image_tokens(ctl: _ControlIds, rows: int, cols: int) -> list[int]:
    ids = ([ctl.img] * cols + [ctl.img_break]) * rows
    ids[-1] = ctl.img_end
    return ids


def _merge_parts(messages: list[ChatMessage]) -> list[str | ImagePart]:
    """The parts of consecutive same-role messages as one content: text runs joined."""
    merged: list[str | ImagePart] = []
    text_run: list[str] = []
    for message in messages:
        parts = message.parts
        if isinstance(parts, (str, ImagePart)):  # a bare part, not a list: one part, never its characters
            parts = [parts]
        for part in parts:
            if isinstance(part, ImagePart):
                if text_run:
                    merged.append(TEXT_JOIN.join(text_run))
                    text_run = []
                merged.append(part)
            elif isinstance(part, str):
                if part:
                    text_run.append(part)
            else:
                raise EngineError(f"a {message.role} message holds a {type(part).__name__}; "
                                  "parts must be text or ImagePart")
    if text_run:
        merged.append(TEXT_JOIN.join(text_run))
    return merged


def _group_by_role(messages: list[ChatMessage]) -> list[list[ChatMessage]]:
    groups: list[list[ChatMessage]] = []
    for message in messages:
        if groups and groups[-1][0].role == message.role:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def _text_only(parts: list[str | ImagePart], role: str) -> str:
    if any(isinstance(p, ImagePart) for p in parts):
        raise EngineError(f"images can only be attached to user messages, not to {role} messages")
    return "".join(parts)  # at most one merged text run


def encode_chat(tok: Tokenizer, messages: list[ChatMessage],
                image_grid: ImageGrid | None = None) -> EncodedPrompt:
    """Prompt ids (BOS first) for `messages`, and where each image's tokens stand."""
    ctl = _ControlIds.of(tok)
    kept = []
    for message in messages:
        if message.role == "tool":
            log.info("chat encoding: a tool message was dropped (tools are not supported)")
        elif message.role in ("system", "user", "assistant"):
            kept.append(message)
        else:
            raise EngineError(f"unknown message role {message.role!r}")
    if not kept:
        raise EngineError("there is no message to answer")

    ids = [ctl.bos]
    spans: list[ImageSpan] = []
    for group in _group_by_role(kept):
        role = group[0].role
        if role == "system":
            for message in group:  # v7 keeps each system message as its own block
                text = _text_only(_merge_parts([message]), "system")
                ids += [ctl.system, *tok.encode(text), ctl.end_system]
        elif role == "assistant":
            text = _text_only(_merge_parts(group), "assistant")
            ids += [*tok.encode(text.rstrip(" ")), ctl.eos]
        else:
            parts = _merge_parts(group)
            if (len(parts) >= 2 and isinstance(parts[-1], ImagePart)
                    and all(isinstance(p, str) for p in parts[:-1])):
                parts = [parts[-1], *parts[:-1]]  # mistral-common puts a trailing lone image first
            ids.append(ctl.inst)
            for part in parts:
                if isinstance(part, str):
                    ids += tok.encode(part)
                    continue
                rows, cols = _grid_of(part, image_grid)
                start = len(ids)
                ids += image_tokens(ctl, rows, cols)
                spans.append(ImageSpan(start, len(ids), part, rows, cols))
            ids.append(ctl.end_inst)
    return EncodedPrompt(ids, spans)


def _grid_of(image: ImagePart, image_grid: ImageGrid | None) -> tuple[int, int]:
    if image_grid is None:
        raise EngineError("this model has no vision projector")
    rows, cols = image_grid(image)
    try:
        rows, cols = operator.index(rows), operator.index(cols)
    except TypeError:
        raise EngineError(f"{image.name}: image grid must be whole numbers, got {rows!r}×{cols!r}") from None
    if rows < 1 or cols < 1:
        raise EngineError(f"{image.name}: image grid must be at least 1×1 tokens, got {rows}×{cols}")
    return rows, cols
