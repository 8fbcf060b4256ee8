"""OpenAI's API over the one request model: /v1/chat/completions, /v1/completions,
/v1/models and /health (also without /v1). The bodies are read by `openai_api` and
`tools_api`; the engine work is `tasks.Tasks`; this module only joins them to routes and
writes OpenAI's replies and stream chunks."""
from __future__ import annotations

import asyncio
import dataclasses

from aiohttp import web

from ..api import LoggedPiece
from ..documents.document import DocumentError
from ..documents.prompt import engine_documents_prompt
from .errors import ApiError, bad
from .openai_api import ChatJob, Reply, chat_job, model_not_found, model_object, models_response, \
    parse_chat_request, parse_completion_request, parse_detokenize_request, parse_tokenize_request, timings_of, \
    tokenize_reply, usage_of
from .streaming import SSE_TYPE, open_stream, sse
from .tasks import Generation
from .tools_api import ToolStream


class OpenAIRoutes:
    name = "openai"
    family = "openai"  # the API family a server may leave out (http.API_FAMILIES)
    prefixes = ("/v1/", "/")  # the fallback: every path no other API claims

    def __init__(self, server):
        self.server = server

    def routes(self) -> list[tuple[str, str, object]]:
        out = []
        for prefix in ("/v1", ""):  # clients given the base URL without /v1 too
            out += [("GET", f"{prefix}/health", self.health),
                    ("GET", f"{prefix}/models", self.models),
                    ("GET", f"{prefix}/models/{{name}}", self.one_model),
                    ("POST", f"{prefix}/chat/completions", self.chat),
                    ("POST", f"{prefix}/completions", self.completions)]
        # llama-server's and vLLM's token endpoints (at the root, where both serve them)
        return out + [("POST", "/tokenize", self.tokenize), ("POST", "/detokenize", self.detokenize)]

    public = ("health",)  # answered without the API key (a load balancer's probe)
    always = ("health", "models", "one_model")  # served whichever families are on (every client lists models)

    @staticmethod
    def error_response(exc: ApiError) -> web.Response:
        headers = {}
        if exc.status == 503:
            headers["Retry-After"] = "1"
        elif exc.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return web.json_response(exc.body(), status=exc.status, headers=headers)

    # -- endpoints ------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        """llama-server's shape: 200 {"status": "ok"} once a model is loaded, 503 before."""
        if self.server.executor.served_model() is None:
            return web.json_response({"error": {"code": 503, "message": "Loading model",
                                                "type": "unavailable_error"}}, status=503,
                                     headers={"Retry-After": "1"})
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(models_response(self.server.model()))

    async def one_model(self, request: web.Request) -> web.Response:
        model = self.server.model()
        name = request.match_info["name"]
        if name not in model.ids:
            raise model_not_found(name, model)
        return web.json_response(model_object(model, name))

    async def tokenize(self, request: web.Request) -> web.Response:
        model = self.server.model()
        job = parse_tokenize_request(await self.server.read_json(request), self.server.limits)
        reply = self.server.executor.submit(lambda engine: tokenize_reply(engine, job, model))
        return web.json_response(await asyncio.wrap_future(reply))

    async def detokenize(self, request: web.Request) -> web.Response:
        """The ids' text with control tokens by name (llama-server and vLLM both keep them), under
        llama-server's name (`content`) and vLLM's (`prompt`)."""
        ids = parse_detokenize_request(await self.server.read_json(request), self.server.model())
        text = await asyncio.wrap_future(self.server.executor.submit(
            lambda engine: engine.tokenizer.decode(ids, skip_special=False)))
        return web.json_response({"content": text, "prompt": text})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        model = self.server.model()
        job = parse_chat_request(await self.server.read_json(request), model, self.server.limits)
        if any(m.documents for m in job.messages):
            job = await self._with_documents(job, model)
        return await self._answer(request, "chat", self.server.tasks.chat(job, model), model)

    async def _with_documents(self, job: ChatJob, model) -> ChatJob:
        """The job with its `file` parts read and placed (documents_prompt, the window's rule) in
        an engine job, off the event loop; a file that cannot be read is a 400 with its sentence."""
        messages, reply_tokens = job.messages, job.params.max_tokens
        future = self.server.executor.submit(lambda engine: engine_documents_prompt(engine, messages, reply_tokens))
        try:
            prompt = await asyncio.wrap_future(future)
        except DocumentError as exc:
            raise bad("messages", str(exc), code="invalid_file") from None
        chat_job(prompt.messages, model, job.params, job.stream, job.tool_request)  # checked again: scans are images
        return dataclasses.replace(job, messages=prompt.messages)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        model = self.server.model()
        job = parse_completion_request(await self.server.read_json(request), model, self.server.limits)
        return await self._answer(request, "completions", self.server.tasks.completion(job, model), model)

    # -- one answer -----------------------------------------------------------------------------
    async def _answer(self, request, endpoint: str, generation: Generation, model) -> web.StreamResponse:
        """Every choice of every prompt in one engine job: choice i of prompt p is number p * n + i."""
        job = generation.job
        try:
            if job.stream:
                return await self._stream(request, endpoint, generation, model)
            outcomes = await generation.outcomes()
            reply = Reply(endpoint, model, reasoning_format=job.reasoning_format,
                          speculating=job.params.speculation != "off")
            bodies = [reply.whole(*outcome) for outcome in outcomes]
            body = bodies[0]
            body["choices"] = [dict(b["choices"][0], index=index) for index, b in enumerate(bodies)]
            body["usage"] = usage_of([result for result, _ in outcomes], job.n)
            body["timings"] = timings_of([result for result, _ in outcomes], reply.speculating)
            return web.json_response(body)
        except (asyncio.CancelledError, ConnectionError):
            # The client went away (aiohttp cancels the handler, or a write fails).
            generation.cancel()
            raise

    async def _stream(self, request, endpoint, generation: Generation, model):
        job = generation.job
        first = await generation.first_event()
        response = await open_stream(request, SSE_TYPE)
        reply = Reply(endpoint, model, job.include_usage, job.reasoning_format,
                      speculating=job.params.speculation != "off")
        opening = reply.opening()
        if opening is not None:
            await response.write(b"".join(sse(_indexed(opening, i))
                                          for i in range(len(job.prompts or [None]) * job.n)))
        results = []
        usage_chunks: list[dict] = []
        tool_mode = job.tool_request is not None and job.tool_request.calls_tools
        tool_streams: dict[int, ToolStream] = {}  # per choice: content live, calls once whole
        async for batch in generation.batches(first):
            out = []
            for kind, index, data in batch:
                if kind == "reasoning":  # never a tool call's wire text
                    out.append(_indexed(_delta(reply.piece(""), reply.thoughts.thought(index, data)), index))
                elif kind == "text" and tool_mode:
                    stream = tool_streams.setdefault(index, ToolStream())
                    out += [_indexed(_delta(reply.piece(""), _answered(reply, index, d)), index)
                            for d in stream.feed(data)]
                elif kind == "text":
                    logprobs = data.logprobs if isinstance(data, LoggedPiece) else None
                    out.append(_indexed(reply.piece(reply.thoughts.answer(index, data), logprobs, index), index))
                else:
                    result, reason = data
                    results.append(result)
                    if tool_mode:
                        stream = tool_streams.setdefault(index, ToolStream())
                        out += [_indexed(_delta(reply.piece(""), _answered(reply, index, d)), index)
                                for d in stream.finish(result)]
                    finish, *usage_chunks = reply.closing(result, reason, index)
                    out.append(_indexed(finish, index))
            await response.write(b"".join(sse(chunk) for chunk in out))
        try:
            generation.result()
        except ApiError as exc:  # after the headers: an error event, as vLLM sends
            await response.write(sse(exc.body()))
        else:
            if usage_chunks:  # the usage of every choice, after the last one
                usage_chunks[-1]["usage"] = usage_of(results, job.n)
                await response.write(b"".join(sse(chunk) for chunk in usage_chunks))
        await response.write(sse("[DONE]"))
        await response.write_eof()
        return response


def _answered(reply: Reply, index: int, delta: dict) -> dict:
    """A tool stream's delta with its content after the thought's [/THINK] (when inline)."""
    if "content" in delta:
        delta = dict(delta, content=reply.thoughts.answer(index, delta["content"]))
    return delta


def _delta(chunk: dict, delta: dict) -> dict:
    chunk["choices"][0]["delta"] = delta
    return chunk


def _indexed(chunk: dict, index: int) -> dict:
    for choice in chunk.get("choices", ()):
        choice["index"] = index
    return chunk
