"""Tools through MCP in the window: the tool servers of Settings → Tools, a chat's tools switch,
and the tool loop the engine worker runs.

`ToolBroker` lives on the UI thread (the window owns it). The engine worker calls
`run_chat(...)` in place of `engine.chat(...)` (worker.py): when the chat has tools on, each
reply may be tool calls: the local model's, written in its chat format and read back with its
tokenizer, or a server's (RemoteEngine), which come back as OpenAI `tool_calls` and go out again
as the server's own tool messages. Every call becomes a `tool` message (its card,
schema v5) that first waits for the user's answer (Allow once / Always for this chat / Deny):
the worker blocks in `ask()` on a threading.Event the UI sets through `answer()`, and Stop (the
reply's cancel Event) ends the wait. Results go back to the model until it answers in text, at
most `max_steps` rounds of calls; then it is asked once more without tools, and the last card
says so. A call the token limit cut off (its arguments unfinished) is recorded as such, never
asked for nor run, and the reply ends there. Tool calls themselves block on the worker, bounded
by each server's timeout (engine/mcp_tools.py never raises for a server's failures: an error
becomes the card's error).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from PySide6.QtCore import QObject, Signal

from ..engine.api import ChatMessage, GenerationResult, ReasoningPiece, ThinkPart, ToolSpec
from .reasoning import Thought

if TYPE_CHECKING:  # imported when first used: asyncio and the SDK stay out of the window's start
    from ..engine.mcp_tools import McpServerConfig, McpTools

log = logging.getLogger(__name__)

SERVERS_KEY = "tools.mcp_servers"
MAX_STEPS = 8  # rounds of tool calls in one reply
# A reply waits this long for tool servers still starting, then goes on without their tools
# (they keep starting in the background: the next reply has them). A server that never
# answered cost every message its whole timeout before (~30 s, plus the 20 s to connect).
LIST_WAIT_S = 10.0
# A server that failed is tried again after this, in the background: no reply waits for it
# again until it has answered once (or its settings change).
RETRY_FAILED_S = 300.0
ANSWER_POLL_S = 0.05  # how often a waiting card looks at Stop

ALLOW_ONCE, ALWAYS, DENY, STOP = "once", "always", "deny", "stop"
DENIED = "The user denied this tool call."
STOPPED = "The user stopped the reply before this tool call ran."


def cap_note(steps: int) -> str:
    return f"Step limit reached ({steps} rounds of tool calls): the model was asked to answer without tools."


def unfinished_call(max_tokens: int) -> str:
    """A call cut off by the reply's token limit: why its card was not asked for, nor run."""
    return (f"the reply reached its limit of {max_tokens} tokens while writing this call, so its "
            "arguments are unfinished and it was not run (Max tokens is in Chat settings)")


def whole_arguments(arguments: str) -> bool:
    """Whether a call's arguments (ToolCall.arguments, JSON text) are a whole JSON object."""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


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


TOOLS_REQUIRED_KEY = "tools_required"  # a chat's setting: its reply must call a tool first (a server's tool_choice)


def chat_tools_required(store, chat_id: int | None) -> bool:
    if chat_id is None:
        return False
    return store.get_chat_info(chat_id).settings.get(TOOLS_REQUIRED_KEY) is True


def set_chat_tools_required(store, chat_id: int, on: bool) -> None:
    store.update_chat_settings(chat_id, **{TOOLS_REQUIRED_KEY: True if on else None})


def timed_pieces(on_piece: Callable[[str], None], thought: Thought) -> Callable[[str], None]:
    """`on_piece` that also times the round's thought (its first piece to the first answer piece)."""

    def piece(text: str) -> None:
        if isinstance(text, ReasoningPiece):
            thought.add(text, time.monotonic())
        else:
            thought.answered(time.monotonic())
        on_piece(text)

    return piece


def uses_tools(engine) -> bool:
    """Whether an engine can be given tools: the local one (its tokenizer writes and reads the
    calls) and a server (it parses its model's calls into OpenAI tool_calls)."""
    return engine.writes_tool_calls or engine.device_kind == "remote"


def text_before_calls(on_piece: Callable[[str], None]) -> Callable[[str], None]:
    """`on_piece` for a reply that may be tool calls: the text before [TOOL_CALLS] streams as
    usual; the calls themselves are not shown as text (their cards show them). What could be
    the start of the marker waits for the next piece (the saved reply has all its text): the
    marker is held back as a stop string is. A thought (ReasoningPiece) comes before any call
    and is passed on as it is."""
    from ..engine.runtime.generate import StopStringFilter
    from ..engine.server.tools_api import MARKER

    marker = StopStringFilter(MARKER)

    def piece(text: str) -> None:
        if isinstance(text, ReasoningPiece):
            on_piece(text)
            return
        shown = marker.feed(text)
        if shown:
            on_piece(shown)

    return piece


# ----------------------------------------------------------------------------- the broker

@dataclass(frozen=True)
class ServerFailure:
    """Why a tool server's tools could not be listed, and when (time.monotonic())."""

    reason: str
    at: float


class ToolBroker(QObject):
    """The app's tool servers and the cards waiting for an answer."""

    cardChanged = Signal(object)  # chat id: a card was added, is waiting, or has its result
    toolServerFailed = Signal(str)  # a tool server that could not be listed for a reply, in words
    toolServersChanged = Signal()  # a background listing ended (listed or failed)

    def __init__(self, store, parent: QObject | None = None, *, max_steps: int = MAX_STEPS,
                 mcp: McpTools | None = None, list_wait_s: float = LIST_WAIT_S,
                 retry_failed_s: float = RETRY_FAILED_S):
        super().__init__(parent)
        self.store = store
        self.max_steps = max_steps
        self.list_wait_s = list_wait_s
        self.retry_failed_s = retry_failed_s
        self._mcp = mcp
        self._mcp_lock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[threading.Event, list[str]]] = {}
        self._listed: set[str] = set()  # servers whose tools were listed since their last change
        self._starting: dict[str, threading.Event] = {}  # listings under way in the background
        self._waited: set[str] = set()  # of those, the ones a reply has already waited for
        self._failed: dict[str, ServerFailure] = {}  # the last listing of these failed

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
        old = {c.name: c for c in self.mcp.configs}
        save_servers(self.store, configs)
        self.mcp.set_configs(configs)
        unchanged = {c.name for c in configs if old.get(c.name) == c}
        with self._lock:
            self._listed &= unchanged
            self._failed = {n: f for n, f in self._failed.items() if n in unchanged}
            # a listing of the old settings still under way says nothing about the new ones
            self._starting = {n: e for n, e in self._starting.items() if n in unchanged}
            self._waited &= unchanged

    def _config(self, name: str) -> McpServerConfig | None:
        return next((c for c in self.mcp.configs if c.name == name), None)

    def list_tools(self, name: str):
        """One server's tools (blocking: run it off the UI thread). A failure is remembered
        (`failure`) and raised; neither is, when the server's settings changed meanwhile."""
        from ..engine.mcp_tools import McpError

        config = self._config(name)
        try:
            tools = self.mcp.list_server_tools(name)
        except McpError as exc:
            with self._lock:
                if self._config(name) == config:
                    self._failed[name] = ServerFailure(str(exc), time.monotonic())
                    self._listed.discard(name)
            raise
        with self._lock:
            if self._config(name) == config:
                self._listed.add(name)
                self._failed.pop(name, None)
        return tools

    def failure(self, name: str) -> str:
        """Why the server's last listing failed ('' when it did not, or it has not been tried)."""
        with self._lock:
            failed = self._failed.get(name)
        return failed.reason if failed else ""

    def start_listing(self) -> None:
        """List every enabled server's tools in the background (the app's thread pool), the
        ones not listed yet, not under way and not failed lately; any thread. The window calls
        it when a chat's tools are switched on, so servers start before the first message."""
        from .jobs import shared_pool

        now = time.monotonic()
        with self._lock:
            names = [c.name for c in self.mcp.configs
                     if c.enabled and c.name not in self._listed and c.name not in self._starting
                     and (c.name not in self._failed or now - self._failed[c.name].at >= self.retry_failed_s)]
            for name in names:
                self._starting[name] = threading.Event()
            events = {name: self._starting[name] for name in names}
        for name, event in events.items():
            shared_pool().start(lambda name=name, event=event: self._list_in_background(name, event))

    def _list_in_background(self, name: str, done: threading.Event) -> None:
        """One listing on the pool; `done` is set when it ends (its entry in `_starting`, unless
        the server's settings changed meanwhile and a newer listing took its place)."""
        from ..engine.mcp_tools import McpError

        try:
            self.list_tools(name)
        except McpError as exc:
            log.warning("%s", exc)
            with self._lock:
                current = self._starting.get(name) is done
                waited = name in self._waited
            if current:
                self._emit_from_pool(self.toolServerFailed, f"{exc} (its tools are left out of "
                                     f"{'this reply' if waited else 'replies until it answers'})")
        except Exception:  # noqa: BLE001 - a pool job must not raise; logged in full
            log.exception("listing the tools of %s failed", name)
        finally:
            with self._lock:
                if self._starting.get(name) is done:
                    del self._starting[name]
                    self._waited.discard(name)
            done.set()
            self._emit_from_pool(self.toolServersChanged)

    def _emit_from_pool(self, signal, *args) -> None:
        """Emit from a pool job that may outlive the broker: a window closed while a server
        was still starting leaves no one to tell, and the job must end quietly."""
        try:
            signal.emit(*args)
        except RuntimeError:  # "Signal source has been deleted"
            log.debug("tool broker gone before its listing ended")

    def offered_tools(self):
        """The tools a reply may call (on the worker): every enabled server's, as listed, minus
        the tools switched off. Servers not listed yet start listing in the background; the
        reply waits for them at most `list_wait_s`, once per listing (never for a server that
        failed before), and goes on without the ones still starting or failed."""
        self.start_listing()
        deadline = time.monotonic() + self.list_wait_s
        with self._lock:
            waits = {n: e for n, e in self._starting.items() if n not in self._waited and n not in self._failed}
            self._waited |= set(waits)
        late = []
        for name, event in waits.items():
            if not event.wait(max(0.0, deadline - time.monotonic())):
                late.append(name)
        if late:
            self.toolServerFailed.emit(f"tool server{'s' * (len(late) > 1)} {', '.join(map(repr, late))} "
                                   f"still starting: {'their' if len(late) > 1 else 'its'} tools are left "
                                   "out of this reply")
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
        given to every round's engine.chat. On a server the rounds are the same: its calls
        arrive parsed (GenerationResult.tool_calls) and never as text, so the pieces stream as
        they come."""

        def plain():
            return engine.chat(messages, params, on_piece=on_piece, cancel=cancel, session_key=session_key,
                               on_prompt_progress=on_prompt_progress)

        if not uses_tools(engine) or not chat_tools_on(self.store, chat_id):
            return plain(), reply_id
        tools = self.offered_tools()
        if not tools:
            return plain(), reply_id
        local = engine.writes_tool_calls  # else a server: it writes and parses the calls itself
        if local:
            from ..engine.server.tools_api import ToolRequest, engine_params, read_tool_calls

        specs = [ToolSpec(t.name, t.description, t.parameters) for t in tools]
        messages = list(messages)
        rounds = 0
        while True:
            capped = rounds >= self.max_steps
            offered = None if capped else specs
            thought = Thought()  # this round's, timed here: a round of calls is saved here
            timed = timed_pieces(on_piece, thought)
            # a chat that forces a tool: its first round must call one (later rounds choose,
            # else only the step limit would end the loop)
            choice = "required" if offered and rounds == 0 and chat_tools_required(self.store, chat_id) else "auto"
            if local:
                request = ToolRequest(tools=offered or [], choice=choice)
                result = engine.chat(messages, engine_params(engine.tokenizer, request, params),
                                     on_piece=text_before_calls(timed), cancel=cancel,
                                     session_key=session_key, tools=offered, on_prompt_progress=on_prompt_progress)
                result = read_tool_calls(engine.tokenizer, request, result)
            else:
                result = engine.chat(messages, params, on_piece=timed, cancel=cancel, session_key=session_key,
                                     tools=offered, on_prompt_progress=on_prompt_progress,
                                     **({"tool_choice": choice} if choice != "auto" else {}))
                if capped:  # asked without tools, a server's model has none to call
                    result.tool_calls = []
            if not result.tool_calls or cancel.is_set():
                self.store.set_tool(reply_id, None)  # a regenerated row may have held calls
                return result, reply_id
            rounds += 1
            calls = list(result.tool_calls)
            # the round's thought is kept with its calls, and sent back before them in the next
            # round's prompt (a [THINK] chunk where the model's format has one)
            reasoning = result.reasoning or thought.text
            thought.ended(time.monotonic(), cut=False)  # it reached its calls: it was not cut off
            self.store.finish_reply(reply_id, result.text, result.stats, finish_reason="tool_calls",
                                    reasoning=reasoning, reasoning_s=thought.seconds if reasoning else None)
            self.store.set_tool(reply_id, {"calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                                                     for c in calls]})
            parts = ([ThinkPart(reasoning)] if reasoning else []) + ([result.text] if result.text else [])
            messages.append(ChatMessage("assistant", parts, tool_calls=calls))
            stopped = False
            # a round the token limit cut inside its calls: its last call is unfinished (the
            # engine keeps it, as OpenAI does); it is not asked for nor run, and the reply ends
            # there, as a text reply cut by the limit does
            cut = result.stats.finish_reason == "length" and not whole_arguments(calls[-1].arguments)
            for i, call in enumerate(calls):
                last = i == len(calls) - 1
                note = cap_note(self.max_steps) if rounds >= self.max_steps and last else ""
                unfinished = unfinished_call(params.max_tokens) if cut and last else None
                text, stopped = self._one_call(chat_id, call, cancel, stopped, note, unfinished)
                messages.append(ChatMessage("tool", [text], tool_call_id=call.id))
            if stopped or cut:
                stats = replace(result.stats, finish_reason="cancelled" if stopped else "length")
                return GenerationResult("", [], [], stats), None
            reply_id = self.store.begin_reply(chat_id)
            new_reply(reply_id)

    def _one_call(self, chat_id: int, call, cancel: threading.Event, stopped: bool, note: str,
                  unfinished: str | None = None) -> tuple[str, bool]:
        """Ask, run and record one call: (the result the model gets, whether Stop was pressed).
        `unfinished`: why the call, cut off, is recorded as such without asking or running it."""
        tool = self.mcp.tool(call.name)
        card = {"call_id": call.id, "name": call.name, "server": tool.server if tool else "",
                "arguments": call.arguments, "status": "waiting", "decision": "", "error": None,
                "elapsed_s": None, "note": note}
        if unfinished is not None:
            card.update(status="unfinished", error=unfinished)
            text = f"Error: {unfinished}"
            self.store.add_tool_message(chat_id, text, card)
            self.cardChanged.emit(chat_id)
            return text, False
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
