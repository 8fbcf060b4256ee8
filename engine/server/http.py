"""The server's transport: aiohttp on its own thread and event loop, the connections, the
middlewares (security, errors), and the API modules' routes.

aiohttp does the protocol work (HTTP/1.1, keep-alive, chunked streams, body size limits,
cancelling a handler whose client went away); the CLI and the window start the server alike.
Each API is a thin module over the one request model (`tasks`): OpenAI's (`openai_routes`),
Anthropic's Messages API (`anthropic_api`), Ollama's (`ollama_api`) and OpenAI's Responses API
(`responses_api`); each writes its own error shape. Who may call is `security`'s.

Bounded under abuse: the server accepts connections itself (at most `max_connections` open; on
accept() errors such as running out of file handles it backs off and logs a line at most every
few seconds); a connection that sends nothing, or trickles its headers or body, is closed after
`ConnectionLimits`' timeouts; a prompt too long for the context is refused from its size in bytes
before it is tokenized, and large bodies are parsed off the event loop, so other requests flow.
Nothing from a request is written to disk or logged beyond the request line.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from aiohttp import web

from ..api import EngineError
from .anthropic_api import AnthropicRoutes
from .errors import ApiError
from .executor import EngineExecutor
from .ollama_api import OllamaRoutes
from .openai_api import ConnectionLimits, RequestLimits, ServedModel
from .openai_routes import OpenAIRoutes
from .responses_api import ResponsesRoutes
from .security import Guard, check_bind, is_loopback  # noqa: F401 - check_bind, is_loopback: the callers' import
from .urls import API_FAMILIES, FAMILY_NAMES, client_urls  # noqa: F401 - FAMILY_NAMES: the CLI's import
from .tasks import Finished, Tasks  # noqa: F401 - Finished: on_finished's argument

log = logging.getLogger(__name__)

ENDPOINTS = ("GET /health, GET /v1/models[/NAME], POST /v1/chat/completions, POST /v1/completions "
             "(also without /v1), POST /v1/messages[/count_tokens], POST /v1/responses, GET /v1/responses/ID, "
             "POST /tokenize, POST /detokenize, Ollama's /api/chat, /api/generate, /api/tags, /api/show, /api/ps, "
             "/api/version")
PARSE_OFF_LOOP_BYTES = 1 << 20  # bodies larger than this are parsed on a worker thread
ACCEPT_BACKOFF_S = (0.05, 2.0)  # after an accept() error: first wait, doubling up to the last
ACCEPT_LOG_EVERY_S = 10.0  # accept() errors are logged at most this often (with a count)


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

    A fresh connection, and a request from its first byte until aiohttp hands it to a handler
    (its headers are in): closed after header_timeout_s (nginx's client_header_timeout: a
    client that connects and sends nothing holds a connection no longer than one that trickles
    its headers). Kept alive between requests: closed after idle_timeout_s. While a handler runs nothing times out here (the body has
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
        self._reading_headers = True  # the first request's headers are awaited from now on
        self._arm(self._server.connection_limits.header_timeout_s)
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
                 connection_limits: ConnectionLimits | None = None, ollama_port: int | None = None,
                 speculation: tuple[str, int] | None = None, apis: tuple[str, ...] = API_FAMILIES):
        check_bind(host, allow_network, api_key)
        unknown = [a for a in apis if a not in API_FAMILIES]
        if unknown or not apis:
            raise EngineError(f"APIs to serve: {', '.join(unknown) or 'none given'}; choose among "
                              f"{', '.join(API_FAMILIES)}")
        self.executor = executor
        self.families = tuple(a for a in API_FAMILIES if a in apis)
        self.host = host
        self.port = port
        self.ollama_port = ollama_port  # a second port (Ollama's 11434) serving the same APIs
        self.limits = limits or RequestLimits()
        self.connection_limits = connection_limits or ConnectionLimits()
        self.guard = Guard(host, api_key, cors_origins)
        self.aliases = tuple(dict.fromkeys(aliases))
        self.strict_model = strict_model
        self.tasks = Tasks(executor, self.limits, on_finished, speculation)  # (mode, drafted tokens a step)
        self.apis = (AnthropicRoutes(self), OllamaRoutes(self), ResponsesRoutes(self), OpenAIRoutes(self))
        self._public: set = set()  # handlers answered without the API key
        self._off_paths: dict[str, str] = {}  # the paths of the families not served: their family
        self._connections: dict[object, _Connection] = {}  # by transport (loop thread only)
        self._room: asyncio.Event | None = None  # set while fewer than max_connections are open
        self._accept_errors = _RateLimitedLog(ACCEPT_LOG_EVERY_S)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def client_urls(self) -> dict[str, str]:
        """What to paste into each family's clients, per family served: OpenAI's base URL (with
        /v1), Anthropic's (the SDK's base_url, Claude Code's ANTHROPIC_BASE_URL: no /v1) and
        Ollama's (OLLAMA_HOST: its own port when it has one)."""
        return client_urls(self.host, self.port, self.families, self.ollama_port)

    def __repr__(self) -> str:  # never the key
        return f"OpenAIServer({self.url!r}, api_key={'<hidden>' if self.guard.has_key else None})"

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

    def _listen(self, port: int) -> socket.socket:
        info = socket.getaddrinfo(self.host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
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
        socks: list[socket.socket] = []
        try:
            loop.run_until_complete(runner.setup())
            for port in (self.port, self.ollama_port):
                if port is not None:
                    socks.append(self._listen(port))
        except OSError as exc:
            for sock in socks:
                sock.close()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            port = self.port if not socks else self.ollama_port
            ready.set_exception(EngineError(f"cannot serve on {self.host}:{port}: {exc.strerror or exc}"))
            return
        self.port = socks[0].getsockname()[1]  # the real one when port 0 was asked
        if self.ollama_port is not None:
            self.ollama_port = socks[1].getsockname()[1]
        self._room = asyncio.Event()
        self._room.set()
        accepting = [loop.create_task(self._accept_loop(sock, runner.server)) for sock in socks]
        self._loop = loop
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:
            for task in accepting:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*accepting, return_exceptions=True))
            for sock in socks:
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
        for api in self.apis:
            served = api.family in self.families
            for method, path, handler in api.routes():
                if not served and handler.__name__ not in getattr(api, "always", ()):
                    self._off_paths[path] = api.family  # a family left out: 404 in words (_errors)
                    continue
                app.router.add_route(method, path, handler)
                if handler.__name__ in api.public:
                    self._public.add(handler)
        app.on_response_prepare.append(self._cors_headers)
        return app

    def _api_of(self, request: web.Request):
        """The API whose error shape a request gets: the first that claims its path."""
        return next(api for api in self.apis if request.path.startswith(api.prefixes))

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
            response = self._api_of(request).error_response(exc)
            if exc.status == 408:
                response.force_close()  # the rest of the body may still be on its way
            return response
        except web.HTTPException as exc:  # aiohttp's own: unknown path, wrong method, body too big
            if exc.status < 400:
                raise
            where = f"{request.method} {request.path}"
            off = self._off_paths.get(request.path)
            if exc.status in (404, 405) and off is not None:
                return self._api_of(request).error_response(ApiError(404, f"{where}: {FAMILY_NAMES[off]} API is "
                                                                          "not served here (turned off)"))
            message = {404: f"{where}: no such endpoint (this server has {ENDPOINTS})",
                       405: f"{where}: method not allowed (this server has {ENDPOINTS})",
                       413: f"request body: larger than the limit of "
                            f"{self.limits.max_body_bytes >> 20} MiB"}.get(exc.status, exc.reason)
            return self._api_of(request).error_response(ApiError(exc.status, message))

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        preflight = self.guard.check(request, needs_key=request.match_info.handler not in self._public)
        if preflight is not None:
            return preflight
        return await handler(request)

    async def _cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        self.guard.cors_headers(request, response)

    # -- what the API modules share -------------------------------------------------------------
    def model(self) -> ServedModel:
        """The loaded model as the APIs describe it; 503 while none is."""
        model = self.executor.served_model()
        if model is None:
            raise ApiError(503, "no local model is loaded (or it is still loading): try again "
                                "when it is", code="model_not_loaded")
        return dataclasses.replace(model, aliases=self.aliases, strict=self.strict_model)

    async def read_json(self, request: web.Request):
        """The request's JSON body, within the size and time limits."""
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
