"""Mistral tekken chat encoding (v7, v11, v13), token-exact with mistral-common's
`encode_chat_completion`, and the parser of the tool calls a model writes.

    <s>[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]user 1[/INST]answer 1</s>[INST]user 2[/INST]

What mistral-common's normaliser + InstructTokenizerV7/V11/V13 do, and so what we do:
- consecutive messages of the same role are merged into one (tool messages and system messages
  stay one each); within a merged user/assistant message, runs of text parts are joined with
  "\\n\\n" (empty text parts skipped, whitespace kept as typed), an image or a thought
  (ThinkPart) breaks the run;
- every system message stays where it stands, in its own [SYSTEM_PROMPT]…[/SYSTEM_PROMPT] block;
- a thought (v13 only: [THINK] chunks) is [THINK]text[/THINK], no [/THINK] when it was not
  closed; in assistant messages (a reasoning model's earlier turns) and system messages (the
  template Magistral and Ministral 3 Reasoning are told to think in);
- a user message becomes [INST]…[/INST]; if it is (after merging) exactly text then one image,
  the image is moved first (mistral-common's "image first" compatibility rule);
- tools: [AVAILABLE_TOOLS]json[/AVAILABLE_TOOLS] just before the [INST] of the last user
  message (v7, v11) or of the first one (v13);
- an assistant message becomes its text with trailing spaces removed (kept as written, chunk by
  chunk, when it holds a thought), then its tool calls, then
  </s>. Calls: v7 `[TOOL_CALLS][{"name", "arguments", "id"}, …]`; v11 one
  `[TOOL_CALLS]name[CALL_ID]id[ARGS]{…}` per call; v13 the same without the id;
- a tool result: v7/v11 `[TOOL_RESULTS]id[TOOL_CONTENT]text[/TOOL_RESULTS]`, v13
  `[TOOL_RESULTS]text[/TOOL_RESULTS]` (v11+ order a turn's results as its calls were made);
- an image becomes rows × ([IMG]×cols + [IMG_BREAK]) with the last [IMG_BREAK] → [IMG_END].
Our own choices where mistral-common refuses: an empty assistant message is just </s> (what a
reply that stopped at once left in the KV cache); a tool message naming no call is dropped; an
assistant thought is left out for a model that cannot think (a chat continued on another
model), a system one refused. No template from the model file is ever rendered; the file's
vocabulary and template text only tell which version (`Tokenizer.version`).
"""
from __future__ import annotations

import json
import logging
import operator
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Callable

from ..api import ChatMessage, EngineError, ImagePart, ThinkPart, ToolCall, ToolSpec
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


Content = list["str | ImagePart | ThinkPart"]


def _merge_parts(messages: list[ChatMessage], keep_thoughts: bool = True) -> Content:
    """The parts of consecutive same-role messages as one content: text runs joined, an image
    or a thought ending the run (`keep_thoughts` False: thoughts left out before merging)."""
    merged: Content = []
    text_run: list[str] = []
    for message in messages:
        parts = message.parts
        if isinstance(parts, (str, ImagePart, ThinkPart)):  # a bare part, not a list: one part
            parts = [parts]
        for part in parts:
            if isinstance(part, (ImagePart, ThinkPart)):
                if isinstance(part, ThinkPart) and not keep_thoughts:
                    continue
                if text_run:
                    merged.append(TEXT_JOIN.join(text_run))
                    text_run = []
                merged.append(part)
            elif isinstance(part, str):
                if part:
                    text_run.append(part)
            else:
                raise EngineError(f"a {message.role} message holds a {type(part).__name__}; "
                                  "parts must be text, ImagePart or ThinkPart")
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


def _text_only(parts: Content, role: str) -> str:
    if any(isinstance(p, ImagePart) for p in parts):
        raise EngineError(f"images can only be attached to user messages, not to {role} messages")
    if any(isinstance(p, ThinkPart) for p in parts):
        raise EngineError(f"a {role} message cannot hold a thought (only assistant and system "
                          "messages can)")
    return "".join(parts)  # at most one merged text run


def _think_ids(tok: Tokenizer, thought: ThinkPart) -> list[int]:
    """mistral-common's think chunk: [THINK]text[/THINK], without [/THINK] when not closed."""
    begin, end = tok.think_ids
    return [begin, *tok.encode(thought.text), *([end] if thought.closed else [])]


def _chunk_ids(tok: Tokenizer, parts: Content) -> list[int]:
    """A content of text and thoughts, chunk by chunk (mistral-common strips nothing here)."""
    ids: list[int] = []
    for part in parts:
        ids += _think_ids(tok, part) if isinstance(part, ThinkPart) else tok.encode(part)
    return ids


def _system_ids(tok: Tokenizer, ctl: "_ControlIds", message: ChatMessage) -> list[int]:
    parts = _merge_parts([message])
    if any(isinstance(p, ThinkPart) for p in parts) and not tok.can_think:
        raise EngineError(f"{tok.source}: this model's format has no [THINK] chunks, so a system "
                          "message cannot hold a thought")
    if any(isinstance(p, ImagePart) for p in parts):
        raise EngineError("images can only be attached to user messages, not to system messages")
    return [ctl.system, *_chunk_ids(tok, parts), ctl.end_system]


def _assistant_ids(tok: Tokenizer, group: list[ChatMessage]) -> list[int]:
    """The text of an assistant turn: whole and right-stripped of spaces when it is only text,
    chunk by chunk when it holds thoughts (left out where the model cannot think: a chat
    continued on another model)."""
    parts = _merge_parts(group, keep_thoughts=tok.can_think)
    if any(isinstance(p, ImagePart) for p in parts):
        raise EngineError("images can only be attached to user messages, not to assistant messages")
    if any(isinstance(p, ThinkPart) for p in parts):
        return _chunk_ids(tok, parts)
    return tok.encode("".join(parts).rstrip(" "))


def instruct_version(tok: Tokenizer) -> int:
    """Which chat format the file's model was trained on: 7, 11 or 13 (`Tokenizer.version`)."""
    return tok.version


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False)  # mistral-common's separators ", " and ": "


def _arguments_value(arguments: str):
    """mistral-common normalises the arguments text through json (empty = {}), then writes the
    parsed value; text that is not JSON is written as a string."""
    if not arguments:
        return {}
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def tools_json(tools: list[ToolSpec]) -> str:
    return _json([{"type": "function", "function": {"name": t.name, "description": t.description,
                                                     "parameters": t.parameters}} for t in tools])


def _tool_call_ids(tok: Tokenizer, version: int, calls: list[ToolCall]) -> list[int]:
    if version == 7:
        prepared = []
        for call in calls:
            item = {"name": call.name, "arguments": _arguments_value(call.arguments)}
            if call.id and call.id != "null":
                item["id"] = call.id
            prepared.append(item)
        return [tok.token_id("[TOOL_CALLS]"), *tok.encode(_json(prepared))]
    ids: list[int] = []
    for call in calls:
        ids += [tok.token_id("[TOOL_CALLS]"), *tok.encode(call.name)]
        if version == 11 and call.id and call.id != "null":
            ids += [tok.token_id("[CALL_ID]"), *tok.encode(call.id)]
        ids += [tok.token_id("[ARGS]"), *tok.encode(_json(_arguments_value(call.arguments)))]
    return ids


def _tool_result_ids(tok: Tokenizer, version: int, message: ChatMessage) -> list[int]:
    text = _text_only(_merge_parts([message]), "tool")
    if version == 13:
        return [tok.token_id("[TOOL_RESULTS]"), *tok.encode(text), tok.token_id("[/TOOL_RESULTS]")]
    return [tok.token_id("[TOOL_RESULTS]"), *tok.encode(message.tool_call_id),
            tok.token_id("[TOOL_CONTENT]"), *tok.encode(text), tok.token_id("[/TOOL_RESULTS]")]


def _ordered_results(group: list[ChatMessage], call_order: list[str]) -> list[ChatMessage]:
    """v11+: a turn's results in the order of its calls (then as given), as mistral-common sorts."""
    rank = {call_id: i for i, call_id in enumerate(call_order)}
    return sorted(group, key=lambda m: rank.get(m.tool_call_id or "null", len(rank)))


def encode_chat(tok: Tokenizer, messages: list[ChatMessage], image_grid: ImageGrid | None = None,
                tools: list[ToolSpec] | None = None) -> EncodedPrompt:
    """Prompt ids (BOS first) for `messages` (and the `tools` the model may call), and where each
    image's tokens stand."""
    kept = []
    for message in messages:
        if message.role == "tool" and not message.tool_call_id:
            # a result that names no call cannot be placed (mistral-common refuses it): older
            # chats stored such messages, so they are skipped rather than refused
            log.info("chat encoding: a tool message without a tool_call_id was dropped")
        elif message.role in ("system", "user", "assistant", "tool"):
            kept.append(message)
        else:
            raise EngineError(f"unknown message role {message.role!r}")
    if not kept:
        raise EngineError("there is no message to answer")
    messages = kept
    ctl = _ControlIds.of(tok)
    version = tok.version
    groups = _group_by_role(messages)
    user_groups = [i for i, g in enumerate(groups) if g[0].role == "user"]
    tools_at = None
    if tools and user_groups:
        tools_at = user_groups[0] if version == 13 else user_groups[-1]

    ids = [ctl.bos]
    spans: list[ImageSpan] = []
    call_order: list[str] = []  # the latest assistant turn's call ids
    for index, group in enumerate(groups):
        role = group[0].role
        if role == "system":
            for message in group:  # each system message is its own block
                ids += _system_ids(tok, ctl, message)
        elif role == "tool":
            ordered = _ordered_results(group, call_order) if version >= 11 else group
            for message in ordered:
                ids += _tool_result_ids(tok, version, message)
        elif role == "assistant":
            calls = [call for message in group for call in message.tool_calls]
            ids += _assistant_ids(tok, group)
            if calls:
                ids += _tool_call_ids(tok, version, calls)
            ids.append(ctl.eos)
            call_order = [call.id for call in calls]
        else:
            if index == tools_at:
                ids += [tok.token_id("[AVAILABLE_TOOLS]"), *tok.encode(tools_json(tools)),
                        tok.token_id("[/AVAILABLE_TOOLS]")]
            parts = _merge_parts(group)
            if any(isinstance(p, ThinkPart) for p in parts):
                raise EngineError("a user message cannot hold a thought (only assistant and "
                                  "system messages can)")
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


# ----------------------------------------------------------------------------- model output

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A 9-character call id, the form mistral-common validates (v7, v11)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


@dataclass
class ParsedReply:
    content: str  # the text before the first [TOOL_CALLS]
    tool_calls: list[ToolCall]


def parse_tool_calls(text: str, version: int) -> ParsedReply | None:
    """The calls in a reply decoded with its control tokens by name. None when the reply has no
    [TOOL_CALLS], or when what follows is not a well-formed call list (the caller then keeps
    the reply as text). Arguments come back as compact-enough JSON text (json.dumps)."""
    head, marker, rest = text.partition("[TOOL_CALLS]")
    if not marker:
        return None
    calls: list[ToolCall] = []
    if version == 7:
        try:
            items = json.loads(rest.replace("[TOOL_CALLS]", ""))
        except json.JSONDecodeError:
            return None
        if isinstance(items, dict):
            items = [items]
        if not isinstance(items, list) or not items:
            return None
        for item in items:
            if not (isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"]
                    and isinstance(item.get("arguments", {}), (dict, str))):
                return None
            args = item.get("arguments", {})
            call_id = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else new_call_id()
            calls.append(ToolCall(call_id, item["name"], args if isinstance(args, str) else _json(args)))
        return ParsedReply(head, calls)
    for segment in rest.split("[TOOL_CALLS]"):
        name, args_marker, args = segment.partition("[ARGS]")
        if not args_marker:
            return None
        name, id_marker, call_id = name.partition("[CALL_ID]")
        name = name.strip()
        if not name or any(c.isspace() for c in name):
            return None
        try:
            value, end = json.JSONDecoder().raw_decode(args.strip())
        except json.JSONDecodeError:
            return None
        if args.strip()[end:].strip() or not isinstance(value, dict):
            return None
        calls.append(ToolCall(call_id.strip() if id_marker and call_id.strip() else new_call_id(),
                              name, _json(value)))
    return ParsedReply(head, calls)


def parse_cut_tool_calls(text: str, version: int) -> ParsedReply | None:
    """The calls of a reply cut (by the token limit) inside its call list: the whole calls, and
    the last one with the arguments written so far, as OpenAI returns a call cut by max_tokens.
    A call whose name is not complete yet is left out. None when there is no [TOOL_CALLS]."""
    head, marker, rest = text.partition("[TOOL_CALLS]")
    if not marker:
        return None
    calls: list[ToolCall] = []
    if version == 7:
        rest = rest.replace("[TOOL_CALLS]", "").lstrip().removeprefix("[")
        decoder = json.JSONDecoder()
        while rest.strip():
            rest = rest.lstrip().lstrip(",").lstrip()
            try:
                item, end = decoder.raw_decode(rest)
            except json.JSONDecodeError:  # the cut one: its name, and its arguments so far
                name = re.match(r'\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*', rest)
                if name:
                    calls.append(ToolCall(new_call_id(), name.group(1), rest[name.end():]))
                break
            if isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"]:
                args = item.get("arguments", {})
                calls.append(ToolCall(new_call_id(), item["name"], args if isinstance(args, str) else _json(args)))
            rest = rest[end:]
        return ParsedReply(head, calls)
    for segment in rest.split("[TOOL_CALLS]"):
        name, args_marker, args = segment.partition("[ARGS]")
        name = name.partition("[CALL_ID]")[0].strip()
        if not args_marker or not name:
            break
        calls.append(ToolCall(new_call_id(), name, args.strip()))
    return ParsedReply(head, calls)


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
