"""Tools through MCP in the window: the tool servers of Settings → Tools, a chat's tools switch,
and the tool loop the engine worker runs.

`ToolBroker` lives on the UI thread (the window owns it). The engine worker calls
`run_chat(...)` in place of `engine.chat(...)` (worker.py): when the chat has tools on and the
engine is local, each reply may be tool calls. Every call becomes a `tool` message (its card,
schema v5) that first waits for the user's answer (Allow once / Always for this chat / Deny):
the worker blocks in `ask()` on a threading.Event the UI sets through `answer()`, and Stop (the
reply's cancel Event) ends the wait. Results go back to the model until it answers in text, at
most `max_steps` rounds of calls; then it is asked once more without tools, and the last card
says so. Tool calls themselves block on the worker, bounded by each server's timeout
(engine/mcp_tools.py never raises for a server's failures: an error becomes the card's error).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from PySide6.QtCore import QObject, Signal

from ..engine.api import ChatMessage, GenerationResult, ToolSpec

if TYPE_CHECKING:  # imported when first used: asyncio and the SDK stay out of the window's start
    from ..engine.mcp_tools import McpServerConfig, McpTools

log = logging.getLogger(__name__)

SERVERS_KEY = "tools.mcp_servers"
MAX_STEPS = 8  # rounds of tool calls in one reply
ANSWER_POLL_S = 0.05  # how often a waiting card looks at Stop

ALLOW_ONCE, ALWAYS, DENY, STOP = "once", "always", "deny", "stop"
DENIED = "The user denied this tool call."
STOPPED = "The user stopped the reply before this tool call ran."
REMOTE_TIP = ("Tools run with the local model only: a server's model is not given this "
              "app's tools.")


def cap_note(steps: int) -> str:
    return f"Step limit reached ({steps} rounds of tool calls): the model was asked to answer without tools."


# ----------------------------------------------------------------------------- settings

def load_servers(store) -> list[McpServerConfig]:
    """The tool servers of Settings → Tools; an unreadable entry is skipped (logged)."""
    from ..engine.mcp_tools import McpError, McpServerConfig

    try:
        raw = store.get_setting(SERVERS_KEY, [])
    except Exception:  # noqa: BLE001 - a damaged value: no servers rather than no window
        log.exception("reading the tool servers failed")
        return []
    configs = []
    for entry in raw if isinstance(raw, list) else []:
        try:
            configs.append(McpServerConfig.from_json(entry))
        except (McpError, KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("tool server setting skipped: %s", exc)
    return configs


def save_servers(store, configs: list[McpServerConfig]) -> None:
    store.set_setting(SERVERS_KEY, [c.to_json() for c in configs])


def chat_tools_on(store, chat_id: int | None) -> bool:
    if chat_id is None:
        return False
    return store.get_chat_info(chat_id).settings.get("tools") is True


def set_chat_tools(store, chat_id: int, on: bool) -> None:
    settings = dict(store.get_chat_info(chat_id).settings)
    settings["tools"] = bool(on)
    store.update_chat(chat_id, settings=settings)


def always_allowed(store, chat_id: int) -> set[str]:
    value = store.get_chat_info(chat_id).settings.get("tools_always") or []
    return {str(v) for v in value} if isinstance(value, list) else set()


def allow_always(store, chat_id: int, tool_name: str) -> None:
    settings = dict(store.get_chat_info(chat_id).settings)
    settings["tools_always"] = sorted(always_allowed(store, chat_id) | {tool_name})
    store.update_chat(chat_id, settings=settings)


def uses_tools(engine) -> bool:
    """Tools need the local engine (its tokenizer writes and reads the calls)."""
    return engine.writes_tool_calls


def text_before_calls(on_piece: Callable[[str], None]) -> Callable[[str], None]:
    """`on_piece` for a reply that may be tool calls: the text before [TOOL_CALLS] streams as
    usual; the calls themselves are not shown as text (their cards show them). What could be
    the start of the marker waits for the next piece (the saved reply has all its text): the
    marker is held back as a stop string is."""
    from ..engine.runtime.generate import StopStringFilter
    from ..engine.server.tools_api import MARKER

    marker = StopStringFilter(MARKER)

    def piece(text: str) -> None:
        shown = marker.feed(text)
        if shown:
            on_piece(shown)

    return piece


# ----------------------------------------------------------------------------- the broker

class ToolBroker(QObject):
    """The app's tool servers and the cards waiting for an answer."""

    cardChanged = Signal(object)  # chat id: a card was added, is waiting, or has its result
    serverFailed = Signal(str)  # a tool server that could not be listed for a reply, in words

    def __init__(self, store, parent: QObject | None = None, *, max_steps: int = MAX_STEPS,
                 mcp: McpTools | None = None):
        super().__init__(parent)
        self.store = store
        self.max_steps = max_steps
        self._mcp = mcp
        self._mcp_lock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[threading.Event, list[str]]] = {}
        self._listed: set[str] = set()  # servers whose tools were listed since their last change

    @property
    def mcp(self) -> McpTools:
        """The servers' connections, made on first use (no server starts before a listing or call)."""
        with self._mcp_lock:
            if self._mcp is None:
                from ..engine.mcp_tools import McpTools

                self._mcp = McpTools(load_servers(self.store))
            return self._mcp

    # -- configuration (any thread; set_configs may wait for a server to stop)
    def apply_servers(self, configs: list[McpServerConfig]) -> None:
        save_servers(self.store, configs)
        self.mcp.set_configs(configs)
        changed = {c.name for c in configs}
        with self._lock:
            self._listed &= changed

    def list_tools(self, name: str):
        """One server's tools (blocking: run it off the UI thread)."""
        tools = self.mcp.list_server_tools(name)
        with self._lock:
            self._listed.add(name)
        return tools

    def offered_tools(self):
        """The tools a reply may call: every enabled server listed once (on the worker), minus
        the tools switched off. A server that cannot be listed offers nothing (logged)."""
        from ..engine.mcp_tools import McpError

        for config in self.mcp.configs:
            if config.enabled and config.name not in self._listed:
                try:
                    self.list_tools(config.name)
                except McpError as exc:  # the reply goes on with the other servers' tools
                    log.warning("%s", exc)
                    self.serverFailed.emit(f"{exc} (its tools are left out of this reply)")
        return self.mcp.enabled_tools()

    # -- answers (UI thread)
    def waiting(self, message_id: int) -> bool:
        with self._lock:
            return message_id in self._waiting

    def answer(self, message_id: int, decision: str) -> bool:
        """The user's answer to a waiting card; False when nothing waits for it."""
        with self._lock:
            entry = self._waiting.get(message_id)
        if entry is None:
            return False
        entry[1].append(decision)
        entry[0].set()
        return True

    # -- the worker's side
    def ask(self, chat_id: int, message_id: int, cancel: threading.Event) -> str:
        """Block until the card `message_id` is answered (or Stop): its decision."""
        event, box = threading.Event(), []
        with self._lock:
            self._waiting[message_id] = (event, box)
        self.cardChanged.emit(chat_id)
        try:
            while not event.wait(ANSWER_POLL_S):
                if cancel.is_set():
                    return STOP
            return box[0]
        finally:
            with self._lock:
                self._waiting.pop(message_id, None)

    def close(self) -> None:
        with self._mcp_lock:
            if self._mcp is not None:
                self._mcp.close()

    def run_chat(self, engine, chat_id: int, messages: list[ChatMessage], params, *, on_piece, cancel,
                 session_key, reply_id: int, new_reply: Callable[[int], None],
                 on_prompt_progress: Callable[[int, int], None] | None = None) -> tuple[GenerationResult, int | None]:
        """The reply to `messages`, through as many rounds of tool calls as it takes. Returns
        the final result and the message row that holds it (None when Stop ended the loop
        between rounds: the calls and their cards are saved already). `on_prompt_progress`:
        given to every round's engine.chat."""

        def plain():
            return engine.chat(messages, params, on_piece=on_piece, cancel=cancel, session_key=session_key,
                               on_prompt_progress=on_prompt_progress)

        if not uses_tools(engine) or not chat_tools_on(self.store, chat_id):
            return plain(), reply_id
        tools = self.offered_tools()
        if not tools:
            return plain(), reply_id
        from ..engine.server.tools_api import ToolRequest, engine_params, read_tool_calls

        specs = [ToolSpec(t.name, t.description, t.parameters) for t in tools]
        messages = list(messages)
        rounds = 0
        while True:
            capped = rounds >= self.max_steps
            request = ToolRequest(tools=[] if capped else specs)
            result = engine.chat(messages, engine_params(engine.tokenizer, request, params),
                                 on_piece=text_before_calls(on_piece),
                                 cancel=cancel, session_key=session_key, tools=None if capped else specs,
                                 on_prompt_progress=on_prompt_progress)
            result = read_tool_calls(engine.tokenizer, request, result)
            if not result.tool_calls or cancel.is_set():
                self.store.set_tool(reply_id, None)  # a regenerated row may have held calls
                return result, reply_id
            rounds += 1
            calls = list(result.tool_calls)
            self.store.finish_reply(reply_id, result.text, result.stats, finish_reason="tool_calls")
            self.store.set_tool(reply_id, {"calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                                                     for c in calls]})
            messages.append(ChatMessage("assistant", [result.text] if result.text else [], tool_calls=calls))
            stopped = False
            for i, call in enumerate(calls):
                note = cap_note(self.max_steps) if rounds >= self.max_steps and i == len(calls) - 1 else ""
                text, stopped = self._one_call(chat_id, call, cancel, stopped, note)
                messages.append(ChatMessage("tool", [text], tool_call_id=call.id))
            if stopped:
                stats = replace(result.stats, finish_reason="cancelled")
                return GenerationResult("", [], [], stats), None
            reply_id = self.store.begin_reply(chat_id)
            new_reply(reply_id)

    def _one_call(self, chat_id: int, call, cancel: threading.Event, stopped: bool, note: str) -> tuple[str, bool]:
        """Ask, run and record one call: (the result the model gets, whether Stop was pressed)."""
        tool = self.mcp.tool(call.name)
        card = {"call_id": call.id, "name": call.name, "server": tool.server if tool else "",
                "arguments": call.arguments, "status": "waiting", "decision": "", "error": None,
                "elapsed_s": None, "note": note}
        # saved as not run until it has run: a chat closed meanwhile tells the model so
        message_id = self.store.add_tool_message(chat_id, STOPPED, card)
        if stopped or cancel.is_set():
            decision = STOP
        elif call.name in always_allowed(self.store, chat_id):
            decision = ALWAYS
        else:
            decision = self.ask(chat_id, message_id, cancel)
        card["decision"] = decision
        if decision == STOP:
            card["status"], text = "stopped", STOPPED
        elif decision == DENY:
            card["status"], text = "denied", DENIED
        else:
            if decision == ALWAYS:
                allow_always(self.store, chat_id, call.name)
            card["status"] = "running"
            self.store.update_tool_message(message_id, STOPPED, card)
            self.cardChanged.emit(chat_id)
            outcome = self.mcp.call(call.name, call.arguments)
            card.update(status="error" if outcome.error else "done", error=outcome.error,
                        elapsed_s=round(outcome.elapsed_s, 3))
            text = outcome.text
        self.store.update_tool_message(message_id, text, card)
        self.cardChanged.emit(chat_id)
        return text, decision == STOP
