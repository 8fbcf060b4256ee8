"""Tools from MCP servers (Model Context Protocol), for the chat's tool loop.

A server is a command started over stdio (`uvx mcp-server-time`, `npx ...`) or a streamable HTTP
URL. `McpTools` keeps one connection per server open (a stdio server is started once, not per
call) on one background thread running an asyncio loop: the official `mcp` SDK is async, its
connections are long-lived tasks, and the engine worker that runs the tool loop is a plain
thread that must not block on more than the call it makes. Every call is bounded by the
server's timeout; a server that crashes, hangs or answers garbage gives a `ToolOutcome` with
`error` set (the chat goes on), and its connection is restarted on the next call.
"""
from __future__ import annotations

import asyncio
import json
import re
import shlex
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from .api import EngineError

DEFAULT_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 20.0
MAX_RESULT_CHARS = 32_000  # what goes back to the model: a page of text, not a dump
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")


class McpError(EngineError):
    """A tool server could not be reached or listed (names the server and the reason)."""


@dataclass(frozen=True)
class McpServerConfig:
    """One tool server as Settings → Tools stores it."""

    name: str
    command: str = ""  # stdio: a command line (split like a shell would, never run through one)
    url: str = ""  # streamable HTTP
    env: dict[str, str] = field(default_factory=dict)
    enabled: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    disabled_tools: tuple[str, ...] = ()

    def __post_init__(self):
        if bool(self.command.strip()) == bool(self.url.strip()):
            raise McpError(f"tool server {self.name!r}: give either a command or a URL")
        if self.url and not re.match(r"https?://", self.url):
            raise McpError(f"tool server {self.name!r}: {self.url!r} is not an http(s) URL")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "command": self.command, "url": self.url, "env": dict(self.env),
                "enabled": self.enabled, "timeout_s": self.timeout_s, "disabled_tools": list(self.disabled_tools)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> McpServerConfig:
        return cls(name=str(data["name"]), command=str(data.get("command", "")), url=str(data.get("url", "")),
                   env={str(k): str(v) for k, v in dict(data.get("env") or {}).items()},
                   enabled=bool(data.get("enabled", True)),
                   timeout_s=float(data.get("timeout_s", DEFAULT_TIMEOUT_S)),
                   disabled_tools=tuple(str(t) for t in data.get("disabled_tools") or ()))


@dataclass(frozen=True)
class McpTool:
    """A tool as the model sees it (`name`, unique across servers) and where it lives."""

    name: str
    server: str
    remote_name: str
    description: str
    parameters: dict[str, Any]

    def openai_tool(self) -> dict[str, Any]:
        """The OpenAI `tools` entry the chat format renders into [AVAILABLE_TOOLS]."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolOutcome:
    """What a call gave: `text` goes back to the model; `error` (when set) is shown on the card
    and sent to the model as the tool's result, so it can say what went wrong."""

    text: str
    elapsed_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def model_tool_name(server: str, tool: str, taken: set[str]) -> str:
    """The name the model calls a tool by: its own name when free, else `server_tool`; only the
    characters OpenAI's function names allow, at most 64."""
    base = _NAME_OK.sub("_", tool)[:64] or "tool"
    name = base
    if name in taken:
        name = _NAME_OK.sub("_", f"{server}_{tool}")[:64]
    n = 2
    while name in taken:
        suffix = f"_{n}"
        name = _NAME_OK.sub("_", f"{server}_{tool}")[:64 - len(suffix)] + suffix
        n += 1
    return name


def result_text(result) -> str:
    """A CallToolResult as text for the model: text blocks as they are, structured content as
    JSON, other blocks (images, resources) named by their kind."""
    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        else:
            parts.append(f"[{kind or 'content'} omitted]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[... cut: {len(text) - MAX_RESULT_CHARS} more characters]"
    return text


def _retrieve_when_done(future: asyncio.Future) -> None:
    """Mark the future's exception as seen once it is set, whoever waits for it, or no one."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


class _Connection:
    """One open session with one server, owned by a task on the MCP loop (the SDK's contexts
    must be entered and left in the same task). Requests arrive through a queue."""

    def __init__(self, config: McpServerConfig):
        self.config = config
        self.requests: asyncio.Queue = asyncio.Queue()
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        _retrieve_when_done(self.ready)  # seen by whoever waits, or no one
        self.task = asyncio.create_task(self._run())

    def _target(self):
        if self.config.url:
            return self.config.url
        from mcp.client.stdio import StdioServerParameters

        argv = shlex.split(self.config.command)
        return StdioServerParameters(command=argv[0], args=argv[1:], env=dict(self.config.env) or None)

    async def _run(self) -> None:
        from mcp import Client

        try:
            async with Client(self._target(), read_timeout_seconds=self.config.timeout_s) as client:
                if not self.ready.done():
                    self.ready.set_result(None)
                while True:
                    job, reply = await self.requests.get()
                    if job is None:
                        return
                    try:
                        reply.set_result(await job(client))
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        if not reply.done():
                            reply.set_exception(exc)
                        if not isinstance(exc, Exception):
                            raise
        except BaseException as exc:  # noqa: BLE001 - the connection is gone: say why to waiters
            if not self.ready.done():
                self.ready.set_exception(exc if isinstance(exc, Exception) else McpError("cancelled"))
            while not self.requests.empty():
                _job, reply = self.requests.get_nowait()
                if reply is not None and not reply.done():
                    reply.set_exception(McpError(f"tool server {self.config.name!r} closed the connection"))
            if not isinstance(exc, Exception):
                raise

    async def submit(self, job):
        await asyncio.wait_for(asyncio.shield(self.ready), CONNECT_TIMEOUT_S)
        if self.task.done():
            raise McpError(f"tool server {self.config.name!r} is not running")
        reply = asyncio.get_running_loop().create_future()
        # a caller that timed out has gone; the server's late error must not be left for the
        # garbage collector to log (in 3.11 that logging can break an ast.parse under way)
        _retrieve_when_done(reply)
        await self.requests.put((job, reply))
        done, _ = await asyncio.wait({reply, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if reply in done:
            return reply.result()
        raise McpError(f"tool server {self.config.name!r} stopped while answering")

    async def close(self) -> None:
        if not self.task.done():
            await self.requests.put((None, None))
            try:
                await asyncio.wait_for(self.task, 10)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing anyway
                self.task.cancel()


def _describe(exc: BaseException) -> str:
    """An exception (or the first of a group) as a short sentence for a card."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


class McpTools:
    """The tool servers of the app: list their tools, call one; thread-safe, blocking calls."""

    def __init__(self, configs: list[McpServerConfig] = ()):
        self._configs = {c.name: c for c in configs}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-tools", daemon=True)
        self._thread.start()
        self._connections: dict[str, _Connection] = {}
        self._tools: dict[str, McpTool] = {}

    # -- configuration
    @property
    def configs(self) -> list[McpServerConfig]:
        return list(self._configs.values())

    def set_configs(self, configs: list[McpServerConfig]) -> None:
        """Replace the servers; connections of changed or removed ones are closed."""
        new = {c.name: c for c in configs}
        with self._lock:
            for name, old in list(self._configs.items()):
                if new.get(name) != old:
                    self._run(self._drop(name), 15)
            self._configs = new
            self._tools = {k: t for k, t in self._tools.items() if t.server in new}

    # -- the loop thread
    def _run(self, coro, timeout: float):
        future: Future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise

    async def _connection(self, name: str) -> _Connection:
        conn = self._connections.get(name)
        if conn is None or conn.task.done():
            conn = self._connections[name] = _Connection(self._configs[name])
        return conn

    async def _drop(self, name: str, hard: bool = False) -> None:
        conn = self._connections.pop(name, None)
        if conn is None:
            return
        if hard:  # hung or broken: no polite goodbye (the SDK still stops the process tree)
            conn.task.cancel()
            await asyncio.wait({conn.task}, timeout=10)
        else:
            await conn.close()

    async def _request(self, name: str, job, timeout: float):
        conn = await self._connection(name)
        try:
            # starting a server has its own bound; `timeout` is for the answer
            await asyncio.wait_for(asyncio.shield(conn.ready), CONNECT_TIMEOUT_S)
            return await asyncio.wait_for(conn.submit(job), timeout)
        except BaseException:
            await self._drop(name, hard=True)  # a hung or broken server starts afresh next time
            raise

    # -- listing
    def list_server_tools(self, name: str) -> list[McpTool]:
        """Every tool of one server (disabled ones included), named as the model will see them
        among the tools already known. Raises McpError naming the server and the reason."""
        config = self._configs.get(name)
        if config is None:
            raise McpError(f"no tool server named {name!r}")

        async def job(client):
            listed, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
                listed += page.tools
                cursor = getattr(page, "next_cursor", None)
                if not cursor:
                    return listed

        try:
            listed = self._run(self._request(name, job, config.timeout_s), config.timeout_s + CONNECT_TIMEOUT_S + 15)
        except (asyncio.TimeoutError, FutureTimeout):
            raise McpError(f"tool server {name!r} did not answer within {config.timeout_s:g} s") from None
        except Exception as exc:  # noqa: BLE001 - the SDK raises many kinds: one message
            raise McpError(f"tool server {name!r}: {_describe(exc)}") from exc
        with self._lock:
            for key in [k for k, t in self._tools.items() if t.server == name]:
                del self._tools[key]
            taken = set(self._tools)
            tools = []
            for t in listed:
                schema = t.input_schema if isinstance(t.input_schema, dict) else {"type": "object"}
                tool = McpTool(model_tool_name(name, t.name, taken), name, t.name,
                               (t.description or "").strip(), schema)
                taken.add(tool.name)
                self._tools[tool.name] = tool
                tools.append(tool)
        return tools

    def enabled_tools(self) -> list[McpTool]:
        """Tools of enabled servers, minus the ones switched off, as last listed."""
        with self._lock:
            return [t for t in self._tools.values()
                    if self._configs[t.server].enabled and t.remote_name not in self._configs[t.server].disabled_tools]

    def tool(self, model_name: str) -> McpTool | None:
        with self._lock:
            return self._tools.get(model_name)

    # -- calling
    def call(self, model_name: str, arguments: dict[str, Any] | str | None) -> ToolOutcome:
        """Run one tool call as the model wrote it; never raises for the server's failures."""
        start = time.monotonic()

        def failed(message: str) -> ToolOutcome:
            return ToolOutcome(f"Error: {message}", time.monotonic() - start, message)

        tool = self.tool(model_name)
        if tool is None:
            return failed(f"no tool named {model_name!r} is available")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                return failed(f"the arguments are not JSON ({exc})")
        if arguments is not None and not isinstance(arguments, dict):
            return failed("the arguments must be a JSON object")
        config = self._configs[tool.server]

        async def job(client):
            return await client.call_tool(tool.remote_name, arguments or {})

        try:
            result = self._run(self._request(tool.server, job, config.timeout_s),
                               config.timeout_s + CONNECT_TIMEOUT_S + 15)
        except (asyncio.TimeoutError, FutureTimeout):
            return failed(f"{tool.server} did not answer within {config.timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - crash, garbage, refused: one card
            return failed(f"{tool.server}: {_describe(exc)}")
        text = result_text(result)
        if getattr(result, "is_error", False):
            return ToolOutcome(text or "Error", time.monotonic() - start, text or "the tool reported an error")
        return ToolOutcome(text, time.monotonic() - start)

    def close(self) -> None:
        """Stop every server and the loop thread."""
        if not self._thread.is_alive():
            return
        try:
            for name in list(self._connections):
                self._run(self._drop(name), 15)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self._loop.close()
