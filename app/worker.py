"""The one thread that owns the engine.

Engines are not thread-safe and their calls block for a long time (loading weights, a whole
reply), so a single `EngineWorker` living in its own QThread makes every engine call. Widgets
never touch the engine: they call the worker's request methods (which only emit queued
signals into the worker thread) and listen to its typed result signals, which Qt delivers on
the UI thread. The only thing shared across threads is a reply's `threading.Event`, which
the UI sets to stop a reply immediately (the engine checks it between tokens).

While the window serves its local model (app/serving.py), the worker holds a `BatchExecutor` on
it: the API's jobs run at once as sequences of its batch scheduler, whose thread then runs the
model, and the window's own replies go to the same scheduler on the priority lane (a slot kept
for them, their prompt read before anyone else's). The worker still decides what runs on the
engine: it starts and stops the scheduler, and nothing else calls the model meanwhile.

Every failure comes back as a readable message (`failed` / `loadFailed`), never as an
exception in the UI thread.
"""
from __future__ import annotations


import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from ..engine.api import ChatMessage, EngineError, GenerationResult, GenerationStats, ReasoningPiece, SamplingParams
from ..engine.host import private_ram
from ..engine.library.sizes import size_text
from .engine_info import EngineInfo
from .reasoning import Thought

NO_MODEL_LOADED = "No model is loaded: load one from the model bar first."
log = logging.getLogger(__name__)

KV_CACHE_FOLDER = "kv-cache"  # in the data folder: the prefix cache's blocks on disk (runtime/prefix_disk.py)
DOCUMENT_INDEX_FOLDER = "document-index"  # in the data folder: each chat's retrieval index (chat-<id>.sqlite)
API_SLOTS = 8  # API replies decoded at once while the window serves its model (+1 slot kept for the window's)

# Offer the partial reply to the store this often; the store itself writes at most once per
# its checkpoint_interval_s (1 s), so this only bounds the cost of joining the text.
CHECKPOINT_EVERY_S = 0.25


@dataclass
class ChatRequest:
    """One reply to generate. `cancel` is set from the UI thread to stop it.

    Disk writes happen here, on the worker, so a slow disk never stalls the UI:
    `prepare()`, if given, runs first and returns (chat id, messages, reply message id); the
    worker then emits `started` and uses those messages, with the chat id as session key.
    `checkpoint(message id, text so far, thought so far)` is called after every piece (the
    store throttles it to about once a second). When the engine returns, `finish(message id,
    result, text so far, thought)` saves the reply before `finished` is emitted; when it fails,
    `fail(message id, text so far, thought)` saves what is left before `failed` is emitted. The
    thought (app/reasoning.Thought) is a reasoning model's, apart from the answer text."""

    request_id: int
    messages: list[ChatMessage]
    params: SamplingParams
    session_key: str | None
    cancel: threading.Event
    prepare: Callable[[], tuple[int, list[ChatMessage], int]] | None = None
    checkpoint: Callable[[int, str, str], object] | None = None
    finish: Callable[[int, GenerationResult, str, Thought], object] | None = None
    fail: Callable[[int, str, Thought], object] | None = None
    tools: object | None = None  # app.tools.ToolBroker: the reply may call tools (see run_chat)
    overflow: str = "stop"  # when the chat outgrows the context: one of OVERFLOW_CHOICES (fit_overflow)
    documents: object | None = None  # set by the worker: engine/documents' DocumentPrompt, for `finish`


def warm_up_imports() -> None:
    """Import the engine (torch, gguf, tokenizers, Pillow plugins...) on the calling thread.

    The window asks the worker to do it once it is on screen (`EngineWorker.warm_up`): the
    window shows in a fraction of a second instead of after the engine's imports, which hold
    the GIL in long stretches (the first moments after the window shows may stutter instead;
    a model load queued behind it waits for it)."""
    from PIL import Image

    from ..engine.mistral3 import chat_format, image, tokenizer, vision  # noqa: F401
    from ..engine.remote import client  # noqa: F401
    from ..engine.runtime import generate, local  # noqa: F401

    Image.init()  # Pillow loads its format plugins lazily otherwise


def _process_rss() -> int:
    """Resident memory of this process in bytes (0 when the OS does not say cheaply)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def memory_words(device: str) -> str:
    """The memory the process holds, in words ('551.9 MB RAM (process)', or the GPU's)."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            used = torch.cuda.memory_allocated()
            total = torch.cuda.get_device_properties(0).total_memory
            return f"{size_text(used)} of {size_text(total)} GPU"
    rss = _process_rss()
    return f"{size_text(rss)} RAM (process)" if rss else ""


def describe_engine(engine, model_path: str = "", mmproj_path: str = "", context_asked: int = 0) -> EngineInfo:
    device = engine.device_kind
    plan = engine.placement
    return EngineInfo(
        description=engine.description,
        has_vision=bool(engine.has_vision),
        model_path=model_path,
        mmproj_path=mmproj_path,
        device=device,
        memory=memory_words(device) if device != "remote" else "",
        context_size=int(engine.context_size),
        context_limit=int(engine.context_limit),
        context_asked=context_asked,
        remote=device == "remote",
        placement=str(plan.get("summary", "")),
        split=bool(plan.get("gpu_layers")) and bool(plan.get("cpu_layers")),
        image_geometry=engine.image_geometry,
        can_think=engine.think_ids is not None,
        chat_version=int(engine.chat_version),
    )


def new_images(messages) -> int:
    """The images of the turn being answered (after the last reply): the ones the vision tower
    reads before the prompt (earlier turns' are in the KV cache or the tower's own cache)."""
    from ..engine.api import ImagePart

    last_reply = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    parts = [m.parts if isinstance(m.parts, list) else [m.parts] for m in messages[last_reply + 1:]]
    return sum(isinstance(part, ImagePart) for turn in parts for part in turn)


def thought_cut(engine, result: GenerationResult) -> bool:
    """Whether a reply's thought was cut off before its [/THINK] (Stop or Max tokens while it
    thought): read from the generated ids where the tokenizer names the think tokens; else a
    reply that wrote no answer and did not end by itself."""
    ids = engine.think_ids
    if ids is not None and result.token_ids:
        return ids[1] not in result.token_ids
    return not result.text and result.finish_reason != "stop"


class _Stopped(Exception):
    """Stop was asked between two images, or a load was cancelled between two layers."""


# What a chat does when it outgrows the context (the chat's settings, "overflow"): stop with a
# sentence (too_long_words), leave out its oldest turns, or keep its first turn and the latest.
OVERFLOW_CHOICES = {"stop": "Stop and say so",
                    "drop_oldest": "Leave out the oldest turns",
                    "keep_first": "Keep the first turn and the latest ones"}


def turns(messages) -> tuple[list, list[list]]:
    """(system messages, turns): a turn is a user message with the replies and tool results
    after it, so a reply is never left without the question it answers."""
    system = [m for m in messages if m.role == "system"]
    out: list[list] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "user" or not out:
            out.append([])
        out[-1].append(m)
    return system, out


def fit_overflow(engine, messages, max_tokens: int, policy: str) -> tuple[list, int]:
    """(messages, turns left out): with `policy` 'drop_oldest' or 'keep_first', the fewest
    whole turns left out (never the system prompt or the turn being answered) so that the
    prompt fits by the engine's own rule (prompts.check_fits). Unchanged when it fits, when
    the policy is 'stop', when the engine cannot count (a server), or when even the shortest
    choice does not fit (the engine's sentence then says so)."""
    from ..engine.runtime.prompts import check_fits

    size = int(engine.context_size or 0)
    if policy not in ("drop_oldest", "keep_first") or not size or not messages:
        return messages, 0

    def fits(candidate) -> bool | None:
        n = engine.count_tokens(candidate)
        if n is None:
            return None
        try:
            check_fits(n, max_tokens, size)
        except EngineError:
            return False
        return True

    if fits(messages) is not False:
        return messages, 0
    system, chat = turns(messages)
    keep_first = policy == "keep_first" and len(chat) > 2
    head, middle = (chat[:1], chat[1:-1]) if keep_first else ([], chat[:-1])

    def without(k: int) -> list:  # the first k turns of `middle` left out
        return system + [m for t in head + middle[k:] + chat[-1:] for m in t]

    if not middle or not fits(without(len(middle))):
        return messages, 0
    lo, hi = 1, len(middle)  # the fewest turns to leave out: fits(without(hi)) holds
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(without(mid)):
            hi = mid
        else:
            lo = mid + 1
    return without(hi), hi


def can_grow_context(context_size: int, context_limit: int) -> bool:
    """Whether raising Settings' context length would give more room (not at the file's limit)."""
    return context_size > 0 and (context_limit == 0 or context_size < context_limit)


def too_long_words(engine, messages) -> str:
    """When the prompt does not fit the context: advice that can work, in words ('' when it
    fits or cannot be counted). One message longer than the context cannot be helped by a new
    chat; a conversation can; raising the context only below the file's own limit."""
    size = int(engine.context_size)
    if not size or not messages:
        return ""
    try:
        total = engine.count_tokens(messages)
        if total is None or total < size:
            return ""
        last = engine.count_tokens([m for m in messages if m.role == "system"] + [messages[-1]])
    except Exception:  # noqa: BLE001 - the engine's own message stands then
        return ""
    limit = int(engine.context_limit)
    raise_it = (f"raise the context length in Settings (this model allows up to {limit} tokens)"
                if can_grow_context(size, limit) and limit else
                "raise the context length in Settings" if can_grow_context(size, limit) else "")
    if last >= size:
        advice = "shorten it or send it in parts" + (f", or {raise_it}" if raise_it else "")
        return (f"This message is {last} tokens: with its reply it does not fit the model's "
                f"context of {size} tokens. {advice[0].upper()}{advice[1:]}.")
    advice = ("branch from an earlier message or start a new chat"
              + (f", or {raise_it}" if raise_it else ""))
    return (f"The conversation is {total} tokens, more than the model's context of {size} "
            f"tokens. {advice[0].upper()}{advice[1:]}.")


def _cancelled() -> GenerationResult:
    """The result of a reply stopped before the engine was asked."""
    return GenerationResult("", [], [], GenerationStats(finish_reason="cancelled"))


class _ReplyStream:
    """One reply on its way to the window: its answer's pieces and thought as they stream
    (`on_piece`, on the engine's thread), saved into its row every CHECKPOINT_EVERY_S (the first
    piece at once); a round of tool calls moves it to a new row (`new_reply`)."""

    def __init__(self, worker: "EngineWorker", req: ChatRequest, chat_id: int | None, message_id: int | None):
        self.worker, self.req = worker, req
        self.chat_id, self.message_id = chat_id, message_id
        self.pieces: list[str] = []
        self.thought = Thought()
        self.last_save = float("-inf")

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def on_piece(self, text: str) -> None:
        rid = self.req.request_id
        if isinstance(text, ReasoningPiece):  # the thought streams apart (a str across the signal)
            self.thought.add(text, time.monotonic())
            self.worker.thoughtPiece.emit(rid, str(text))
        else:
            self.thought.answered(time.monotonic())
            self.worker.piece.emit(rid, text)
            self.pieces.append(text)
        if self.req.checkpoint is None or self.message_id is None:
            return
        now = time.monotonic()
        if now - self.last_save < CHECKPOINT_EVERY_S:
            return
        self.last_save = now
        try:
            self.req.checkpoint(self.message_id, self.text, self.thought.text)
        except Exception:  # noqa: BLE001 - a failed save must not stop the reply
            log.exception("checkpointing the reply failed")

    def on_prompt_progress(self, read: int, total: int) -> None:
        self.worker.promptProgress.emit(self.req.request_id, int(read), int(total))

    def new_reply(self, reply_id: int) -> None:
        """A round of tool calls is saved; the reply goes on in a new row."""
        self.message_id = reply_id
        self.pieces.clear()
        self.thought = Thought()
        self.last_save = float("-inf")
        self.worker.started.emit(self.req.request_id, self.chat_id, reply_id)


class EngineWorker(QObject):
    """Lives in its own QThread (see `start()`); owns at most one engine at a time."""

    # -- results, delivered on the UI thread -------------------------------------------------
    loadProgress = Signal(float, str)  # fraction 0..1, what is loading
    loaded = Signal(object)  # EngineInfo
    loadFailed = Signal(str)  # readable message
    loadCancelled = Signal(str)  # the model whose load was cancelled (cancel_load); nothing is loaded
    # before `loaded`, for a load asked with a draft model: (model, the draft loaded or '', why it
    # was not: one sentence naming the file, or '')
    draftOutcome = Signal(str, str, str)
    unloaded = Signal()
    started = Signal(int, int, int)  # request id, chat id, reply message id (after prepare)
    piece = Signal(int, str)  # request id, a piece of reply text (the answer)
    thoughtPiece = Signal(int, str)  # request id, a piece of a reasoning model's thought (before the answer)
    finished = Signal(int, object)  # request id, GenerationResult (stats inside)
    failed = Signal(int, str)  # request id, readable message
    promptProgress = Signal(int, int, int)  # request id, prompt tokens read, of how many (before the first piece)
    imagesReading = Signal(int, int, int)  # request id, images of the new turn encoded, of how many (before the prompt)
    turnsLeftOut = Signal(int, int)  # request id, the chat's oldest turns left out to fit the context (its overflow choice)
    documentsPlaced = Signal(int, object)  # request id, engine/documents' DocumentPrompt (modes, sources, notes)

    # -- requests, queued into the worker thread ---------------------------------------------
    _loadRequested = Signal(str, str, str, int, int, object, str)  # model, mmproj ('' none), device, context (0 default), GPU layers (-1 auto), its cancel Event, draft ('' none)
    _remoteRequested = Signal(object)  # a ready-made engine object (RemoteEngine)
    _chatRequested = Signal(object)  # ChatRequest
    _unloadRequested = Signal()
    _forgetRequested = Signal(str, object)  # session key, the deleted chat's messages
    _warmUpRequested = Signal()
    _servingRequested = Signal(bool)
    warmedUp = Signal(float)  # seconds the engine's imports took (on the worker)

    def __init__(self, kv_disk_dir: str | Path | None = None, documents_dir: str | Path | None = None):
        """kv_disk_dir: where a local model keeps the KV blocks of recent chats, so a chat
        reopened after a restart is not read again (None: in memory only). documents_dir: where
        each chat keeps the retrieval index of its long documents (None: one for each reply)."""
        super().__init__()
        self.engine = None  # touched only in the worker thread
        self.kv_disk_dir = kv_disk_dir
        self.documents_dir = Path(documents_dir) if documents_dir is not None else None
        self._serving = False  # the window's API server is on (worker thread)
        self._batch = None  # BatchExecutor on the local engine while serving; set on the worker thread
        self._batch_lock = threading.Lock()
        self._thread: QThread | None = None
        self._load_cancel = threading.Event()  # the latest load's (set from the UI thread: cancel_load)
        self._servingRequested.connect(self._set_serving)
        self._loadRequested.connect(self._load)
        self._remoteRequested.connect(self._use_engine)
        self._chatRequested.connect(self._chat)
        self._unloadRequested.connect(self._unload)
        self._forgetRequested.connect(self._forget)
        self._warmUpRequested.connect(self._warm_up)

    # -- lifetime (UI thread) ----------------------------------------------------------------
    def start(self) -> QThread:
        # The worker runs Python between torch calls; a short switch interval lets the UI
        # thread take the GIL within ~1 ms when it has an event to handle (default 5 ms).
        if sys.getswitchinterval() > 0.001:
            sys.setswitchinterval(0.001)
        thread = QThread()
        thread.setObjectName("tramontane-engine")
        self.moveToThread(thread)
        thread.start()
        self._thread = thread
        return thread

    def stop(self, timeout_ms: int = 30000) -> None:
        """Unload and end the thread; waits for the current job (cancel it first)."""
        if self._thread is None:
            return
        self._unloadRequested.emit()
        self._thread.quit()
        if not self._thread.wait(timeout_ms):
            log.warning("engine thread did not stop within %d ms", timeout_ms)
        self._thread = None

    # -- requests (UI thread) ----------------------------------------------------------------
    def load(self, model_path: str | Path, mmproj_path: str | Path | None = None,
             device: str = "auto", context_length: int | None = None,
             gpu_layers: int | None = None, draft_model: str | Path | None = None) -> None:
        """`gpu_layers`: Settings' "GPU layers: N" (the last N layers on the GPU); None: planned.
        `draft_model`: a file to draft with (speculation 'draft'); the model loads without it,
        saying why (`draftOutcome`), when it cannot draft for the model or fails to load."""
        self._load_cancel = cancel = threading.Event()  # a load asked earlier keeps its own
        self._loadRequested.emit(str(model_path), str(mmproj_path or ""), device or "auto",
                                 int(context_length or 0), -1 if gpu_layers is None else int(gpu_layers), cancel,
                                 str(draft_model or ""))

    def cancel_load(self) -> None:
        """Stop the load under way (or queued) at its next layer: `loadCancelled` follows, with
        nothing loaded (the previous model was closed when the load began)."""
        self._load_cancel.set()

    def use_engine(self, engine) -> None:
        """Switch to an engine built elsewhere (a RemoteEngine: its constructor does no I/O)."""
        self._remoteRequested.emit(engine)

    def chat(self, request: ChatRequest) -> None:
        self._chatRequested.emit(request)

    def unload(self) -> None:
        self._unloadRequested.emit()

    def warm_up(self) -> None:
        """Import the engine on the worker thread (the window calls this once it shows)."""
        self._warmUpRequested.emit()

    @Slot()
    def _warm_up(self) -> None:
        t0 = time.perf_counter()
        try:
            warm_up_imports()
        except Exception:  # noqa: BLE001 - a load reports what is missing, in words
            log.exception("importing the engine failed")
        self.warmedUp.emit(time.perf_counter() - t0)

    def forget_chat(self, key: str, messages=()) -> None:
        """A chat was deleted: its KV goes, and what the engine cached of its content (prefix
        blocks, in memory and on disk; its replies' ids) with it."""
        self._forgetRequested.emit(key, list(messages))

    def serve(self, on: bool) -> None:
        """The window's API server is on (or off): while it is, a local model's replies, the
        window's and the API's, are generated together by a batch scheduler (see the module's
        docstring). Queued behind what was asked before, like every request."""
        self._servingRequested.emit(bool(on))

    def batch_executor(self):
        """The BatchExecutor the API's jobs go to now, or None (any thread; it may be shut down
        by the time a job reaches it: its submit then fails)."""
        with self._batch_lock:
            return self._batch

    # -- the work (worker thread) ------------------------------------------------------------
    @Slot(bool)
    def _set_serving(self, on: bool) -> None:
        self._serving = on
        if on:
            self._start_batch()
        else:
            self._stop_batch()

    def _start_batch(self) -> None:
        """A batch scheduler on the loaded local engine, if serving and there is none yet."""
        from ..engine.runtime.local import LocalEngine

        if not self._serving or self._batch is not None or not isinstance(self.engine, LocalEngine):
            return
        from ..engine.server.executor import BatchExecutor

        try:
            batch = BatchExecutor(self.engine, slots=API_SLOTS)
        except EngineError as exc:  # e.g. the GPU's planned context is too small to share
            log.warning("the API server answers one request at a time: %s", exc)
            return
        with self._batch_lock:
            self._batch = batch

    def _stop_batch(self) -> None:
        """Stop the scheduler: what the API runs or queues on it fails (a 503 saying the model
        was unloaded or changed, no file named), then its threads end."""
        with self._batch_lock:
            batch, self._batch = self._batch, None
        if batch is not None:
            batch.shutdown()

    def _close_engine(self) -> None:
        self._stop_batch()  # before the engine it runs on
        engine, self.engine = self.engine, None
        if engine is not None:
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - closing must never take the app down
                log.exception("closing the engine failed")

    @Slot(str, str, str, int, int, object, str)
    def _load(self, model_path: str, mmproj_path: str, device: str, context_length: int,
              gpu_layers: int = -1, cancel: threading.Event | None = None, draft_model: str = "") -> None:
        from ..engine.library.fit import gpu_layers_device_map
        from ..engine.runtime.local import LocalEngine
        from .draft_models import draft_refusal

        cancel = cancel or threading.Event()
        self._close_engine()
        if cancel.is_set():  # cancelled while it waited behind another job
            self.loadCancelled.emit(model_path)
            return
        before = private_ram()  # not the RSS: the mapped file's pages count as available already

        def progress(frac: float, what: str) -> None:
            # Raised between layers: the half-built model is dropped with the exception. Not at
            # the end (1.0): the engine is whole then and is closed like any other.
            if cancel.is_set() and frac < 1.0:
                raise _Stopped
            self.loadProgress.emit(float(frac), str(what))

        def new_engine(draft: str) -> LocalEngine:
            return LocalEngine(model_path, mmproj_path or None, device=device,
                               context_length=context_length or None,
                               device_map=gpu_layers_device_map(model_path, gpu_layers, device),
                               kv_disk_dir=self.kv_disk_dir, progress=progress, draft_model=draft or None)

        draft, draft_failed = draft_model, ""
        if draft:  # checked from the files before minutes of loading: a refused draft costs nothing
            draft_failed = draft_refusal(model_path, draft)
            draft = "" if draft_failed else draft
        try:
            engine, draft_error = self._engine_with_draft(new_engine, draft, cancel)
            if draft_error:
                draft, draft_failed = "", f"{Path(draft).name} did not load ({draft_error})"
        except _Stopped:
            self._after_cancelled_load(model_path)
            return
        except EngineError as exc:
            self.loadFailed.emit(str(exc))
            return
        except MemoryError:
            self.loadFailed.emit(f"{Path(model_path).name}: not enough memory to load this model")
            return
        except Exception as exc:  # noqa: BLE001 - shown in words, logged in full
            log.exception("loading %s failed", model_path)
            self.loadFailed.emit(f"{Path(model_path).name}: cannot load: {type(exc).__name__}: {exc}")
            return
        if cancel.is_set():
            self.engine = engine
            self._close_engine()
            self._after_cancelled_load(model_path)
            return
        self.engine = engine
        self._start_batch()
        if draft_model:
            self.draftOutcome.emit(model_path, draft, f"{Path(model_path).name} loaded without its draft model: "
                                                      f"{draft_failed}." if draft_failed else "")
        info = describe_engine(engine, model_path, mmproj_path, context_length)
        self.loaded.emit(replace(info, resident_bytes=max(0, private_ram() - before) if before else 0))

    def _engine_with_draft(self, new_engine, draft: str, cancel: threading.Event):
        """(engine, '') built with `draft` ('' none); when that fails, (the engine built without
        it, what went wrong) if the model loads alone; the model's own failure raises."""
        if not draft:
            return new_engine(""), ""
        try:
            return new_engine(draft), ""
        except _Stopped:
            raise
        except Exception as exc:  # noqa: BLE001 - the draft is read last: the model is tried alone
            log.warning("loading with the draft %s failed: %s", draft, exc)
            error = "not enough memory" if isinstance(exc, MemoryError) else str(exc).rstrip(".") or type(exc).__name__
        # out of the handler: the half-built engine (in the exception's frames) goes before the retry
        self._free_half_built()
        if cancel.is_set():
            raise _Stopped
        self.loadProgress.emit(0.0, "loading again without the draft model")
        return new_engine(""), error

    @staticmethod
    def _free_half_built() -> None:
        """What a failed or cancelled load read goes back to the system."""
        import gc

        gc.collect()  # the half-built model's tensors are in reference cycles of the exception's frames
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - only tidying
            log.exception("freeing a half-built model's GPU memory failed")

    def _after_cancelled_load(self, model_path: str) -> None:
        """The weights read so far go back to the system before the window is told."""
        self._free_half_built()
        self.loadCancelled.emit(model_path)

    @Slot(object)
    def _use_engine(self, engine) -> None:
        self._close_engine()
        self.engine = engine
        self._start_batch()
        self.loaded.emit(describe_engine(engine))

    @Slot()
    def _unload(self) -> None:
        had = self.engine is not None
        self._close_engine()
        if had:
            self.unloaded.emit()

    def document_index_path(self, key: str | None) -> Path | None:
        """The chat's retrieval index file (None: no folder for them, or no chat)."""
        if self.documents_dir is None or key is None or not key.isdigit():
            return None  # a chat's key is its id
        return self.documents_dir / f"chat-{key}.sqlite"

    @Slot(str, object)
    def _forget(self, key: str, messages: list) -> None:
        index = self.document_index_path(key)
        if index is not None:
            index.unlink(missing_ok=True)  # the chat's documents go with it (their files: the store's)
        if self.engine is None:
            return
        for forget, arg in ((self.engine.forget_session, key), (self.engine.forget_chat, messages)):
            try:
                forget(arg)
            except Exception:  # noqa: BLE001 - the chat is deleted from the store either way
                log.exception("%s failed", forget.__name__)

    @Slot(object)
    def _chat(self, req: ChatRequest) -> None:
        """One reply: the message saved, its documents placed, the prompt fitted to the context,
        the new images encoded, then the engine's reply streamed and saved."""
        if self.engine is None:
            self.failed.emit(req.request_id, NO_MODEL_LOADED)
            return
        # while serving, the window's reply is a sequence of the batch, on the priority lane
        engine = self._batch.priority if self._batch is not None else self.engine
        saved = self._save_message(req)
        if saved is None:
            return
        stream = _ReplyStream(self, req, *saved)
        if req.cancel.is_set():  # stopped while it waited behind a load
            self._finish(req, stream.message_id, _cancelled(), "", stream.thought)
            return
        if any(m.documents for m in req.messages) and not self._place_documents(req, stream):
            return
        req.messages, left_out = fit_overflow(engine, req.messages, req.params.max_tokens, req.overflow)
        if left_out:
            self.turnsLeftOut.emit(req.request_id, left_out)
        try:
            if not self._encode_new_images(req):
                self._finish(req, stream.message_id, _cancelled(), "", stream.thought)
                return
            result = self._generate(engine, req, stream)
        except Exception as exc:  # noqa: BLE001 - in words (_failure_words): an engine bug must not crash the app
            self._fail(req, stream.message_id, stream.text, self._failure_words(engine, req, exc),
                       stream.thought.ended(time.monotonic(), not stream.pieces))
            return
        self._finish(req, stream.message_id, result, stream.text,
                     stream.thought.ended(time.monotonic(), thought_cut(self.engine, result)))

    def _save_message(self, req: ChatRequest) -> tuple[int | None, int | None] | None:
        """(chat id, reply row id) once the user's message is saved (`req.prepare`, which gives
        the messages the reply reads) and the window told (`started`); (None, None) for a
        request that saves nothing; None when the save failed (said by `failed`)."""
        if req.prepare is None:
            return None, None
        try:
            chat_id, req.messages, message_id = req.prepare()
        except Exception as exc:  # noqa: BLE001 - StoreError and the like, in words
            log.exception("saving the message failed")
            self.failed.emit(req.request_id, f"Could not save the message: {exc}")
            return None
        req.session_key = str(chat_id)
        self.started.emit(req.request_id, chat_id, message_id)
        return chat_id, message_id

    def _place_documents(self, req: ChatRequest, stream: "_ReplyStream") -> bool:
        """The messages' documents in the prompt's form (`_documents_prompt`); False when
        reading them failed, said as the reply's failure."""
        try:
            req.messages = self._documents_prompt(req)
            return True
        except EngineError as exc:  # DocumentError: the file's one sentence
            words = str(exc) or type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - a reader bug must not crash the app
            log.exception("reading the documents failed")
            words = f"Reading the documents failed: {type(exc).__name__}: {exc}"
        self._fail(req, stream.message_id, "", words, stream.thought)
        return False

    @staticmethod
    def _generate(engine, req: ChatRequest, stream: "_ReplyStream") -> GenerationResult:
        """The engine's reply, streamed into `stream`: through the tool loop for a chat with
        tools (each round of calls saved, the reply going on in a new row), else one call."""
        if req.tools is not None and stream.chat_id is not None and stream.message_id is not None:
            result, stream.message_id = req.tools.run_chat(
                engine, stream.chat_id, req.messages, req.params, on_piece=stream.on_piece, cancel=req.cancel,
                session_key=req.session_key, reply_id=stream.message_id, new_reply=stream.new_reply,
                on_prompt_progress=stream.on_prompt_progress)
            return result
        return engine.chat(req.messages, req.params, on_piece=stream.on_piece,
                           cancel=req.cancel, session_key=req.session_key,
                           on_prompt_progress=stream.on_prompt_progress)

    @staticmethod
    def _failure_words(engine, req: ChatRequest, exc: Exception) -> str:
        """What a failed reply says: the engine's sentence (or, for a prompt past the context,
        what to do), memory's advice, or an unexpected error by its type (logged)."""
        if isinstance(exc, EngineError):
            return too_long_words(engine, req.messages) or str(exc) or type(exc).__name__
        if isinstance(exc, MemoryError):
            return "Out of memory while generating: shorten the chat or lower the context length"
        log.exception("generation failed")
        return f"The engine failed: {type(exc).__name__}: {exc}"

    def _encode_new_images(self, req: ChatRequest) -> bool:
        """Encode the new turn's images here, one at a time, saying how far it is
        (`imagesReading`): minutes on a CPU for large photos, which the engine's own call does in
        one go without a word. The tower keeps them by content, so the reply's call finds them
        encoded. False when Stop was asked meanwhile."""
        count = new_images(req.messages) if self.engine.has_vision else 0
        if not count:
            return not req.cancel.is_set()

        def progress(done: int, total: int) -> None:
            self.imagesReading.emit(req.request_id, done, total)
            if req.cancel.is_set() and done < total:
                raise _Stopped

        try:
            self.engine.encode_images(req.messages, count, progress)
        except _Stopped:
            return False
        return not req.cancel.is_set()

    def _documents_prompt(self, req: ChatRequest) -> list[ChatMessage]:
        """The messages with their documents in the prompt's form (engine/documents/prompt.py:
        whole, or retrieved from the chat's index), told to the window (`documentsPlaced`)."""
        from ..engine.documents.prompt import engine_documents_prompt
        from ..engine.documents.retrieval import DocumentIndex
        from ..engine.private_files import make_private_dir

        path = self.document_index_path(req.session_key)
        index = None
        if path is not None:
            make_private_dir(path.parent)
            index = DocumentIndex(path)
        try:
            prompt = engine_documents_prompt(self.engine, req.messages, req.params.max_tokens, index, req.cancel)
        finally:
            if index is not None:
                index.close()
        req.documents = prompt  # its sources are saved with the reply (`finish`)
        self.documentsPlaced.emit(req.request_id, prompt)
        return prompt.messages

    def _finish(self, req: ChatRequest, message_id: int | None, result: GenerationResult, so_far: str,
                thought: Thought) -> None:
        """Save the reply (here, on the worker), then say it is done; a failed save is a failure.
        A reply stopped before its first token (while the prompt was read, or waiting behind a
        load) is not kept: no empty "stopped" bubble, and a regenerated one is back to its
        previous version (`fail` with nothing written drops it)."""
        stopped_empty = (result.stats.finish_reason == "cancelled" and not result.text
                         and not result.token_ids and not so_far and not thought.text)
        if stopped_empty and req.fail is not None and message_id is not None:
            try:
                req.fail(message_id, "", thought)
            except Exception:  # noqa: BLE001 - the stop stands; the empty row is only untidy
                log.exception("dropping the stopped reply failed")
            self.finished.emit(req.request_id, result)
            return
        if req.finish is not None and message_id is not None:
            try:
                req.finish(message_id, result, so_far, thought)
            except Exception as exc:  # noqa: BLE001 - StoreError and the like, in words
                log.exception("saving the reply failed")
                self.failed.emit(req.request_id, f"Could not save the reply: {exc}")
                return
        self.finished.emit(req.request_id, result)

    def _fail(self, req: ChatRequest, message_id: int | None, so_far: str, message: str, thought: Thought) -> None:
        """Save what is left of the reply (its answer and thought), then report `message`."""
        if req.fail is not None and message_id is not None:
            try:
                req.fail(message_id, so_far, thought)
            except Exception as exc:  # noqa: BLE001
                log.exception("saving the failed reply failed")
                message = f"{message} ({exc})"
        self.failed.emit(req.request_id, message)
