"""The OpenAI-compatible HTTP server: aiohttp routes, the safety checks, SSE and disconnects.

aiohttp does the protocol work (HTTP/1.1, keep-alive, chunked event streams, body size limits,
cancelling a handler whose client went away); it runs on its own thread and event loop, so the
CLI and the window start it alike. Every generation is a job for the engine's one owner
(`EngineExecutor`), submitted in arrival order; tokens come back through the event loop.

Safe by default: it binds loopback and refuses any other address unless asked, with an API key;
a browser page can neither read nor drive it (no CORS headers, foreign `Origin` and non-local
`Host` refused) unless origins are allowed; nothing from a request is written to disk or logged
beyond the request line.

Bounded under abuse: the server accepts connections itself (at most `max_connections` open; on
accept() errors such as running out of file handles it backs off and logs a line at most every
few seconds); a connection that sends nothing, or trickles its headers or body, is closed after
`ConnectionLimits`' timeouts; a prompt too long for the context is refused from its size in bytes
before it is tokenized, and large bodies are parsed off the event loop, so other requests flow.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from aiohttp import web

from ..api import EngineError, GenerationResult, SamplingParams
from ..runtime.generate import InvalidLogitsError
from .executor import EngineExecutor, ModelUnavailable
from .openai_api import (
    ApiError,
    ChatJob,
    ConnectionLimits,
    ConversationKeys,
    Reply,
    RequestLimits,
    ServedModel,
    context_exceeded,
    model_not_found,
    model_object,
    models_response,
    parse_chat_request,
    parse_completion_request,
    stop_reason,
    usage_of,
)
from .tools_api import ToolStream, engine_params, read_tool_calls

log = logging.getLogger(__name__)

ENDPOINTS = ("GET /health, GET /v1/models[/NAME], POST /v1/chat/completions, POST /v1/completions "
             "(also without /v1)")
COMPLETIONS_SESSION = ConversationKeys.PREFIX + "completions"  # raw prompts share one KV entry
_END = object()  # the job is done (after its last piece)
STREAM_BATCH_S = 0.02  # streamed text after the first piece reaches the client at most this much later
PARSE_OFF_LOOP_BYTES = 1 << 20  # bodies larger than this are parsed on a worker thread
ACCEPT_BACKOFF_S = (0.05, 2.0)  # after an accept() error: first wait, doubling up to the last
ACCEPT_LOG_EVERY_S = 10.0  # accept() errors are logged at most this often (with a count)
_HEADER_LIST = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(?:\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")
# An absolute file path (POSIX or Windows) in an engine's message: shown as its last part only.
# Quoted (as OSError writes them), a path may hold spaces.
_QUOTED_PATH = re.compile(r"(['\"])(?:[A-Za-z]:)?[\\/](?:[^'\"\n]*[\\/])?([^'\"\\/\n]*)\1")
_FILE_PATH = re.compile(r"(?<![\w.:/\\])(?:[A-Za-z]:)?[\\/](?:[^\s'\"\\/]+[\\/])+([^\s'\"\\/]*)")



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


def without_paths(message: str, known: tuple = ()) -> str:
    """An engine's message with every file path cut to its last part (a client never learns
    where the server keeps its files): the engine's own files first (their folders may hold
    spaces), then anything else shaped like an absolute path."""
    for path in known:
        if path:
            message = message.replace(str(path), os.path.basename(str(path)))
    message = _QUOTED_PATH.sub(lambda m: m.group(1) + m.group(2) + m.group(1), message)
    return _FILE_PATH.sub(lambda m: m.group(1), message)


def engine_failure(exc: BaseException, known_paths: tuple = ()) -> ApiError:
    """An exception from a job as the client should read it."""
    if isinstance(exc, ApiError):
        return exc
    words = without_paths(str(exc), known_paths)
    if isinstance(exc, ModelUnavailable):
        return ApiError(503, words, code="model_not_loaded")
    if isinstance(exc, InvalidLogitsError):
        return ApiError(500, words, code="invalid_logits")
    if isinstance(exc, EngineError):
        return ApiError(400, words)
    if isinstance(exc, MemoryError):
        return ApiError(503, "out of memory while generating: send a shorter prompt", code="out_of_memory")
    log.error("a server job failed", exc_info=exc)
    return ApiError(500, f"the engine failed: {type(exc).__name__}: {words}")


def surely_fits(messages, context_size: int) -> bool:
    """Whether a text-only conversation fits with room for a reply whatever its tokens: a token
    is at least one byte, the format adds at most 3 tokens a message (and BOS), and joins parts
    with 2 bytes. Longer ones are encoded and counted first, for OpenAI's over-context error."""
    tokens = 1
    for m in messages:
        tokens += 3
        for part in m.parts:
            if not isinstance(part, str):
                return False
            tokens += len(part.encode("utf-8", "surrogatepass")) + 2
    return tokens + 1 <= context_size


def choice_params(params: SamplingParams, choice: int) -> SamplingParams:
    """The sampling of one of `n` choices: a given seed is moved by the choice's number, so the
    choices differ and the request stays reproducible."""
    if choice == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + choice)


class _Relay:
    """Carries a job's events from the engine thread to the event loop: text pieces (with their
    choice's index), each choice's end, then the job's end.

    Events cross in batches: the first event of a batch wakes the loop, which takes the batch
    STREAM_BATCH_S later with whatever arrived meanwhile, so a fast engine is not slowed by a
    thread hand-over (and the GIL going back and forth) per token. The reply's first piece
    goes at once (time to first token)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: threading.Event):
        self.events: asyncio.Queue = asyncio.Queue()  # ("text", i, str) / ("end", i, outcome), then _END
        self._loop = loop
        self._cancel = cancel
        self._arrived: list[tuple] = []
        self._lock = threading.Lock()
        self._delay = 0.0

    def call(self, fn, *args) -> None:
        """Run fn on the loop (from any thread); a stopped server cancels the job instead."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._cancel.set()

    def post(self, index: int, piece: str) -> None:  # engine thread
        self._add(("text", index, piece))

    def choice_done(self, index: int, outcome) -> None:  # engine thread
        self._add(("end", index, outcome))

    def _add(self, event: tuple) -> None:
        with self._lock:
            self._arrived.append(event)
            if len(self._arrived) > 1:
                return  # a hand-over is already on its way and will take this event too
        self.call(self._loop.call_later, self._delay, self._hand_over)
        self._delay = STREAM_BATCH_S

    def end(self) -> None:  # on the loop, after the job's last event
        self._hand_over()  # the last batch now, not after its delay
        self.events.put_nowait(_END)

    def _hand_over(self) -> None:  # on the loop: consecutive texts of one choice as one event
        with self._lock:
            arrived, self._arrived = self._arrived, []
        merged: list[tuple] = []
        for event in arrived:
            if merged and event[0] == "text" == merged[-1][0] and event[1] == merged[-1][1]:
                merged[-1] = ("text", event[1], merged[-1][2] + event[2])
            else:
                merged.append(event)
        for event in merged:
            if event[0] != "text" or event[2]:
                self.events.put_nowait(event)


class _RateLimitedLog:
    """One warning per `every_s` for a repeating failure, with how often it happened."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self._last = -float("inf")
        self._count = 0

    def report(self, what: str) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._last >= self.every_s:
            log.warning("%s (%d time%s since the last report; backing off)", what, self._count,
                        "" if self._count == 1 else "s")
            self._last, self._count = now, 0


class _Connection(asyncio.Protocol):
    """One client connection: aiohttp's protocol inside, with the timeouts around it.

    Idle (no request under way, including a fresh connection): closed after idle_timeout_s.
    From a request's first byte until aiohttp hands it to a handler (its headers are in):
    closed after header_timeout_s. While a handler runs nothing times out here (the body has
    its own timeout in the handler; a reply may stream for minutes)."""

    def __init__(self, server: "OpenAIServer", inner):
        self._server = server
        self._inner = inner
        self._timer: asyncio.TimerHandle | None = None
        self._busy = 0  # requests in a handler
        self._reading_headers = False
        self.transport: asyncio.Transport | None = None

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self.transport is not None and not self._busy:
            self.transport.close()

    # asyncio's side
    def connection_made(self, transport) -> None:
        self.transport = transport
        self._server._connection_opened(self)
        self._arm(self._server.connection_limits.idle_timeout_s)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._busy and not self._reading_headers:
            self._reading_headers = True
            self._arm(self._server.connection_limits.header_timeout_s)
        self._inner.data_received(data)

    def eof_received(self):
        return self._inner.eof_received()

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._server._connection_closed(self)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # the handlers' side
    def request_started(self) -> None:
        self._busy += 1
        self._reading_headers = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def request_finished(self) -> None:
        self._busy -= 1
        if not self._busy and self.transport is not None and not self.transport.is_closing():
            self._arm(self._server.connection_limits.idle_timeout_s)


class OpenAIServer:
    """`start()` binds and serves in a background thread; `stop()` ends it (and its replies)."""

    def __init__(self, executor: EngineExecutor, *, host: str = "127.0.0.1", port: int = 8080,
                 api_key: str | None = None, allow_network: bool = False,
                 cors_origins: tuple[str, ...] = (), limits: RequestLimits | None = None,
                 on_finished: Callable[[Finished], None] | None = None,
                 aliases: tuple[str, ...] = (), strict_model: bool = False,
                 connection_limits: ConnectionLimits | None = None):
        check_bind(host, allow_network, api_key)
        self.executor = executor
        self.host = host
        self.port = port
        self.limits = limits or RequestLimits()
        self.connection_limits = connection_limits or ConnectionLimits()
        self.cors_origins = frozenset(_origin_key(o) for o in cors_origins)
        self.aliases = tuple(dict.fromkeys(aliases))
        self.strict_model = strict_model
        self.on_finished = on_finished
        self.conversations = ConversationKeys()
        self._api_key = api_key.encode("utf-8") if api_key else None
        self._check_host = is_loopback(host)
        self._pending = 0  # jobs waiting or running (touched on the loop thread only)
        self._connections: dict[object, _Connection] = {}  # by transport (loop thread only)
        self._room: asyncio.Event | None = None  # set while fewer than max_connections are open
        self._accept_errors = _RateLimitedLog(ACCEPT_LOG_EVERY_S)
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

    def _listen(self) -> socket.socket:
        info = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, address = info[0]
        sock = socket.create_server(address, family=family, backlog=128)
        sock.setblocking(False)
        return sock

    def _serve(self, ready: Future) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        idle = self.connection_limits.idle_timeout_s
        runner = web.AppRunner(self._app(), handler_cancellation=True, shutdown_timeout=1.0,
                               keepalive_timeout=idle)
        try:
            loop.run_until_complete(runner.setup())
            sock = self._listen()
        except OSError as exc:
            loop.run_until_complete(runner.cleanup())
            loop.close()
            ready.set_exception(EngineError(f"cannot serve on {self.host}:{self.port}: "
                                            f"{exc.strerror or exc}"))
            return
        self.port = sock.getsockname()[1]  # the real one when port 0 was asked
        self._room = asyncio.Event()
        self._room.set()
        accepting = loop.create_task(self._accept_loop(sock, runner.server))
        self._loop = loop
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:
            accepting.cancel()
            loop.run_until_complete(asyncio.gather(accepting, return_exceptions=True))
            sock.close()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            self._loop = None

    # -- connections (loop thread) -------------------------------------------------------------
    async def _accept_loop(self, sock: socket.socket, protocol_factory) -> None:
        """accept() with a cap on open connections and a growing pause after errors (out of
        file handles: retrying at once would spin and log without end)."""
        loop = asyncio.get_running_loop()
        pause = ACCEPT_BACKOFF_S[0]
        while True:
            await self._room.wait()
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._accept_errors.report(f"cannot accept connections: {exc.strerror} "
                                               f"({len(self._connections)} open)")
                else:
                    self._accept_errors.report(f"accept() failed: {exc.strerror or exc}")
                await asyncio.sleep(pause)
                pause = min(pause * 2, ACCEPT_BACKOFF_S[1])
                continue
            pause = ACCEPT_BACKOFF_S[0]
            try:
                await loop.connect_accepted_socket(lambda: _Connection(self, protocol_factory()), conn)
            except OSError as exc:
                conn.close()
                self._accept_errors.report(f"cannot set up a connection: {exc.strerror or exc}")

    def _connection_opened(self, conn: _Connection) -> None:
        self._connections[conn.transport] = conn
        if len(self._connections) >= self.connection_limits.max_connections:
            self._room.clear()

    def _connection_closed(self, conn: _Connection) -> None:
        self._connections.pop(conn.transport, None)
        if len(self._connections) < self.connection_limits.max_connections:
            self._room.set()

    # -- routes --------------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes,
                              middlewares=[self._track, self._errors, self._guard])
        for prefix in ("/v1", ""):  # clients given the base URL without /v1 too
            app.router.add_get(f"{prefix}/health", self._health)
            app.router.add_get(f"{prefix}/models", self._models)
            app.router.add_get(f"{prefix}/models/{{name}}", self._one_model)
            app.router.add_post(f"{prefix}/chat/completions", self._chat)
            app.router.add_post(f"{prefix}/completions", self._completions)
        app.on_response_prepare.append(self._cors_headers)
        return app

    # -- checks ---------------------------------------------------------------------------------
    @web.middleware
    async def _track(self, request: web.Request, handler):
        """Tells the connection a request is under way (no idle or header timeout meanwhile)."""
        conn = self._connections.get(request.transport)
        if conn is None:
            return await handler(request)
        conn.request_started()
        try:
            return await handler(request)
        finally:
            conn.request_finished()

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except ApiError as exc:
            response = _error_response(exc)
            if exc.status == 408:
                response.force_close()  # the rest of the body may still be on its way
            return response
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
                "Access-Control-Allow-Headers": _allowed_headers(request),
                "Access-Control-Max-Age": "600",
                "Vary": "Origin, Access-Control-Request-Headers"})
        if self._api_key is not None and request.match_info.handler != self._health:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8"),
                                                                     self._api_key):
                raise ApiError(401, "missing or wrong API key: send the header "
                                    "'Authorization: Bearer <key>'", code="invalid_api_key")
        return await handler(request)

    def _origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or _origin_key(origin) in self.cors_origins

    async def _cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and self._origin_allowed(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            if "Vary" not in response.headers:
                response.headers["Vary"] = "Origin"

    def _model(self) -> ServedModel:
        model = self.executor.served_model()
        if model is None:
            raise ApiError(503, "no local model is loaded (or it is still loading): try again "
                                "when it is", code="model_not_loaded")
        return dataclasses.replace(model, aliases=self.aliases, strict=self.strict_model)

    async def _json(self, request: web.Request):
        limit = self.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
        timeout = self.connection_limits.body_timeout_s
        try:
            raw = await asyncio.wait_for(request.read(), timeout)  # aiohttp refuses past client_max_size with 413
        except asyncio.TimeoutError:
            raise ApiError(408, f"request body: not received within {timeout:g} s") from None
        if len(raw) > PARSE_OFF_LOOP_BYTES:  # tens of MB take a while: other requests go on meanwhile
            return await asyncio.get_running_loop().run_in_executor(None, _parse_json, raw)
        return _parse_json(raw)

    # -- endpoints ------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        """llama-server's shape: 200 {"status": "ok"} once a model is loaded, 503 before."""
        if self.executor.served_model() is None:
            return web.json_response({"error": {"code": 503, "message": "Loading model",
                                                "type": "unavailable_error"}}, status=503,
                                     headers={"Retry-After": "1"})
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(models_response(self._model()))

    async def _one_model(self, request: web.Request) -> web.Response:
        model = self._model()
        name = request.match_info["name"]
        if name not in model.ids:
            raise model_not_found(name, model)
        return web.json_response(model_object(model, name))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        model = self._model()
        job = parse_chat_request(await self._json(request), model, self.limits)
        key = self.conversations.key_for(job.messages)

        tools = getattr(job, "tools", None)
        extra = {"tools": tools} if tools else {}

        def prepare(engine):
            if not job.continue_final and not tools and surely_fits(job.messages, model.context_size):
                return [None]  # the engine encodes it (once)
            prompt = engine.encode(job.messages, **extra)
            if job.continue_final and prompt.ids and prompt.ids[-1] == engine.tokenizer.eos_id:
                # mistral-common's prefix=True: the last assistant message without its </s>
                prompt.ids.pop()
            if len(prompt.ids) + 1 > model.context_size:  # counted here: OpenAI's error code
                raise context_exceeded("messages", len(prompt.ids), model)
            return [prompt]

        def run(engine, prompt, params, on_piece, cancel):
            if job.tool_request is not None:  # a grammar, tool calls read back, logprobs
                params = engine_params(engine.tokenizer, job.tool_request, params)
                result = reply(engine, prompt, params, on_piece, cancel)
                return read_tool_calls(engine.tokenizer, job.tool_request, result)
            return reply(engine, prompt, params, on_piece, cancel)

        def reply(engine, prompt, params, on_piece, cancel):
            generate_from = getattr(engine, "generate_from", None)
            if prompt is not None and generate_from is not None:  # as encoded above: not twice
                return generate_from(prompt, params, on_piece, cancel, session_key=key)
            if not job.continue_final:  # (an engine without generate_from encodes again)
                return engine.chat(job.messages, params, on_piece=on_piece, cancel=cancel,
                                   session_key=key, **extra)
            if prompt.image_spans:
                raise ApiError(400, "messages: continuing an assistant message after images is not "
                                    "supported by this engine", "messages")
            return engine.complete(prompt.ids, params, on_piece=on_piece, cancel=cancel, session_key=key)

        def remember(result: GenerationResult) -> None:
            if result.finish_reason == "cancelled":
                return
            if job.continue_final:  # the conversation now ends with the whole assistant message
                head = job.messages[-1]
                prefix = "".join(p for p in head.parts if isinstance(p, str))
                self.conversations.remember(job.messages[:-1], prefix + result.text, key)
            else:
                self.conversations.remember(job.messages, result.text, key)

        return await self._answer(request, "chat", job, model, prepare, run, key, remember)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        model = self._model()
        job = parse_completion_request(await self._json(request), model, self.limits)

        def prepare(engine):
            prompts = []
            for i, prompt in enumerate(job.prompts):
                if isinstance(prompt, str):
                    prompt = [engine.tokenizer.bos_id, *engine.tokenizer.encode(prompt)]
                if len(prompt) + 1 > model.context_size:
                    raise context_exceeded("prompt" if len(job.prompts) == 1 else f"prompt[{i}]",
                                           len(prompt), model)
                prompts.append(prompt)
            return prompts

        def run(engine, prompt, params, on_piece, cancel):
            return engine.complete(prompt, params, on_piece=on_piece, cancel=cancel,
                                   session_key=COMPLETIONS_SESSION)

        return await self._answer(request, "completions", job, model, prepare, run, COMPLETIONS_SESSION)

    # -- one answer -----------------------------------------------------------------------------
    async def _answer(self, request, endpoint, job: ChatJob, model, prepare, run, key, on_result=None):
        """Every choice of every prompt in one engine job: choice i of prompt p is number
        p * n + i. The choices of a prompt share its KV: on a batching engine they run at once
        (its prompt read once, then rows of the same steps), else one after another in one
        session (after the first, each prefills only the prompt's last token)."""
        if self._pending >= self.limits.max_queue:
            raise ApiError(503, f"the server is busy ({self._pending} requests waiting or running): "
                                "try again shortly", code="server_busy")
        cancel = threading.Event()
        relay = _Relay(asyncio.get_running_loop(), cancel)

        def work(engine):
            if engine is None or not hasattr(engine, "complete"):
                raise ModelUnavailable("no local model is loaded: load one, then try again")
            try:
                return generate_all(engine)
            except BaseException as exc:  # in words, without the engine's file paths
                raise engine_failure(exc, (getattr(engine, "model_path", None),
                                           getattr(engine, "mmproj_path", None))) from None

        def choice(engine, i: int, p: int, prompt):
            index = p * job.n + i
            on_piece = (lambda text: relay.post(index, text)) if job.stream else None
            params = choice_params(job.params, i)
            result = run(engine, prompt, params, on_piece, cancel)
            full = engine.tokenizer.decode(result.token_ids) if result.finish_reason == "stop_string" else ""
            outcome = (result, stop_reason(result, params, full))
            if job.stream:
                relay.choice_done(index, outcome)
            return outcome

        def generate_all(engine):
            outcomes = []
            # a batching engine decodes a prompt's choices as rows of the same steps
            together = getattr(engine, "run_together", None) if job.n > 1 else None
            for p, prompt in enumerate(prepare(engine)):  # every prompt checked before any reply
                if cancel.is_set():
                    return outcomes
                if together is not None:
                    outcomes += together(functools.partial(choice, p=p, prompt=prompt), job.n)
                    continue
                for i in range(job.n):
                    if cancel.is_set():
                        return outcomes
                    outcomes.append(choice(engine, i, p, prompt))
            return outcomes

        def done() -> None:  # on the loop, after every event the job posted
            self._pending -= 1
            relay.end()
            if not future.cancelled() and future.exception() is None:  # finished, even if cut
                for n, (result, _) in enumerate(future.result()):
                    if on_result is not None and n == 0:
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
            outcomes = self._outcome(future)
            reply = Reply(endpoint, model)
            bodies = [reply.whole(*outcome) for outcome in outcomes]
            body = bodies[0]
            body["choices"] = [dict(b["choices"][0], index=index) for index, b in enumerate(bodies)]
            body["usage"] = usage_of([result for result, _ in outcomes], job.n)
            return web.json_response(body)
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
            await response.write(b"".join(_sse(_indexed(opening, i))
                                          for i in range(len(job.prompts or [None]) * job.n)))
        results: list[GenerationResult] = []
        usage_chunks: list[dict] = []
        tool_mode = job.tool_request is not None and job.tool_request.calls_tools
        tool_streams: dict[int, ToolStream] = {}  # per choice: content live, calls once whole
        item = first
        while item is not _END:
            out = []
            while item is not None and item is not _END:  # what arrived meanwhile: one write
                if item[0] == "text" and tool_mode:
                    stream = tool_streams.setdefault(item[1], ToolStream())
                    out += [_indexed(_delta(reply.piece(""), d), item[1]) for d in stream.feed(item[2])]
                elif item[0] == "text":
                    out.append(_indexed(reply.piece(item[2]), item[1]))
                else:
                    result, reason = item[2]
                    results.append(result)
                    if tool_mode:
                        stream = tool_streams.setdefault(item[1], ToolStream())
                        out += [_indexed(_delta(reply.piece(""), d), item[1]) for d in stream.finish(result)]
                    finish, *usage_chunks = reply.closing(result, reason)
                    out.append(_indexed(finish, item[1]))
                item = events.get_nowait() if not events.empty() else None
            if out:
                await response.write(b"".join(_sse(chunk) for chunk in out))
            if item is None:
                item = await events.get()
        try:
            self._outcome(future)
        except ApiError as exc:  # after the headers: an error event, as vLLM sends
            await response.write(_sse(exc.body()))
        else:
            if usage_chunks:  # the usage of every choice, after the last one
                usage_chunks[-1]["usage"] = usage_of(results, job.n)
                await response.write(b"".join(_sse(chunk) for chunk in usage_chunks))
        await response.write(_sse("[DONE]"))
        await response.write_eof()
        return response


def _delta(chunk: dict, delta: dict) -> dict:
    chunk["choices"][0]["delta"] = delta
    return chunk


def _indexed(chunk: dict, index: int) -> dict:
    for choice in chunk.get("choices", ()):
        choice["index"] = index
    return chunk


def _parse_json(raw: bytes):
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise ApiError(400, "request body: not UTF-8 text") from None
    except RecursionError:
        raise ApiError(400, "request body: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"request body: not valid JSON ({exc.msg} at line {exc.lineno} "
                            f"column {exc.colno})") from None


def _origin_key(origin: str) -> str:
    """Origins compare without case (scheme and host are case-insensitive; a port is digits)
    and without a trailing slash."""
    return origin.strip().rstrip("/").lower()


def _allowed_headers(request: web.Request) -> str:
    """A preflight's answer: the headers the page asked for (the OpenAI JS SDK sends its
    x-stainless-* headers), when they are a well-formed list of names."""
    asked = request.headers.get("Access-Control-Request-Headers", "").strip()
    if asked and len(asked) <= 4096 and _HEADER_LIST.fullmatch(asked):
        return asked
    return "Authorization, Content-Type"
