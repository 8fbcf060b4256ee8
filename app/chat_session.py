"""The chat state machine: send, stop, regenerate, edit and resend, and the chat CRUD.

`ChatSession` ties the store (chats on disk) to the engine worker; the window only shows
what it says and asks it to act:

* send: the worker saves the user message and an empty `streaming` reply row, reads the chat
  as the store has it and generates with a fresh cancel Event;
* pieces: appended to the reply, shown (throttled by ChatView) and checkpointed by the worker
  about once a second (Store.checkpoint_reply throttles);
* finished: the worker saves the final text and stats, then tells us; failed: the worker keeps
  the partial text (finish reason 'error') or drops the empty reply, then tells us, and the
  message is shown in the chat; Stop just sets the Event, and the engine returns what it has
  with finish reason 'cancelled'.

Every write a reply makes happens on the worker, so a slow disk never stalls the UI. The chat
CRUD (rename, pin, delete, branch, import) are single short transactions on the UI thread.
"""
from __future__ import annotations


import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from ..engine.api import GenerationResult, GenerationStats
from .config import CHAT_SAMPLING_FIELDS, AppSettings, Sampling
from .reasoning import REASONING_KEY, chat_reasoning_on
from .store import Store, StoreError
from .engine_info import EngineInfo
from .worker import NO_MODEL_LOADED, OVERFLOW_CHOICES, ChatRequest, EngineWorker

CHAT_SAMPLING_KEY = "sampling"  # a chat's own sampling knobs, in its settings
CHAT_OVERFLOW_KEY = "overflow"  # what the chat does when it outgrows the context (worker.OVERFLOW_CHOICES)

LOAD_FIRST_HINT = "Load a model first (Models… or Open… in the model bar)."
IMAGES_NEED_VISION = ("The loaded model has no vision projector, so it cannot read the attached "
                      "images: remove them, or load the model with its mmproj file (Models… or Open…).")
CHAT_NEEDS_VISION = ("This chat has images and the loaded model has no vision projector: load the "
                     "model with its mmproj file (Models… or Open…), or start a new chat.")


@dataclass
class PendingReply:
    request_id: int
    chat_id: int | None
    message_id: int | None  # None until the worker has saved the reply row (_on_started)
    cancel: threading.Event
    text: str = ""
    reasoning: str = ""  # a reasoning model's thought so far (it streams before the answer)
    pieces: int = 0
    first_piece_at: float = 0.0  # time.monotonic() of the first piece (for the live tok/s)
    stats: GenerationStats | None = field(default=None)
    sent: tuple[str, int] | None = None  # a new message's text and image count, shown until saved


TITLE_CHARS = 60  # a new chat's title: its first message's first line, at most this long


def chat_title(text: str) -> str:
    """A new chat's title from its first message: the first line, cut at a word within
    TITLE_CHARS and ended with "…" when cut (the 60 characters cut "how warm its colours" into
    "how warm it", read as a word of its own); "Image chat" for a message with no text."""
    line = (text.strip().splitlines() or [""])[0].strip()
    if len(line) <= TITLE_CHARS:
        return line or "Image chat"
    space = line.rfind(" ", 0, TITLE_CHARS)  # the words before it leave room for "…"
    cut = line[:space] if space >= TITLE_CHARS // 2 else line[:TITLE_CHARS - 1]  # else one long word (a link)
    return cut.rstrip(" ,;:.-") + "…"


def thought_fields(text: str, thought) -> dict:
    """Store.finish_reply's reasoning fields from the worker's Thought (app/reasoning.py)."""
    return dict(reasoning=text, reasoning_s=thought.seconds, reasoning_open=thought.cut)


def finish_reason(stats: GenerationStats) -> str:
    """The engine's reason, with 'length' split: 'context_full' when the reply stopped because
    the conversation filled the context, not because it reached Max tokens."""
    full = stats.context_size and stats.prompt_tokens + stats.generated_tokens >= stats.context_size
    return "context_full" if stats.finish_reason == "length" and full else stats.finish_reason


class ChatSession(QObject):
    """The open chat, the reply being written, and every change to the chats."""

    changed = Signal(object)  # chat id (None: the new, unsaved chat) whose messages or notice changed
    listChanged = Signal()  # titles, order or pins changed: reread the chat list
    streamed = Signal(str)  # the reply so far, for the chat on screen
    thoughtStreamed = Signal(str)  # the thought so far (a reasoning model's), for the chat on screen
    promptRead = Signal(int, int)  # prompt tokens read, of how many, before the reply's first words (chat on screen)
    busyChanged = Signal(bool)  # a reply started (True) or ended (False)
    unsent = Signal(str, list)  # a message that could not be saved, for the composer
    storeFailed = Signal(str)  # a store error from a chat action, in words
    replyFinished = Signal(int)  # message id, after the store has the final text
    replyFailed = Signal(str)

    def __init__(self, store: Store, settings: AppSettings, worker: EngineWorker,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.worker = worker
        self.param_overrides: dict = {}  # extra SamplingParams fields (tests, power users)
        self.new_chat_sampling: dict | None = None  # Chat settings chosen before the new chat is saved
        self.new_chat_reasoning = True  # the reasoning switch chosen before the new chat is saved
        self.new_chat_overflow = "stop"  # the overflow choice made before the new chat is saved
        self.new_chat_own_prompt_only = False  # the chat's system prompt alone, chosen before it is saved
        self.new_chat_tools_required = False  # its first reply must call a tool, chosen before it is saved
        self.tools = None  # app.tools.ToolBroker when the window has tool servers (the worker asks it)
        self.engine_info: EngineInfo | None = None  # set by whoever loads models
        self.loading: str | None = None  # model path being loaded
        self.current_chat_id: int | None = None
        self.messages: list = []  # the current chat's messages, as last read (see `read_current`)
        self.pending: PendingReply | None = None
        self.live_stats: dict[int, GenerationStats] = {}
        self.errors: dict[int, str] = {}  # message id -> failure text
        self.notices: dict[int | None, str] = {}  # chat id -> failure with nothing kept
        self._next_request = 0
        self._unsent: tuple[str, list] | None = None
        worker.started.connect(self._on_started)
        worker.piece.connect(self._on_piece)
        worker.thoughtPiece.connect(self._on_thought)
        worker.promptProgress.connect(self._on_prompt_progress)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)

    # ------------------------------------------------------------------ reading
    def read_current(self):
        """The current chat from the store (None for the new chat), remembered in `messages`.
        A chat that cannot be read any more (deleted elsewhere) is left."""
        chat = None
        if self.current_chat_id is not None:
            try:
                chat = self.store.get_chat(self.current_chat_id)
            except StoreError:
                self.current_chat_id = None
        self.messages = chat.messages if chat else []
        return chat

    def title(self) -> str:
        if self.current_chat_id is None:
            return "New chat"
        try:
            return self.store.get_chat_info(self.current_chat_id).title
        except StoreError:
            return ""

    def can_reply(self) -> bool:
        """A model is loaded (or on its way: the request waits for it)."""
        return self.engine_info is not None or bool(self.loading)

    def can_regenerate(self) -> bool:
        # From the messages read for the view, not another store read: while a reply
        # streams, the worker may hold the store for a checkpoint.
        return (self.pending is None and self.can_reply() and bool(self.messages)
                and self.messages[-1].role in ("user", "assistant"))

    def writing_here(self) -> bool:
        """The reply being written belongs to the chat on screen (or to the new chat it is
        creating); Stop and Esc act on it only then."""
        p = self.pending
        return p is not None and p.chat_id == self.current_chat_id

    def busy_elsewhere(self) -> str:
        """Why a message cannot be sent here now: another chat is writing ('' if none is)."""
        p = self.pending
        if p is None or self.writing_here():
            return ""
        title = "Another chat"
        if p.chat_id is not None:
            try:
                title = f"“{self.store.get_chat_info(p.chat_id).title}”"
            except StoreError:
                pass
        return (f"{title} is still writing its reply: send this when it is done, or open "
                "that chat to stop it.")

    def live_rate(self) -> float:
        """Pieces (about tokens) a second of the reply being written, 0 until there are two."""
        p = self.pending
        if p is None or p.pieces < 2:
            return 0.0
        elapsed = time.monotonic() - p.first_piece_at
        return (p.pieces - 1) / elapsed if elapsed > 0 else 0.0

    def streaming_id(self, chat_id: int | None) -> int | None:
        p = self.pending
        return p.message_id if p is not None and chat_id is not None and p.chat_id == chat_id else None

    # ------------------------------------------------------------------ generation
    def send(self, text: str, images: list, binding: dict | None = None) -> str:
        """Start the reply to a new user message: '' when started, else why it cannot be sent
        now (nothing is saved then). The message is saved by the worker."""
        if self.pending is not None:
            return self.busy_elsewhere() or "A reply is being written."
        if self.engine_info is None and not self.loading:
            return LOAD_FIRST_HINT
        refused = self.images_refused(images, self.messages)
        if refused:
            return refused
        store, chat_id = self.store, self.current_chat_id
        title = chat_title(text)
        system_prompt = self.settings.default_system_prompt
        images = list(images)
        binding = dict(binding or {})
        if chat_id is None and self.new_chat_sampling is not None:
            binding["settings"] = {**binding.get("settings", {}), CHAT_SAMPLING_KEY: self.new_chat_sampling}
        if chat_id is None and not self.new_chat_reasoning:
            binding["settings"] = {**binding.get("settings", {}), REASONING_KEY: False}
        if chat_id is None and self.new_chat_overflow != "stop":
            binding["settings"] = {**binding.get("settings", {}), CHAT_OVERFLOW_KEY: self.new_chat_overflow}
        if chat_id is None and self.new_chat_own_prompt_only:
            from .model_prompt import OWN_PROMPT_ONLY_KEY

            binding["settings"] = {**binding.get("settings", {}), OWN_PROMPT_ONLY_KEY: True}
        if chat_id is None and self.new_chat_tools_required:
            from .tools import TOOLS_REQUIRED_KEY

            binding["settings"] = {**binding.get("settings", {}), TOOLS_REQUIRED_KEY: True}

        def write() -> int:
            cid = chat_id if chat_id is not None else store.create_chat(
                title, system_prompt=system_prompt, **binding)
            store.add_message(cid, "user", text, images)
            return cid

        self._unsent = (text, images)  # back to the composer if saving fails
        self.notices.pop(chat_id, None)
        self._start_reply(write)
        self.pending.sent = (text, len(images))
        self.changed.emit(chat_id)  # shown at once, also while it waits for a model to load
        return ""

    def images_refused(self, new_images: list, history: list) -> str:
        """Why the loaded model cannot answer (it has no vision projector, and images are
        attached or already in the conversation), or ''. Checked before anything is saved or
        dropped: the engine would fail only after that."""
        from ..engine.api import ImagePart  # documents among the attachments need no tower

        info = self.engine_info
        if info is None or info.has_vision:
            return ""
        if any(isinstance(part, ImagePart) for part in new_images):
            return IMAGES_NEED_VISION
        if any(m.images for m in history):
            return CHAT_NEEDS_VISION
        return ""

    def model_hints(self, info: EngineInfo) -> set[str]:
        """The messages about the model that stop being true once `info` is loaded."""
        return {LOAD_FIRST_HINT, NO_MODEL_LOADED} | ({IMAGES_NEED_VISION, CHAT_NEEDS_VISION} if info.has_vision else set())

    def regenerate(self, message_id: int | None = None) -> bool:
        """Drop the reply `message_id` (default: the last one) and everything after, and
        write it again. False when there is nothing to answer or it is refused."""
        if self.pending is not None or self.current_chat_id is None:
            return False
        chat_id = self.current_chat_id
        if not self.can_reply():
            self._notice(chat_id, LOAD_FIRST_HINT)
            return False
        try:
            messages = self.store.get_chat(chat_id).messages
        except StoreError as exc:
            self._notice(chat_id, str(exc))
            return False
        if message_id is None and messages and messages[-1].role == "assistant":
            message_id = messages[-1].id
        cut = next((i for i, m in enumerate(messages) if m.id == message_id), len(messages))
        if not any(m.role == "user" for m in messages[:cut]):
            return False  # nothing to answer
        refused = self.images_refused([], messages[:cut])
        if refused:  # checked before the old reply is dropped
            self._notice(chat_id, refused)
            return False
        self.errors.pop(message_id, None)
        self.notices.pop(chat_id, None)
        store = self.store

        def write():
            if message_id is not None:  # a new version of this reply; the old ones are kept
                return chat_id, store.regenerate_reply(message_id)
            return chat_id

        self._start_reply(write)
        return True

    def edit_and_resend(self, message_id: int, text: str) -> bool:
        """Reply again to a user message with a new text. The old text and everything that
        followed it are kept as the message's previous version (‹ 1/2 ›), not deleted."""
        if self.pending is not None:
            return False
        if not self.can_reply():
            self._notice(self.current_chat_id, LOAD_FIRST_HINT)
            return False
        try:
            chat_id = self.store.get_message(message_id).chat_id
            messages = self.store.get_chat(chat_id).messages
        except StoreError as exc:
            self._notice(self.current_chat_id, str(exc))
            return False
        upto = next((i for i, m in enumerate(messages) if m.id == message_id), len(messages) - 1)
        refused = self.images_refused([], messages[:upto + 1])
        if refused:  # checked before the later messages are dropped
            self._notice(chat_id, refused)
            return False
        self.notices.pop(chat_id, None)
        store = self.store

        def write() -> int:
            store.edit_as_version(message_id, text)
            return chat_id

        self._start_reply(write)
        return True

    def stop(self) -> None:
        """Stop the reply being written; the engine returns at the next token."""
        if self.pending is not None:
            self.pending.cancel.set()

    def with_model_prompt(self, chat_id: int, messages: list, info: EngineInfo | None = None) -> list:
        """The chat's messages with the chat's own system prompt first and the loaded model's
        appended after it (app/model_prompt.py), unless the chat asked for its own alone. On the
        worker thread (`prepare`), where the engine that answers is the worker's; on the UI thread
        (a deleted chat's prompt, for the engine to forget), from `info`, the loaded model as
        the window knows it (the same path and thought format, so the same prompt)."""
        from .model_prompt import compose_system_prompt, model_system_prompt, own_prompt_only

        if info is None:
            engine = self.worker.engine
            if engine is None:
                return messages
            model_path, can_think = engine.model_path, engine.think_ids is not None
        else:
            model_path, can_think = (None if info.remote else info.model_path), info.can_think
        model_parts = model_system_prompt(model_path)
        if not model_parts:
            return messages
        return compose_system_prompt(messages, model_parts, can_think,
                                     own_prompt_only(self.store.get_chat_info(chat_id).settings))

    def own_prompt_only(self, chat_id: int | None) -> bool:
        """The chat sends its own system prompt alone, without the model's."""
        from .model_prompt import own_prompt_only

        if chat_id is None:
            return self.new_chat_own_prompt_only
        try:
            return own_prompt_only(self.store.get_chat_info(chat_id).settings)
        except StoreError:
            return False

    def set_own_prompt_only(self, chat_id: int | None, on: bool) -> None:
        """Per chat: only the chat's own system prompt (True), or with the model's appended after
        it (the default, so only True is stored)."""
        from .model_prompt import OWN_PROMPT_ONLY_KEY

        if chat_id is None:
            self.new_chat_own_prompt_only = bool(on)
        else:
            self._guard(self.store.update_chat_settings, chat_id, **{OWN_PROMPT_ONLY_KEY: True if on else None})

    def tools_required(self, chat_id: int | None) -> bool:
        """The chat's replies must call a tool in their first round (where tools are on)."""
        from .tools import chat_tools_required

        if chat_id is None:
            return self.new_chat_tools_required
        try:
            return chat_tools_required(self.store, chat_id)
        except StoreError:
            return False

    def set_tools_required(self, chat_id: int | None, on: bool) -> None:
        from .tools import set_chat_tools_required

        if chat_id is None:
            self.new_chat_tools_required = bool(on)
        else:
            self._guard(set_chat_tools_required, self.store, chat_id, bool(on))

    def _start_reply(self, write) -> None:
        """Generate a reply. On the worker, `write()` first saves what the user did (new
        message, edit, truncation) and returns the chat id; then the worker reads the chat,
        creates the streaming reply row and generates (see `_on_started`); at the end it saves
        the reply (`finish`) or what is left of it (`fail`)."""
        store = self.store

        def prepare():
            written = write()  # the chat id, or (chat id, the reply row to write again)
            chat_id, reply_id = written if isinstance(written, tuple) else (written, None)
            messages = store.engine_messages(chat_id)  # without the streaming reply
            messages = self.with_model_prompt(chat_id, messages)
            return chat_id, messages, reply_id if reply_id is not None else store.begin_reply(chat_id)

        def finish(message_id: int, result: GenerationResult, so_far: str, thought) -> None:
            text = result.text if result.text or not so_far else so_far
            store.finish_reply(message_id, text, result.stats, finish_reason=finish_reason(result.stats),
                               **thought_fields(result.reasoning or thought.text, thought))
            if request.documents is not None:  # the excerpts' (file, page), shown under the reply
                store.set_reply_sources(message_id, [asdict(s) for s in request.documents.sources])

        def fail(message_id: int, so_far: str, thought) -> None:
            if so_far or thought.text:  # keep what was written (and thought), marked as an error
                store.finish_reply(message_id, so_far, finish_reason="error", **thought_fields(thought.text, thought))
            else:  # gone, or a regenerated reply back to its previous version
                store.abandon_reply(message_id)

        self._next_request += 1
        params = self.sampling_for(self.current_chat_id).params(**self.param_overrides)
        self.pending = PendingReply(self._next_request, self.current_chat_id, None, threading.Event())
        self.busyChanged.emit(True)
        request = ChatRequest(
            self.pending.request_id, [], params, None, self.pending.cancel, prepare=prepare,
            checkpoint=lambda message_id, text, thought: store.checkpoint_reply(message_id, text, reasoning=thought),
            finish=finish, fail=fail, tools=self.tools, overflow=self.chat_overflow(self.current_chat_id))
        self.worker.chat(request)

    @Slot(int, int, int)
    def _on_started(self, request_id: int, chat_id: int, message_id: int) -> None:
        p = self.pending
        if p is None or p.request_id != request_id:
            return
        self._unsent = None
        if p.message_id is not None and p.message_id != message_id:  # after a round of tool calls
            p.text, p.reasoning, p.pieces = "", "", 0
        new_chat = p.chat_id is None
        p.chat_id, p.message_id = chat_id, message_id
        if new_chat:
            self.new_chat_sampling = None  # saved with the chat now
            self.new_chat_reasoning = True
            self.new_chat_own_prompt_only = False
            self.new_chat_tools_required = False
        if new_chat and self.current_chat_id is None:  # still on the new chat: show it
            self.current_chat_id = chat_id
        self.changed.emit(chat_id)

    @Slot(int, int, int)
    def _on_prompt_progress(self, request_id: int, read: int, total: int) -> None:
        p = self.pending
        if p is not None and p.request_id == request_id and not p.pieces and self.current_chat_id == p.chat_id:
            self.promptRead.emit(read, total)

    @Slot(int, str)
    def _on_piece(self, request_id: int, text: str) -> None:
        p = self.pending
        if p is None or p.request_id != request_id:
            return
        p.text += text  # the worker checkpoints it to the store (about once a second)
        p.pieces += 1
        if p.pieces == 1:
            p.first_piece_at = time.monotonic()
        if self.current_chat_id == p.chat_id:
            self.streamed.emit(p.text)

    @Slot(int, str)
    def _on_thought(self, request_id: int, text: str) -> None:
        p = self.pending
        if p is None or p.request_id != request_id:
            return
        p.reasoning += text  # checkpointed by the worker with the answer
        if self.current_chat_id == p.chat_id:
            self.thoughtStreamed.emit(p.reasoning)

    @Slot(int, object)
    def _on_finished(self, request_id: int, result) -> None:
        p = self.pending
        if p is None or p.request_id != request_id:
            return
        self.pending = None
        if p.message_id is not None:  # else: stopped before it started
            self.live_stats[p.message_id] = result.stats
        self._after_reply(p)
        if p.message_id is not None:
            self.replyFinished.emit(p.message_id)

    @Slot(int, str)
    def _on_failed(self, request_id: int, message: str) -> None:
        p = self.pending
        if p is None or p.request_id != request_id:
            return
        self.pending = None
        if p.message_id is None:  # failed before the reply row existed
            self.notices[p.chat_id] = message
            unsent, self._unsent = self._unsent, None
            if unsent:
                self.unsent.emit(*unsent)
        elif p.text or p.reasoning:  # the worker kept the partial reply
            self.errors[p.message_id] = message
        else:  # the worker dropped the empty reply
            self.notices[p.chat_id] = message
        self._after_reply(p)
        self.replyFailed.emit(message)

    def _after_reply(self, p: PendingReply) -> None:
        self.busyChanged.emit(False)
        self.changed.emit(p.chat_id if p.message_id is not None else self.current_chat_id)

    def abandon(self) -> None:
        """At close: stop the reply and forget it (the worker still saves what it has)."""
        if self.pending is not None:
            self.pending.cancel.set()
        self.pending = None

    # ------------------------------------------------------------------ chats
    def _notice(self, chat_id: int | None, text: str) -> None:
        self.notices[chat_id] = text
        self.changed.emit(chat_id)

    def _guard(self, fn, *args, **kwargs):
        """Run a store call; a StoreError becomes `storeFailed`, not a crash (False)."""
        try:
            return fn(*args, **kwargs)
        except StoreError as exc:
            self.storeFailed.emit(str(exc))
            return False

    def rename_chat(self, chat_id: int, title: str) -> None:
        title = title.strip()
        if title and self._guard(self.store.rename_chat, chat_id, title) is not False:
            self.listChanged.emit()

    def set_pinned(self, chat_id: int, pinned: bool) -> None:
        self._guard(self.store.set_pinned, chat_id, pinned)
        self.listChanged.emit()

    def toggle_pin(self, chat_id: int) -> None:
        self.set_pinned(chat_id, not self.store.get_chat_info(chat_id).pinned)

    def delete_chat(self, chat_id: int) -> bool:
        if self.pending is not None and self.pending.chat_id == chat_id:
            self.pending.cancel.set()
        try:  # what the engine may have cached of it: the prompt its replies were read from
            messages = self.store.engine_messages(chat_id)
            if messages and self.engine_info is not None:
                messages = self.with_model_prompt(chat_id, messages, self.engine_info)
        except (StoreError, OSError):  # a chat that cannot be read is still deleted
            messages = []
        if self._guard(self.store.delete_chat, chat_id) is False:
            return False
        self.worker.forget_chat(str(chat_id), messages)
        self.notices.pop(chat_id, None)
        self.save_draft(chat_id, "")
        if self.current_chat_id == chat_id:
            self.current_chat_id = None
        self.listChanged.emit()
        return True

    def branch(self, chat_id: int, message_id: int | None = None) -> int | None:
        """A new chat holding `chat_id` up to `message_id` (default: all of it); its id. Its
        title says it is a branch at its start, which the sidebar never cuts off."""
        source = self._guard(self.store.get_chat_info, chat_id)
        if source is False:
            return None
        new_id = self._guard(self.store.branch_chat, chat_id, message_id, f"Branch: {source.title}")
        if new_id is False:
            return None
        self.listChanged.emit()
        return new_id

    def export_chat(self, chat_id: int, path: str | Path) -> Path | None:
        """JSON (re-importable) or, for a .md path, Markdown with the images beside it."""
        from .store.export import export_json, export_markdown

        exporter = export_markdown if str(path).lower().endswith(".md") else export_json
        result = self._guard(exporter, self.store, chat_id, path)
        return None if result is False else result

    def import_chat(self, path: str | Path) -> int | None:
        from .store.export import import_json

        chat_id = self._guard(import_json, self.store, path)
        if chat_id is False:
            return None
        self.listChanged.emit()
        return chat_id

    # What was typed but not sent stays with its chat, across restarts (text only).
    @staticmethod
    def _draft_key(chat_id: int | None) -> str:
        return f"draft.{chat_id if chat_id is not None else 'new'}"

    def draft(self, chat_id: int | None) -> str:
        try:
            return str(self.store.get_setting(self._draft_key(chat_id), "") or "")
        except StoreError:
            return ""

    def save_draft(self, chat_id: int | None, text: str) -> None:
        if text == self.draft(chat_id):
            return
        key = self._draft_key(chat_id)
        self._guard(self.store.set_setting if text else self.store.delete_setting,
                    *((key, text) if text else (key,)))

    def show_version(self, message_id: int, idx: int) -> None:
        """Show another version of a regenerated reply or of an edited message (‹ 2/3 ›)."""
        if self.pending is None and self._guard(self.store.show_version, message_id, idx) is not False:
            self.live_stats.pop(message_id, None)  # the numbers shown are the version's own
            self.changed.emit(self.current_chat_id)

    def system_prompt(self) -> str:
        """The current chat's system prompt, or for the new chat the default one."""
        if self.current_chat_id is None:
            return self.settings.default_system_prompt
        return self.store.get_chat_info(self.current_chat_id).system_prompt

    def set_system_prompt(self, text: str) -> None:
        if self.current_chat_id is None:
            self.settings.default_system_prompt = text
        else:
            self._guard(self.store.update_chat, self.current_chat_id, system_prompt=text)

    def chat_sampling(self, chat_id: int | None) -> dict | None:
        """The chat's own sampling values (for None: those chosen for the new chat), or None
        when it uses the app's (Settings)."""
        if chat_id is None:
            return self.new_chat_sampling
        try:
            own = self.store.get_chat_info(chat_id).settings.get(CHAT_SAMPLING_KEY)
        except StoreError:
            return None
        return own if isinstance(own, dict) else None

    def model_sampling(self):
        """The loaded model's recommended sampling (its catalogue entry's `Sampling`); None for a
        server, a file the catalogue does not know, or none loaded."""
        from .model_prompt import recommended_sampling

        info = self.engine_info
        return recommended_sampling(info.model_path if info is not None and not info.remote else None)

    def default_sampling(self) -> Sampling:
        """What a chat that uses the defaults samples with: the app's settings, with the loaded
        model's recommended temperature and top_p where the user left those at their defaults
        (Sampling.recommended_values)."""
        return self.settings.sampling.with_recommended(self.model_sampling())

    def sampling_for(self, chat_id: int | None) -> Sampling:
        """What a reply in the chat samples with: the defaults (`default_sampling`), with the
        chat's own values in their place (a value the store holds out of range keeps the default)."""
        return self.default_sampling().overlaid(self.chat_sampling(chat_id), CHAT_SAMPLING_FIELDS)

    def set_chat_sampling(self, chat_id: int | None, values: dict | None) -> None:
        """Give the chat its own values of CHAT_SAMPLING_FIELDS; None: back to the app's."""
        if values is not None:
            values = Sampling().overlaid(values, CHAT_SAMPLING_FIELDS).chat_values()
        if chat_id is None:
            self.new_chat_sampling = values
        else:
            self._guard(self.store.update_chat_settings, chat_id, **{CHAT_SAMPLING_KEY: values})

    def chat_reasoning(self, chat_id: int | None) -> bool:
        """The chat's reasoning switch (app/reasoning.py; for None: the one chosen for the new chat)."""
        if chat_id is None:
            return self.new_chat_reasoning
        try:
            return chat_reasoning_on(self.store.get_chat_info(chat_id).settings)
        except StoreError:
            return True

    def set_chat_reasoning(self, chat_id: int | None, on: bool) -> None:
        """Set the chat's reasoning switch; on is the default, so it is stored only when off."""
        if chat_id is None:
            self.new_chat_reasoning = bool(on)
        else:
            self._guard(self.store.update_chat_settings, chat_id, **{REASONING_KEY: None if on else False})

    def chat_overflow(self, chat_id: int | None) -> str:
        """What the chat does when it outgrows the context (a key of OVERFLOW_CHOICES; an
        unknown stored value stops, as chats always did)."""
        if chat_id is None:
            return self.new_chat_overflow
        try:
            value = self.store.get_chat_info(chat_id).settings.get(CHAT_OVERFLOW_KEY)
        except StoreError:
            return "stop"
        return value if value in OVERFLOW_CHOICES else "stop"

    def set_chat_overflow(self, chat_id: int | None, value: str) -> None:
        """Set the chat's overflow choice; "stop" is the default, so it is stored only otherwise."""
        value = value if value in OVERFLOW_CHOICES else "stop"
        if chat_id is None:
            self.new_chat_overflow = value
        else:
            self._guard(self.store.update_chat_settings, chat_id,
                        **{CHAT_OVERFLOW_KEY: None if value == "stop" else value})

    def bind_current_chat(self, binding: dict) -> None:
        """Remember what the current chat runs on (see RemoteBinding.chat_binding)."""
        if self.current_chat_id is not None:
            self._guard(self.store.update_chat, self.current_chat_id, **binding)
