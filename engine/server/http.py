"""The OpenAI-compatible HTTP server: aiohttp routes, the safety checks, SSE and disconnects.

aiohttp does the protocol work (HTTP/1.1, keep-alive, chunked event streams, body size limits,
cancelling a handler whose client went away); it runs on its own thread and event loop, so the
CLI and the window start it alike. Every generation is a job for the engine's one owner
(`EngineExecutor`), submitted in arrival order; tokens come back through the event loop.

Safe by default: it binds loopback and refuses any other address unless asked, with an API key;
a browser page can neither read nor drive it (no CORS headers, foreign `Origin` and non-local
`Host` refused) unless origins are allowed; nothing from a request is written to disk or logged
beyond the request line.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from aiohttp import web

from ..api import EngineError, GenerationResult
from ..runtime.generate import InvalidLogitsError
from .executor import EngineExecutor, ModelUnavailable
from .openai_api import (
    ApiError,
    ChatJob,
    ConversationKeys,
    Reply,
    RequestLimits,
    ServedModel,
    check_model,
    model_object,
    models_response,
    parse_chat_request,
    parse_completion_request,
    stop_reason,
)

log = logging.getLogger(__name__)

ENDPOINTS = "GET /v1/models[/NAME], POST /v1/chat/completions, POST /v1/completions"
COMPLETIONS_SESSION = ConversationKeys.PREFIX + "completions"  # raw prompts share one KV entry
_END = object()  # the job is done (after its last piece)
STREAM_BATCH_S = 0.02  # streamed text after the first piece reaches the client at most this much later


@dataclass(frozen=True)
class Finished:
    """What `on_finished` hears after each generation (on the server's thread)."""

    endpoint: str  # "chat" or "completions"
    result: GenerationResult
    session_key: str


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, allow_network: bool, api_key: str | None) -> None:
    """Loopback only, unless the user asked for the network and set a key."""
    if is_loopback(host):
        return
    if not allow_network:
        raise EngineError(f"--host {host}: the server binds only to this machine (127.0.0.1) unless "
                          "--allow-network is given: anyone who can reach the port could use the model")
    if not api_key:
        raise EngineError(f"--host {host}: serving on the network needs an API key (--api-key or "
                          "--api-key-env)")


def _sse(obj) -> bytes:
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + text.encode("utf-8") + b"\n\n"


def _error_response(exc: ApiError) -> web.Response:
    headers = {}
    if exc.status == 503:
        headers["Retry-After"] = "1"
    elif exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return web.json_response(exc.body(), status=exc.status, headers=headers)


def engine_failure(exc: BaseException) -> ApiError:
    """An exception from a job as the client should read it."""
    if isinstance(exc, ModelUnavailable):
        return ApiError(503, str(exc), code="model_not_loaded")
    if isinstance(exc, InvalidLogitsError):
        return ApiError(500, str(exc), code="invalid_logits")
    if isinstance(exc, EngineError):
        return ApiError(400, str(exc))
    if isinstance(exc, MemoryError):
        return ApiError(503, "out of memory while generating: send a shorter prompt", code="out_of_memory")
    log.error("a server job failed", exc_info=exc)
    return ApiError(500, f"the engine failed: {type(exc).__name__}: {exc}")


class _Relay:
    """Carries a job's text pieces and then its end from the engine thread to the event loop.

    Pieces cross in batches: the first piece of a batch wakes the loop, which takes the batch
    STREAM_BATCH_S later with whatever arrived meanwhile, so a fast engine is not slowed by a
    thread hand-over (and the GIL going back and forth) per token. The reply's first piece
    goes at once (time to first token)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: threading.Event):
        self.events: asyncio.Queue = asyncio.Queue()  # text batches, then _END
        self._loop = loop
        self._cancel = cancel
        self._arrived: list[str] = []
        self._lock = threading.Lock()
        self._delay = 0.0

    def call(self, fn, *args) -> None:
        """Run fn on the loop (from any thread); a stopped server cancels the job instead."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._cancel.set()

    def post(self, piece: str) -> None:  # engine thread
        with self._lock:
            self._arrived.append(piece)
            if len(self._arrived) > 1:
                return  # a hand-over is already on its way and will take this piece too
        self.call(self._loop.call_later, self._delay, self._hand_over)
        self._delay = STREAM_BATCH_S

    def end(self) -> None:  # on the loop, after the job's last post
        self._hand_over()  # the last batch now, not after its delay
        self.events.put_nowait(_END)

    def _hand_over(self) -> None:  # on the loop
        with self._lock:
            text = "".join(self._arrived)
            self._arrived.clear()
        if text:
            self.events.put_nowait(text)


class OpenAIServer:
    """`start()` binds and serves in a background thread; `stop()` ends it (and its replies)."""

    def __init__(self, executor: EngineExecutor, *, host: str = "127.0.0.1", port: int = 8080,
                 api_key: str | None = None, allow_network: bool = False,
                 cors_origins: tuple[str, ...] = (), limits: RequestLimits | None = None,
                 on_finished: Callable[[Finished], None] | None = None):
        check_bind(host, allow_network, api_key)
        self.executor = executor
        self.host = host
        self.port = port
        self.limits = limits or RequestLimits()
        self.cors_origins = frozenset(o.rstrip("/") for o in cors_origins)
        self.on_finished = on_finished
        self.conversations = ConversationKeys()
        self._api_key = api_key.encode("utf-8") if api_key else None
        self._check_host = is_loopback(host)
        self._pending = 0  # jobs waiting or running (touched on the loop thread only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def __repr__(self) -> str:  # never the key
        return f"OpenAIServer({self.url!r}, api_key={'<hidden>' if self._api_key else None})"

    # -- lifetime (any thread) -----------------------------------------------------------------
    def start(self) -> OpenAIServer:
        """Bind and serve; raises EngineError in words when the port cannot be had."""
        ready: Future = Future()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="openai-server",
                                        daemon=True)
        self._thread.start()
        try:
            ready.result()
        except BaseException:
            self._thread.join()
            self._thread = None
            raise
        return self

    def stop(self) -> None:
        """Close the port and every connection; running replies are cancelled."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        self._thread = None

    def _serve(self, ready: Future) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self._app(), handler_cancellation=True, shutdown_timeout=1.0)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
            self.port = runner.addresses[0][1]  # the real one when port 0 was asked
        except OSError as exc:
            loop.run_until_complete(runner.cleanup())
            loop.close()
            ready.set_exception(EngineError(f"cannot serve on {self.host}:{self.port}: "
                                            f"{exc.strerror or exc}"))
            return
        self._loop = loop
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()
            self._loop = None

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes,
                              middlewares=[self._errors, self._guard])
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{name}", self._one_model)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.on_response_prepare.append(self._cors_headers)
        return app

    # -- checks ---------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except ApiError as exc:
            return _error_response(exc)
        except web.HTTPException as exc:  # aiohttp's own: unknown path, wrong method, body too big
            if exc.status < 400:
                raise
            where = f"{request.method} {request.path}"
            message = {404: f"{where}: no such endpoint (this server has {ENDPOINTS})",
                       405: f"{where}: method not allowed (this server has {ENDPOINTS})",
                       413: f"request body: larger than the limit of "
                            f"{self.limits.max_body_bytes >> 20} MiB"}.get(exc.status, exc.reason)
            return _error_response(ApiError(exc.status, message))

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if self._check_host and not is_loopback(request.url.host or "localhost"):
            # A page whose name was re-pointed at 127.0.0.1 (DNS rebinding) sends its own Host.
            raise ApiError(403, f"Host {request.host!r}: this server answers only to localhost names")
        origin = request.headers.get("Origin")
        if origin is not None and not self._origin_allowed(origin):
            raise ApiError(403, f"Origin {origin!r}: requests from web pages are refused unless "
                                "that origin is allowed (--cors-origin)")
        if request.method == "OPTIONS" and origin is not None:  # a CORS preflight
            return web.Response(status=204, headers={
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Max-Age": "600"})
        if self._api_key is not None:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8"),
                                                                     self._api_key):
                raise ApiError(401, "missing or wrong API key: send the header "
                                    "'Authorization: Bearer <key>'", code="invalid_api_key")
        return await handler(request)

    def _origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin.rstrip("/") in self.cors_origins

    async def _cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and self._origin_allowed(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"

    def _model(self) -> ServedModel:
        model = self.executor.served_model()
        if model is None:
            raise ApiError(503, "no local model is loaded (or it is still loading): try again "
                                "when it is", code="model_not_loaded")
        return model

    async def _json(self, request: web.Request):
        limit = self.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
        raw = await request.read()  # aiohttp refuses past client_max_size with 413
        try:
            return json.loads(raw)
        except UnicodeDecodeError:
            raise ApiError(400, "request body: not UTF-8 text") from None
        except RecursionError:
            raise ApiError(400, "request body: JSON nested too deeply") from None
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"request body: not valid JSON ({exc.msg} at line {exc.lineno} "
                                f"column {exc.colno})") from None

    # -- endpoints ------------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(models_response(self._model()))

    async def _one_model(self, request: web.Request) -> web.Response:
        model = self._model()
        check_model({"model": request.match_info["name"]}, model)
        return web.json_response(model_object(model))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        model = self._model()
        job = parse_chat_request(await self._json(request), model, self.limits)
        key = self.conversations.key_for(job.messages)

        def run(engine, on_piece, cancel):
            return engine.chat(job.messages, job.params, on_piece=on_piece, cancel=cancel,
                               session_key=key)

        def remember(result: GenerationResult) -> None:
            if result.finish_reason != "cancelled":
                self.conversations.remember(job.messages, result.text, key)

        return await self._answer(request, "chat", job, model, run, key, remember)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        model = self._model()
        job = parse_completion_request(await self._json(request), model, self.limits)

        def run(engine, on_piece, cancel):
            prompt = job.prompt
            if isinstance(prompt, str):
                prompt = [engine.tokenizer.bos_id, *engine.tokenizer.encode(prompt)]
            return engine.complete(prompt, job.params, on_piece=on_piece, cancel=cancel,
                                   session_key=COMPLETIONS_SESSION)

        return await self._answer(request, "completions", job, model, run, COMPLETIONS_SESSION)

    # -- one generation -------------------------------------------------------------------------
    async def _answer(self, request, endpoint, job: ChatJob, model, run, key, on_result=None):
        if self._pending >= self.limits.max_queue:
            raise ApiError(503, f"the server is busy ({self._pending} requests waiting or running): "
                                "try again shortly", code="server_busy")
        cancel = threading.Event()
        relay = _Relay(asyncio.get_running_loop(), cancel)

        def work(engine):
            if engine is None or not hasattr(engine, "complete"):
                raise ModelUnavailable("no local model is loaded: load one, then try again")
            result = run(engine, relay.post if job.stream else None, cancel)
            full = engine.tokenizer.decode(result.token_ids) if result.finish_reason == "stop_string" else ""
            return result, stop_reason(result, job.params, full)

        def done() -> None:  # on the loop, after every piece the job posted
            self._pending -= 1
            relay.end()
            if not future.cancelled() and future.exception() is None:  # finished, even if cut
                result = future.result()[0]
                if on_result is not None:
                    on_result(result)
                if self.on_finished is not None:
                    self.on_finished(Finished(endpoint, result, key))

        future = self.executor.submit(work)
        self._pending += 1
        future.add_done_callback(lambda _: relay.call(done))  # on the engine thread (or here)
        try:
            if job.stream:
                return await self._stream(request, endpoint, job, model, future, relay.events)
            while await relay.events.get() is not _END:
                pass
            result, reason = self._outcome(future)
            return web.json_response(Reply(endpoint, model).whole(result, reason))
        except (asyncio.CancelledError, ConnectionError):
            # The client went away (aiohttp cancels the handler, or a write fails): stop the
            # reply within one token, or drop it before it starts.
            cancel.set()
            future.cancel()
            raise

    @staticmethod
    def _outcome(future: Future):
        try:
            return future.result()
        except BaseException as exc:  # noqa: BLE001 - every failure becomes an OpenAI error
            raise engine_failure(exc) from None

    async def _stream(self, request, endpoint, job: ChatJob, model, future, events):
        first = await events.get()
        if first is _END and future.exception() is not None:
            raise engine_failure(future.exception())  # before any byte: a proper HTTP error
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        reply = Reply(endpoint, model, job.include_usage)
        opening = reply.opening()
        if opening is not None:
            await response.write(_sse(opening))
        item = first
        while item is not _END:
            texts = []
            while item is not None and item is not _END:  # what arrived meanwhile: one chunk
                texts.append(item)
                item = events.get_nowait() if not events.empty() else None
            await response.write(_sse(reply.piece("".join(texts))))
            if item is None:
                item = await events.get()
        try:
            result, reason = self._outcome(future)
        except ApiError as exc:  # after the headers: an error event, as vLLM sends
            await response.write(_sse(exc.body()))
        else:
            await response.write(b"".join(_sse(chunk) for chunk in reply.closing(result, reason)))
        await response.write(_sse("[DONE]"))
        await response.write_eof()
        return response
