"""OpenAI's Responses API over the one request model: POST /v1/responses (whole, or streamed as
its semantic events) and GET /v1/responses/{id}.

The body becomes the same `ChatJob` as a chat completion: `input` (a string, or items: messages
with input_text / input_image parts, function_call and function_call_output items),
`instructions` as the system message, function tools, `text.format` (a JSON Schema, closed by
default as everywhere), and `previous_response_id`, which continues a conversation the server
answered in its lifetime (kept in bounded memory, `ResponseStore`). The reply's text, calls and
reasoning (`tasks.reasoning_of`) become output items.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict

from aiohttp import web

from ..api import ChatMessage, ThinkPart, ToolCall
from .errors import ApiError, bad
from .openai_api import (ServedModel, chat_job, check_image_count, check_model, check_reasoning_effort, data_url_image,
                         sampling_params)
from .streaming import SSE_TYPE, open_stream, sse
from .tasks import reasoning_of, reply_events
from .tools_api import ARGUMENT_PIECE, check_tool_count, output_grammar, tool_request, tool_spec

_NOT_SUPPORTED = {"background": False, "conversation": None, "prompt": None, "top_logprobs": 0,
                  "truncation": "disabled"}  # fields whose other values would change the output


class ResponseStore:
    """The conversations behind responses answered in this server's lifetime, by response id,
    for `previous_response_id`: at most `capacity` responses and `max_bytes` of their text and
    images (the oldest go first)."""

    def __init__(self, capacity: int = 256, max_bytes: int = 64 << 20):
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[list[ChatMessage], int]] = OrderedDict()
        self._bytes = 0

    def put(self, response_id: str, messages: list[ChatMessage]) -> None:
        size = sum(len(p) if isinstance(p, str) else len(getattr(p, "data", getattr(p, "text", b"")))
                   for m in messages for p in m.parts)
        self._items[response_id] = (messages, size)
        self._bytes += size
        while self._items and (len(self._items) > self.capacity or self._bytes > self.max_bytes):
            _, (_, dropped) = self._items.popitem(last=False)
            self._bytes -= dropped

    def get(self, response_id: str) -> list[ChatMessage] | None:
        item = self._items.get(response_id)
        return None if item is None else list(item[0])


class ResponsesRoutes:
    name = "responses"
    family = "openai"  # the API family a server may leave out (http.API_FAMILIES)
    prefixes = ("/v1/responses", "/responses")
    public = ()

    def __init__(self, server):
        self.server = server
        self.store = ResponseStore()
        self._bodies: OrderedDict[str, dict] = OrderedDict()  # GET /v1/responses/{id}

    def routes(self):
        out = []
        for prefix in ("/v1", ""):
            out += [("POST", f"{prefix}/responses", self.create),
                    ("GET", f"{prefix}/responses/{{response_id}}", self.retrieve)]
        return out

    @staticmethod
    def error_response(exc: ApiError) -> web.Response:
        headers = {"Retry-After": "1"} if exc.status == 503 else {}
        return web.json_response(exc.body(), status=exc.status, headers=headers)

    async def retrieve(self, request: web.Request) -> web.Response:
        body = self._bodies.get(request.match_info["response_id"])
        if body is None:
            raise ApiError(404, f"response {request.match_info['response_id']!r} is not stored here "
                                "(responses are kept in memory while the server runs)", "response_id", "not_found")
        return web.json_response(body)

    async def create(self, request: web.Request) -> web.StreamResponse:
        model = self.server.model()
        body = await self.server.read_json(request)
        job, history, echo = parse_responses_request(body, model, self.server.limits, self.store)
        reply = ResponseReply(model, echo)
        generation = self.server.tasks.chat(job, model)
        try:
            if job.stream:
                return await self._stream(request, generation, reply, history, echo)
            (outcome,) = await generation.outcomes()
            return web.json_response(self._finish(reply, outcome[0], history, echo))
        except (asyncio.CancelledError, ConnectionError):
            generation.cancel()
            raise

    def _finish(self, reply: "ResponseReply", result, history: list[ChatMessage], echo: dict) -> dict:
        body = reply.body(result)
        if echo["store"]:
            reasoning, text = reasoning_of(result)
            parts = ([ThinkPart(reasoning)] if reasoning else []) + ([text] if text else [])
            self.store.put(reply.id, history + [ChatMessage("assistant", parts, result.tool_calls)])
            self._bodies[reply.id] = body
            while len(self._bodies) > self.store.capacity:
                self._bodies.popitem(last=False)
        return body

    async def _stream(self, request, generation, reply: "ResponseReply", history, echo) -> web.StreamResponse:
        first = await generation.first_event()
        response = await open_stream(request, SSE_TYPE)
        await response.write(reply.event("response.created", response=reply.body(None))
                             + reply.event("response.in_progress", response=reply.body(None)))
        thought = text = ""
        outcome = None
        async for kind, data in reply_events(generation, first):
            if kind == "end":
                outcome = data
                continue
            out = b""
            if kind == "reasoning":  # the reasoning item, first, opens with the thought's first piece
                if not thought:
                    out += reply.event("response.output_item.added", output_index=0,
                                       item=reply.reasoning_item("", "in_progress"))
                    out += reply.event("response.content_part.added", item_id=reply.reasoning_id,
                                       output_index=0, content_index=0, part=_reasoning_part(""))
                thought += data
                out += reply.event("response.reasoning_text.delta", item_id=reply.reasoning_id, output_index=0,
                                   content_index=0, delta=data)
                await response.write(out)
                continue
            at = 1 if thought else 0
            if not text:  # the message item opens with its first text
                out += reply.event("response.output_item.added", output_index=at, item=reply.message(""))
                out += reply.event("response.content_part.added", item_id=reply.message_id, output_index=at,
                                   content_index=0, part=_text_part(""))
            text += data
            out += reply.event("response.output_text.delta", item_id=reply.message_id, output_index=at,
                               content_index=0, delta=data, logprobs=[])
            await response.write(out)
        try:
            generation.result()
        except ApiError as exc:  # after the headers: the Responses API's error event
            await response.write(reply.event("error", message=exc.message, code=exc.code, param=exc.param))
            await response.write_eof()
            return response
        result = outcome[0]
        body = self._finish(reply, result, history, echo)
        out = b""
        for index, item in enumerate(body["output"]):
            streamed = {"message": text, "reasoning": thought}.get(item["type"])
            out += self._item_events(reply, index, item, opened=bool(streamed))
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        out += reply.event(kind, response=body)
        await response.write(out)
        await response.write_eof()
        return response

    @staticmethod
    def _item_events(reply: "ResponseReply", index: int, item: dict, opened: bool) -> bytes:
        """An output item's events after its deltas (a message's text streamed already), or
        whole (a function call's arguments in pieces, a reasoning item)."""
        out = b""
        if not opened:
            added = dict(item, status="in_progress")
            if item["type"] == "message":
                added["content"] = []
            elif item["type"] == "function_call":
                added["arguments"] = ""
            out += reply.event("response.output_item.added", output_index=index, item=added)
        if item["type"] == "message":
            part = item["content"][0]
            if not opened:
                out += reply.event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part=_text_part(""))
                out += reply.event("response.output_text.delta", item_id=item["id"], output_index=index,
                                   content_index=0, delta=part["text"], logprobs=[])
            out += reply.event("response.output_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=part["text"], logprobs=[])
            out += reply.event("response.content_part.done", item_id=item["id"], output_index=index,
                               content_index=0, part=part)
        elif item["type"] == "reasoning":
            part = item["content"][0]
            if not opened:
                out += reply.event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part=_reasoning_part(""))
                out += reply.event("response.reasoning_text.delta", item_id=item["id"], output_index=index,
                                   content_index=0, delta=part["text"])
            out += reply.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=part["text"])
            out += reply.event("response.content_part.done", item_id=item["id"], output_index=index,
                               content_index=0, part=part)
        elif item["type"] == "function_call":
            arguments = item["arguments"]
            for at in range(0, len(arguments), ARGUMENT_PIECE):
                out += reply.event("response.function_call_arguments.delta", item_id=item["id"],
                                   output_index=index, delta=arguments[at:at + ARGUMENT_PIECE])
            out += reply.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               name=item["name"], arguments=arguments)
        return out + reply.event("response.output_item.done", output_index=index, item=item)


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_part(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


class ResponseReply:
    """One response's id, its output items and its events (numbered in order)."""

    def __init__(self, model: ServedModel, echo: dict):
        self.model = model
        self.echo = echo  # the request's settings the response object repeats
        self.id = "resp_" + uuid.uuid4().hex
        self.message_id = "msg_" + uuid.uuid4().hex
        self.reasoning_id = "rs_" + uuid.uuid4().hex
        self.created = int(time.time())
        self._sequence = 0

    def event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(data, event=kind)

    def message(self, text: str, status: str = "in_progress") -> dict:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [_text_part(text)] if status != "in_progress" else []}

    def reasoning_item(self, thought: str, status: str) -> dict:
        return {"type": "reasoning", "id": self.reasoning_id, "summary": [], "status": status,
                "content": [_reasoning_part(thought)] if status != "in_progress" else []}

    def output(self, result) -> list[dict]:
        reasoning, text = reasoning_of(result)
        status = "incomplete" if result.finish_reason == "length" else "completed"
        items = []
        if reasoning:
            items.append(self.reasoning_item(reasoning, status))
        if text or not result.tool_calls:
            items.append(self.message(text, status))
        for call in result.tool_calls:
            items.append({"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call.id,
                          "name": call.name, "arguments": call.arguments, "status": status})
        return items

    def body(self, result) -> dict:
        """The response object: in progress (no result yet), completed, or incomplete (cut by
        max_output_tokens, its last item unfinished)."""
        done = result is not None
        cut = done and result.finish_reason == "length"
        body = {"id": self.id, "object": "response", "created_at": self.created, "model": self.model.id,
                "status": ("incomplete" if cut else "completed") if done else "in_progress",
                "error": None, "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                "output": self.output(result) if done else [], "usage": None, **self.echo}
        if done:
            stats = result.stats
            body["usage"] = {"input_tokens": stats.prompt_tokens,
                             "input_tokens_details": {"cached_tokens": stats.reused_tokens},
                             "output_tokens": stats.generated_tokens,
                             "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": stats.prompt_tokens + stats.generated_tokens}
        return body


# ----------------------------------------------------------------------------- the request

def _parts(content, where: str, role: str, images: list, limits) -> list:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of content parts")
    parts: list = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            if not isinstance(part.get("text"), str):
                raise bad(f"{at}.text", "must be a string")
            parts.append(part["text"])
        elif kind == "input_image" and role == "user":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise bad(f"{at}.image_url", "must be a data URL (data:image/png;base64,...); file ids are "
                                             "not kept by this server")
            check_image_count(images, at, limits)
            images.append(data_url_image(url, f"{at}.image_url", len(images), limits))
            parts.append(images[-1])
        elif kind == "refusal" and role == "assistant":
            continue
        else:
            raise bad(f"{at}.type", f"{kind!r} parts are not supported in {role} messages "
                                    "(input_text, input_image in user messages, output_text)")
    return parts


_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def parse_input(raw, limits) -> list[ChatMessage]:
    """`input` as messages: consecutive function_call items join one assistant message."""
    if isinstance(raw, str):
        return [ChatMessage.text("user", raw)]
    if not isinstance(raw, list):
        raise bad("input", "must be a string or a list of input items")
    messages: list[ChatMessage] = []
    images: list = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(where, "must be an input item (an object)")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad(f"{where}.role", f"must be user, assistant, system or developer, got {role!r}")
            messages.append(ChatMessage(_ROLES[role], _parts(item.get("content"), f"{where}.content", role,
                                                            images, limits)))
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not all(isinstance(v, str) and v for v in (call_id, name)) or not isinstance(arguments, str):
                raise bad(where, "a function_call item needs call_id, name and arguments (a JSON string)")
            call = ToolCall(call_id, name, arguments)
            if messages and messages[-1].role == "assistant":
                messages[-1].tool_calls.append(call)
            else:
                messages.append(ChatMessage("assistant", [], [call]))
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not call_id:
                raise bad(f"{where}.call_id", "a function_call_output must name the call it answers")
            if isinstance(output, list):
                output = "".join(p.get("text", "") for p in output if isinstance(p, dict))
            if not isinstance(output, str):
                raise bad(f"{where}.output", "must be a string")
            messages.append(ChatMessage("tool", [output], tool_call_id=call_id))
        elif kind == "reasoning":  # an earlier thought: the think chunk before that turn's answer
            content = item.get("content") or []
            if not isinstance(content, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                        for p in content):
                raise bad(f"{where}.content", "must be a list of {\"type\": \"reasoning_text\", \"text\": ...}")
            thought = "".join(p["text"] for p in content)
            if thought:  # the answer's message or calls that follow join this assistant turn
                messages.append(ChatMessage("assistant", [ThinkPart(thought)]))
        else:
            raise bad(f"{where}.type", f"{kind!r} items are not supported (message, function_call, "
                                       "function_call_output)")
    return messages


def _tools(body: dict):
    raw = body.get("tools")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("tools", "must be a list of {\"type\": \"function\", \"name\", \"parameters\"} objects")
    check_tool_count(raw)
    specs = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad(f"tools[{i}].type", "only function tools are supported (this server searches nothing)")
        specs.append(tool_spec(tool, f"tools[{i}]", specs))
    return specs


def _tool_choice(raw, tools) -> tuple[str, str | None]:
    if raw is None or raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise bad("tool_choice", "'required' needs tools")
        return raw or "auto", None
    if isinstance(raw, dict) and raw.get("type") == "function":
        if raw.get("name") not in {t.name for t in tools}:
            raise bad("tool_choice.name", f"names {raw.get('name')!r}, which is not among the tools")
        return "named", raw["name"]
    raise bad("tool_choice", "must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}")


def _text_format(text) -> str | None:
    """`text.format`: text, json_object, or json_schema (its `schema`), as a grammar."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return output_grammar(None, "text.format")
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad("text.format.schema", "must be a JSON Schema object")
        return output_grammar(fmt["schema"], "text.format")
    raise bad("text.format.type", f"must be text, json_object or json_schema, got {kind!r}")


def parse_responses_request(body, model: ServedModel, limits, store: ResponseStore):
    """The job, the conversation it answers (what a later previous_response_id continues,
    without the instructions, which OpenAI does not carry over), and what the response repeats."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body: must be a JSON object")
    check_model(body, model)
    for name, neutral in _NOT_SUPPORTED.items():
        if body.get(name) not in (None, neutral):
            raise bad(name, f"not supported by this server (got {body[name]!r})", code="unsupported_parameter")
    history: list[ChatMessage] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        history = store.get(previous) if isinstance(previous, str) else None
        if history is None:
            raise bad("previous_response_id", f"no response {previous!r} is kept here (responses are "
                                              "remembered while the server runs, a bounded number)",
                      code="previous_response_not_found")
    if body.get("input") is None:
        raise bad("input", "is required (a string or a list of input items)")
    history += parse_input(body["input"], limits)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", "must be a string")
    messages = ([ChatMessage.text("system", instructions)] if instructions else []) + history
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"must be true or false, got {stream!r}")
    sampling = {"max_tokens": body.get("max_output_tokens"), "temperature": body.get("temperature"),
                "top_p": body.get("top_p"), "seed": body.get("seed")}
    try:
        params = sampling_params(sampling, model.context_size)
    except ApiError as exc:
        if exc.param == "max_tokens":
            raise bad("max_output_tokens", exc.message.partition(": ")[2]) from None
        raise
    tools = _tools(body)
    choice, named = _tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", f"must be true or false, got {parallel!r}")
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise bad("reasoning", "must be an object ({\"effort\": ...})")
    check_reasoning_effort((reasoning or {}).get("effort"), "reasoning.effort")
    grammar = _text_format(body.get("text"))
    request = tool_request(tools, choice, named, parallel, grammar) if tools or grammar else None
    job = chat_job(messages, model, params, stream, request, param="input")
    store_it = body.get("store", True) is not False
    echo = {"instructions": instructions, "previous_response_id": previous, "max_output_tokens":
            body.get("max_output_tokens"), "temperature": params.temperature, "top_p": params.top_p,
            "parallel_tool_calls": parallel, "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "text": body.get("text") or {"format": {"type": "text"}},
            "truncation": "disabled", "store": store_it, "metadata": body.get("metadata") or {},
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")} if reasoning else None}
    return job, history, echo
