"""Anthropic's Messages API over the one request model: POST /v1/messages (whole or streamed in
Anthropic's event sequence) and /v1/messages/count_tokens, errors in Anthropic's shape.

The body becomes the same `ChatJob` as an OpenAI chat request (system, messages with text,
base64 images, tool_use and tool_result blocks, tools and tool_choice, stop_sequences,
sampling); the reply's text, calls and reasoning (`tasks.reasoning_of`) become content blocks.
The `anthropic` client (and Claude Code) reach it with the base URL without /v1.
"""
from __future__ import annotations

import asyncio
import json
import uuid

from aiohttp import web

from ..api import ChatMessage, ThinkPart, ToolCall
from .errors import ApiError, bad
from .openai_api import ServedModel, chat_job, check_image_count, check_model, check_reasoning_effort, \
    decoded_image, remote_image, sampling_params
from .streaming import SSE_TYPE, open_stream, sse
from .tasks import reasoning_of, reply_events
from .tools_api import arguments_object, check_tool_count, output_grammar, tool_request, tool_spec

# Anthropic's error types by status (https error shape: {"type": "error", "error": {...}})
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}
_NOT_SUPPORTED = ("container", "mcp_servers", "context_management")  # server-side features Anthropic has


class AnthropicRoutes:
    name = "anthropic"
    family = "anthropic"  # the API family a server may leave out (http.API_FAMILIES)
    prefixes = ("/v1/messages", "/messages")
    public = ()

    def __init__(self, server):
        self.server = server

    def routes(self):
        out = []
        for prefix in ("/v1", ""):
            out += [("POST", f"{prefix}/messages", self.messages),
                    ("POST", f"{prefix}/messages/count_tokens", self.count_tokens)]
        return out

    @staticmethod
    def error_response(exc: ApiError) -> web.Response:
        headers = {"Retry-After": "1"} if exc.status == 503 else {}
        return web.json_response(error_body(exc), status=exc.status, headers=headers)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        model = self.server.model()
        body = await self.server.read_json(request)
        job = parse_messages_request(body, model, self.server.limits)
        job.count_prompt = job.stream  # message_start says the prompt's tokens
        generation = self.server.tasks.chat(job, model)
        try:
            if job.stream:
                return await self._stream(request, generation, model)
            (outcome,) = await generation.outcomes()
            return web.json_response(message_body(model, *outcome))
        except (asyncio.CancelledError, ConnectionError):
            generation.cancel()
            raise

    async def count_tokens(self, request: web.Request) -> web.Response:
        model = self.server.model()
        body = await self.server.read_json(request)
        job = parse_messages_request(dict(body, max_tokens=1) if isinstance(body, dict) else body,
                                     model, self.server.limits, counting=True)

        def count(engine):
            return len(engine.encode(job.messages, tools=job.tools or None).ids)

        tokens = await asyncio.wrap_future(self.server.executor.submit(count))
        return web.json_response({"input_tokens": tokens})

    async def _stream(self, request, generation, model: ServedModel) -> web.StreamResponse:
        first = await generation.first_event()
        response = await open_stream(request, SSE_TYPE)
        message_id = new_message_id()

        def event(kind: str, **fields) -> bytes:
            return sse({"type": kind, **fields}, event=kind)

        start = {"id": message_id, "type": "message", "role": "assistant", "content": [], "model": model.id,
                 "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": generation.prompt_tokens or 0, "output_tokens": 0}}
        await response.write(event("message_start", message=start) + event("ping"))
        index = 0
        open_kind = None  # the block streaming now: "thinking" (the thought comes first), then "text"
        outcome = None
        async for kind, data in reply_events(generation, first):
            if kind == "end":
                outcome = data
                continue
            block = "thinking" if kind == "reasoning" else "text"
            out = b""
            if open_kind != block:
                if open_kind is not None:
                    out += event("content_block_stop", index=index)
                    index += 1
                out += event("content_block_start", index=index, content_block=_STREAMED_BLOCKS[block])
                open_kind = block
            await response.write(out + event("content_block_delta", index=index,
                                             delta={"type": f"{block}_delta", block: data}))
        try:
            generation.result()
        except ApiError as exc:  # after the headers: Anthropic's error event
            await response.write(sse(error_body(exc), event="error"))
            await response.write_eof()
            return response
        result, reason = outcome
        out = b""
        if open_kind is not None:
            out += event("content_block_stop", index=index)
            index += 1
        for call in result.tool_calls:
            out += event("content_block_start", index=index,
                         content_block={"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            out += event("content_block_delta", index=index,
                         delta={"type": "input_json_delta", "partial_json": call.arguments})
            out += event("content_block_stop", index=index)
            index += 1
        stop, sequence = stop_fields(result, reason)
        out += event("message_delta", delta={"stop_reason": stop, "stop_sequence": sequence},
                     usage=usage_json(result))
        out += event("message_stop")
        await response.write(out)
        await response.write_eof()
        return response


# How a streamed block opens; the signature is Anthropic's proof of its own thinking: none to give here.
_STREAMED_BLOCKS = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                    "text": {"type": "text", "text": ""}}


def error_body(exc: ApiError) -> dict:
    kind = _ERROR_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def stop_fields(result, reason: str | None) -> tuple[str, str | None]:
    if result.tool_calls and result.finish_reason != "length":
        return "tool_use", None
    if result.finish_reason == "length":
        return "max_tokens", None
    if result.finish_reason == "stop_string":
        return "stop_sequence", reason
    return "end_turn", None


def usage_json(result) -> dict:
    return {"input_tokens": result.stats.prompt_tokens, "output_tokens": result.stats.generated_tokens,
            "cache_read_input_tokens": result.stats.reused_tokens, "cache_creation_input_tokens": 0}


def content_blocks(result) -> list[dict]:
    reasoning, text = reasoning_of(result)
    blocks = []
    if reasoning:  # the signature is Anthropic's proof of its own thinking: none to give here
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if text:
        blocks.append({"type": "text", "text": text})
    for call in result.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments_object(call)})
    return blocks


def message_body(model: ServedModel, result, reason: str | None) -> dict:
    stop, sequence = stop_fields(result, reason)
    return {"id": new_message_id(), "type": "message", "role": "assistant", "model": model.id,
            "content": content_blocks(result), "stop_reason": stop, "stop_sequence": sequence,
            "usage": usage_json(result)}


# ----------------------------------------------------------------------------- the request

def _text_of(content, where: str) -> str:
    """A system prompt or a tool result's content: a string or text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise bad(f"{where}[{i}]", "must be a text block ({\"type\": \"text\", \"text\": ...})")
            texts.append(block["text"])
        return "\n".join(texts)
    raise bad(where, "must be a string or a list of text blocks")


def _image(block: dict, where: str, images: list, limits) -> object:
    source = block.get("source")
    if not isinstance(source, dict):
        raise bad(f"{where}.source", "must be an object ({\"type\": \"base64\", \"media_type\", \"data\"})")
    if source.get("type") == "url":
        raise remote_image(f"{where}.source", str(source.get("url", "")), "base64 sources",
                           "send {\"type\": \"base64\", \"media_type\": ..., \"data\": ...}")
    if source.get("type") != "base64" or not isinstance(source.get("data"), str):
        raise bad(f"{where}.source", "must be {\"type\": \"base64\", \"media_type\": ..., \"data\": ...}")
    check_image_count(images, where, limits)
    image = decoded_image(source["data"], f"{where}.source.data", len(images), limits)
    images.append(image)
    return image


def parse_conversation(raw, limits) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "must be a non-empty list of messages")
    messages: list[ChatMessage] = []
    images: list = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object with role and content")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"{where}.role", f"must be user or assistant, got {role!r}")
        content = m.get("content")
        if isinstance(content, str):
            messages.append(ChatMessage.text(role, content))
            continue
        if not isinstance(content, list):
            raise bad(f"{where}.content", "must be a string or a list of content blocks")
        parts: list = []
        calls: list[ToolCall] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                if not isinstance(block.get("text"), str):
                    raise bad(f"{at}.text", "must be a string")
                parts.append(block["text"])
            elif kind == "image" and role == "user":
                parts.append(_image(block, at, images, limits))
            elif kind == "tool_use" and role == "assistant":
                name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
                if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, dict):
                    raise bad(at, "a tool_use block needs id, name and input (an object)")
                calls.append(ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False)))
            elif kind == "tool_result" and role == "user":
                call_id = block.get("tool_use_id")
                if not isinstance(call_id, str) or not call_id:
                    raise bad(f"{at}.tool_use_id", "a tool_result must name the tool_use it answers")
                text = _text_of(block.get("content", ""), f"{at}.content")
                if block.get("is_error"):
                    text = "Error: " + text
                messages.append(ChatMessage("tool", [text], tool_call_id=call_id))
            elif kind == "thinking" and role == "assistant":  # an earlier thought, mistral-common's think chunk
                if not isinstance(block.get("thinking"), str):
                    raise bad(f"{at}.thinking", "must be a string")
                parts.append(ThinkPart(block["thinking"]))
            elif kind == "redacted_thinking" and role == "assistant":
                continue  # Anthropic's encrypted thought: nothing this model can read
            elif kind == "document":
                raise bad(f"{at}.type", "document blocks are not supported by this server yet (send the text)")
            else:
                raise bad(f"{at}.type", f"{kind!r} blocks are not supported in {role} messages")
        if parts or calls or role == "assistant":
            messages.append(ChatMessage(role, parts, calls))
    return messages


def _tools(body: dict):
    raw = body.get("tools")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("tools", "must be a list of {\"name\", \"description\", \"input_schema\"} objects")
    check_tool_count(raw)
    specs = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            raise bad(f"tools[{i}].type", "only custom (client) tools are supported, not Anthropic's server tools")
        specs.append(tool_spec(tool, f"tools[{i}]", specs, schema_field="input_schema"))
    return specs


def _tool_choice(raw, tools) -> tuple[str, str | None, bool]:
    """Anthropic's tool_choice as (choice, named, parallel)."""
    if raw is None:
        return "auto", None, True
    if not isinstance(raw, dict) or raw.get("type") not in ("auto", "any", "tool", "none"):
        raise bad("tool_choice", "must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}")
    parallel = not raw.get("disable_parallel_tool_use", False)
    kind = raw["type"]
    if kind in ("any", "tool") and not tools:
        raise bad("tool_choice", f"{kind!r} needs tools")
    if kind == "tool":
        name = raw.get("name")
        if name not in {t.name for t in tools}:
            raise bad("tool_choice.name", f"names {name!r}, which is not among the tools")
        return "named", name, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], None, parallel


def check_thinking(raw) -> None:
    """`thinking`: {"type": "enabled", "budget_tokens": N >= 1024} or {"type": "disabled"} (or
    "adaptive"). A reasoning model thinks as its template says; the reasoning comes back as
    thinking blocks (`tasks.reasoning_of`)."""
    if raw is None:
        return
    if not isinstance(raw, dict) or raw.get("type") not in ("enabled", "disabled", "adaptive"):
        raise bad("thinking", "must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}")
    if raw["type"] == "enabled":
        budget = raw.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1024:
            raise bad("thinking.budget_tokens", f"must be an integer of at least 1024, got {budget!r}")


def output_format_grammar(body: dict) -> str | None:
    """Anthropic's structured outputs as a grammar: `output_config.format` (or the beta's
    `output_format`), `{"type": "json_schema", "schema": ...}`, closed by default as every API's
    schemas are (`tools_api.output_grammar`). `output_config.effort` is checked as
    `reasoning_effort` is; anything else in `output_config` is refused by name."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise bad("output_config", "must be an object ({\"format\": ..., \"effort\": ...})")
    config = config or {}
    for name in config:
        if name not in ("format", "effort") and config[name] is not None:
            raise bad(f"output_config.{name}", "not supported by this server (format and effort are)",
                      code="unsupported_parameter")
    check_reasoning_effort(config.get("effort"), "output_config.effort")
    where, fmt = "output_config.format", config.get("format")
    if body.get("output_format") is not None:
        if fmt is not None:
            raise bad("output_format", "give output_config.format or the beta's output_format, not both")
        where, fmt = "output_format", body["output_format"]
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise bad(f"{where}.type", f"must be json_schema, got {fmt.get('type') if isinstance(fmt, dict) else fmt!r}")
    if not isinstance(fmt.get("schema"), dict):
        raise bad(f"{where}.schema", "must be a JSON Schema object")
    return output_grammar(fmt["schema"], f"{where}.schema")


def parse_messages_request(body, model: ServedModel, limits, counting: bool = False):
    if not isinstance(body, dict):
        raise ApiError(400, "request body: must be a JSON object")
    check_model(body, model)
    for name in _NOT_SUPPORTED:
        if body.get(name):
            raise bad(name, "not supported by this server", code="unsupported_parameter")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise bad("max_tokens", "is required (the most tokens the reply may have)")
    check_thinking(body.get("thinking"))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"must be true or false, got {stream!r}")
    messages = parse_conversation(body.get("messages"), limits)
    system = body.get("system")
    if system is not None:
        messages.insert(0, ChatMessage.text("system", _text_of(system, "system")))
    sampling = {"max_tokens": max_tokens, "stop": body.get("stop_sequences"), "seed": body.get("seed")}
    for name in ("temperature", "top_p", "top_k"):
        sampling[name] = body.get(name)
    if isinstance(sampling["temperature"], (int, float)) and not isinstance(sampling["temperature"], bool) \
            and sampling["temperature"] > 1:
        raise bad("temperature", f"must be in [0, 1], got {sampling['temperature']!r}")
    try:
        params = sampling_params(sampling, model.context_size)
    except ApiError as exc:  # named as this API names it
        if exc.param == "stop":
            raise bad("stop_sequences", exc.message.partition(": ")[2]) from None
        raise
    tools = _tools(body)
    choice, named, parallel = _tool_choice(body.get("tool_choice"), tools)
    grammar = output_format_grammar(body)
    request = tool_request(tools, choice, named, parallel, grammar) if tools or grammar else None
    return chat_job(messages, model, params, stream and not counting, request)
