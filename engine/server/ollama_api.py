"""Ollama's API over the one request model: /api/chat and /api/generate (NDJSON streaming, on
by default as Ollama's), /api/tags, /api/show, /api/ps, /api/version, and `GET /` ("Ollama is
running", the probe clients send). What does not apply to a server of one loaded GGUF (pull,
push, create, copy, delete, embeddings) is refused in one sentence. The server can listen on
Ollama's port as well (`serve --ollama-port 11434`), under the same security rules.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import time

from aiohttp import web

from ..api import ChatMessage, ThinkPart, ToolCall
from .errors import ApiError, bad
from .openai_api import ServedModel, chat_job, check_image_count, check_model, decoded_image, sampling_params
from .streaming import NDJSON_TYPE, ndjson, open_stream
from .tasks import reasoning_of, reply_events
from .tools_api import arguments_object, output_grammar, parse_tools, tool_request

API_VERSION = "0.12.0"  # the Ollama API version whose endpoints and fields this module follows
_REFUSED = ("pull", "push", "create", "copy", "delete", "embed", "embeddings", "blobs/{digest}")
# options whose other values would change the output and are not honoured here
_OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "min_p": "min_p", "seed": "seed", "stop": "stop", "repeat_penalty": "repetition_penalty"}
_IGNORED_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "numa",
                    "low_vram", "num_keep")  # how the model runs, not what it writes


class OllamaRoutes:
    name = "ollama"
    family = "ollama"  # the API family a server may leave out (http.API_FAMILIES)
    prefixes = ("/api/",)
    public = ("root", "version")  # probes, answered without the key as Ollama's are

    def __init__(self, server):
        self.server = server

    def routes(self):
        out = [("GET", "/", self.root), ("HEAD", "/", self.root),
               ("GET", "/api/version", self.version), ("GET", "/api/tags", self.tags),
               ("GET", "/api/ps", self.ps), ("POST", "/api/show", self.show),
               ("POST", "/api/chat", self.chat), ("POST", "/api/generate", self.generate)]
        for path in _REFUSED:
            method = "DELETE" if path == "delete" else ("HEAD" if path.startswith("blobs") else "POST")
            out.append((method, f"/api/{path}", self.refused))
        return out

    @staticmethod
    def error_response(exc: ApiError) -> web.Response:
        return web.json_response({"error": exc.message}, status=exc.status)

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": API_VERSION})

    async def refused(self, request: web.Request) -> web.Response:
        what = request.path.removeprefix("/api/").split("/")[0]
        raise ApiError(501, f"{request.method} {request.path}: {what} does not apply here: this server "
                            "serves the one GGUF model it was started with (tramontane-cli serve --model)")

    async def tags(self, request: web.Request) -> web.Response:
        model = self.server.model()
        return web.json_response({"models": [self._listing(model, name) for name in model.ids]})

    async def ps(self, request: web.Request) -> web.Response:
        model = self.server.model()
        far = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=3650)).isoformat()
        return web.json_response({"models": [dict(self._listing(model, name), expires_at=far, size_vram=0,
                                                  context_length=model.context_size) for name in model.ids]})

    async def show(self, request: web.Request) -> web.Response:
        model = self.server.model()
        body = await self.server.read_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "request body: must be a JSON object")
        name = body.get("model", body.get("name"))
        if not isinstance(name, str):
            raise bad("model", "must name the model")
        check_model({"model": name}, model)
        return web.json_response({
            "modelfile": "", "parameters": "", "template": "", "details": _details(),
            "model_info": {"general.basename": model.id, "mistral3.context_length": model.context_size},
            "capabilities": model.capabilities, "modified_at": _iso(model.created)})

    def _listing(self, model: ServedModel, name: str) -> dict:
        return {"name": name, "model": name, "modified_at": _iso(model.created), "size": 0,
                "digest": "", "details": _details()}

    async def chat(self, request: web.Request) -> web.StreamResponse:
        model = self.server.model()
        body = await self.server.read_json(request)
        job = parse_chat_body(body, model, self.server.limits)
        return await self._answer(request, job, model, "chat")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        model = self.server.model()
        body = await self.server.read_json(request)
        job = parse_generate_body(body, model, self.server.limits)
        if job is None:  # an empty prompt: Ollama loads the model and says it is done
            return web.json_response({"model": model.id, "created_at": _now(), "response": "", "done": True,
                                      "done_reason": "load"})
        return await self._answer(request, job, model, "generate")

    async def _answer(self, request, job, model: ServedModel, kind: str) -> web.StreamResponse:
        generation = self.server.tasks.chat(job, model) if job.messages else self.server.tasks.completion(job, model)
        started = time.monotonic_ns()
        try:
            if not job.stream:
                (outcome,) = await generation.outcomes()
                return web.json_response(_final(model, kind, outcome[0], started, whole=True))
            first = await generation.first_event()
            response = await open_stream(request, NDJSON_TYPE)
            async for event, data in reply_events(generation, first):
                if event != "end":
                    await response.write(ndjson(_piece(model, kind, data, thought=event == "reasoning")))
                else:
                    try:
                        generation.result()
                    except ApiError as exc:
                        await response.write(ndjson({"error": exc.message}))
                        break
                    await response.write(ndjson(_final(model, kind, data[0], started, whole=False)))
            await response.write_eof()
            return response
        except (asyncio.CancelledError, ConnectionError):
            generation.cancel()
            raise


def _details() -> dict:
    return {"parent_model": "", "format": "gguf", "family": "mistral3", "families": ["mistral3"],
            "parameter_size": "", "quantization_level": ""}


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _piece(model: ServedModel, kind: str, text: str, thought: bool = False) -> dict:
    """A streamed piece of the answer, or of the thought (Ollama's `thinking` beside an empty
    content or response)."""
    out = {"model": model.id, "created_at": _now(), "done": False}
    field = {"content": "", "thinking": text} if thought else {"content": text}
    if kind == "chat":
        out["message"] = {"role": "assistant", **field}
    else:
        out["response"] = field["content"]
        if thought:
            out["thinking"] = text
    return out


def _final(model: ServedModel, kind: str, result, started_ns: int, whole: bool) -> dict:
    reasoning, text = reasoning_of(result)
    stats = result.stats
    total = time.monotonic_ns() - started_ns
    prompt_ns = int(stats.ttft_s * 1e9)
    out = {"model": model.id, "created_at": _now(), "done": True,
           "done_reason": "length" if result.finish_reason == "length" else "stop",
           "total_duration": total, "load_duration": 0, "prompt_eval_count": stats.prompt_tokens,
           "prompt_eval_duration": prompt_ns, "eval_count": stats.generated_tokens,
           "eval_duration": max(0, total - prompt_ns)}
    if kind == "chat":
        message = {"role": "assistant", "content": text if whole else ""}
        if reasoning and whole:
            message["thinking"] = reasoning
        if result.tool_calls:
            message["tool_calls"] = [{"function": {"name": c.name, "arguments": arguments_object(c)}}
                                     for c in result.tool_calls]
        out["message"] = message
    else:
        out["response"] = text if whole else ""
        if reasoning and whole:
            out["thinking"] = reasoning
    return out


# ----------------------------------------------------------------------------- the request

def _options(body: dict, model: ServedModel):
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise bad("options", "must be an object")
    sampling = {}
    for name, value in options.items():
        if name in _OPTIONS:
            sampling[_OPTIONS[name]] = value
        elif name == "num_ctx":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad("options.num_ctx", f"must be a positive integer, got {value!r}")
            if value > model.context_size:
                raise bad("options.num_ctx", f"{value} is more than the {model.context_size} tokens this "
                                             "server was started with (serve --context-length)")
        elif name not in _IGNORED_OPTIONS:
            raise bad(f"options.{name}", "not supported by this server", code="unsupported_parameter")
    if sampling.get("max_tokens") in (-1, -2):  # Ollama's "until done" / "fill the context"
        sampling.pop("max_tokens")
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    try:
        return sampling_params(sampling, model.context_size)
    except ApiError as exc:
        reverse = {v: k for k, v in _OPTIONS.items()}
        if exc.param in reverse:  # named as Ollama names it
            raise bad(f"options.{reverse[exc.param]}", exc.message.partition(": ")[2]) from None
        raise


def _format(raw):
    """`format`: "json" (any JSON object) or a JSON Schema; "" or absent: text."""
    if raw is None or raw == "":
        return None
    if raw == "json":
        return output_grammar(None, "format")
    if isinstance(raw, dict):
        return output_grammar(raw, "format")
    raise bad("format", f"must be \"json\" or a JSON Schema object, got {raw!r}")


def check_think(raw) -> None:
    """`think`: true / false, or "low" / "medium" / "high" (Ollama's levels), accepted but not a
    switch: a Mistral reasoning model thinks as its own system prompt tells it and this server
    cannot tell it not to (nor how long to), so `false` neither stops the thought nor hides it.
    The reasoning comes back as `thinking` (`tasks.reasoning_of`), streamed and whole."""
    if raw is None or isinstance(raw, bool) or raw in ("low", "medium", "high"):
        return
    raise bad("think", f"must be true, false, \"low\", \"medium\" or \"high\", got {raw!r}")


def _stream(body: dict) -> bool:
    stream = body.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise bad("stream", f"must be true or false, got {stream!r}")
    return stream


def _images(raw, where: str, images: list, limits) -> list:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(i, str) for i in raw):
        raise bad(where, "must be a list of base64-encoded images")
    out = []
    for i, data in enumerate(raw):
        check_image_count(images, f"{where}[{i}]", limits)
        image = decoded_image(data, f"{where}[{i}]", len(images), limits)
        images.append(image)
        out.append(image)
    return out


def _message_list(raw, limits) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "must be a non-empty list of messages")
    messages: list[ChatMessage] = []
    images: list = []
    calls_open: list[ToolCall] = []  # the last assistant's calls, not answered yet (Ollama sends no ids)
    made = 0
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object with role and content")
        role, content = m.get("role"), m.get("content", "")
        if role not in ("system", "user", "assistant", "tool"):
            raise bad(f"{where}.role", f"must be system, user, assistant or tool, got {role!r}")
        if not isinstance(content, str):
            raise bad(f"{where}.content", "must be a string")
        if role == "tool":
            name = m.get("tool_name")
            match = next((c for c in calls_open if name is None or c.name == name), None)
            if match is None:
                raise bad(where, "a tool message must answer a call of the assistant message before it")
            calls_open.remove(match)
            messages.append(ChatMessage("tool", [content], tool_call_id=match.id))
            continue
        parts: list = [content] if content else []
        if role == "user":
            parts += _images(m.get("images"), f"{where}.images", images, limits)
        elif m.get("images"):
            raise bad(f"{where}.images", f"images can only be sent in user messages, not {role} messages")
        calls = []
        if role == "assistant":
            thought = m.get("thinking")  # an earlier thought, Ollama's field: the think chunk before the answer
            if thought is not None and not isinstance(thought, str):
                raise bad(f"{where}.thinking", "must be a string")
            parts = ([ThinkPart(thought)] if thought else []) + parts
            for j, call in enumerate(m.get("tool_calls") or []):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad(f"{where}.tool_calls[{j}]", "must be {\"function\": {\"name\", \"arguments\"}}")
                arguments = fn.get("arguments", {})
                made += 1
                calls.append(ToolCall(f"call{made:05d}", fn["name"],  # 9 letters and digits, as Mistral's ids
                                      arguments if isinstance(arguments, str)
                                      else json.dumps(arguments, ensure_ascii=False)))
            calls_open = list(calls)
        messages.append(ChatMessage(role, parts, calls))
    return messages


def _tools(body: dict):
    tools = parse_tools(body.get("tools"))  # OpenAI's tool shape, as Ollama takes it
    return tool_request(tools, "auto", grammar_text=_format(body.get("format"))) if tools else None


def parse_chat_body(body, model: ServedModel, limits):
    if not isinstance(body, dict):
        raise ApiError(400, "request body: must be a JSON object")
    check_model(body, model)
    check_think(body.get("think"))
    messages = _message_list(body.get("messages"), limits)
    params = _options(body, model)
    request = _tools(body)
    if request is None:
        grammar = _format(body.get("format"))
        request = tool_request([], "auto", grammar_text=grammar) if grammar else None
    return chat_job(messages, model, params, _stream(body), request)


def parse_generate_body(body, model: ServedModel, limits):
    """/api/generate: a prompt (with `system`, `images`), as a one-turn chat; `raw` prompts are
    continued as given. None for an empty prompt (Ollama's "load the model")."""
    from .openai_api import ChatJob

    if not isinstance(body, dict):
        raise ApiError(400, "request body: must be a JSON object")
    check_model(body, model)
    check_think(body.get("think"))
    for name in ("suffix", "template", "context"):
        if body.get(name):
            raise bad(name, "not supported by this server", code="unsupported_parameter")
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise bad("prompt", "must be a string")
    if not prompt and not body.get("images"):
        return None
    params = _options(body, model)
    grammar = _format(body.get("format"))
    request = tool_request([], "auto", grammar_text=grammar) if grammar else None
    if body.get("raw"):
        if body.get("images"):
            raise bad("images", "cannot be sent with raw: true (a raw prompt is text)")
        if request is not None:
            raise bad("format", "cannot be used with raw: true on this server")
        return ChatJob(params, _stream(body), False, prompt=prompt, prompts=[prompt])
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise bad("system", "must be a string")
    parts = ([prompt] if prompt else []) + _images(body.get("images"), "images", [], limits)
    messages = ([ChatMessage.text("system", system)] if system else []) + [ChatMessage("user", parts)]
    return chat_job(messages, model, params, _stream(body), request, param="prompt")
