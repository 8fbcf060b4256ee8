"""What the window shows of the open chat and the engine: the conversation (or the empty state),
the header, the context meter, the busy state of the composer and actions, the status line.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

from PySide6.QtCore import QObject, Slot

from .store import StoreError
from .widgets.chat_view import context_used
from .widgets.model_bar import NO_VISION_HINT, escape
from .worker import can_grow_context

log = logging.getLogger(__name__)


def composer_counter(engine):
    """The composer's text -> tokens for a document chip, by `engine`'s own tokenizer, called on
    the job pool only: token_counter counts an empty message first, so it is made at the first
    count, there, not on the UI thread. LocalEngine.count_tokens only reads the tokenizer's
    tables (and the memory of replies, never for a user message), so a count on the pool is safe
    while the worker writes a reply. A count that fails (the model closed meanwhile) leaves the
    chip without its cost, rather than refusing the document."""
    from ..engine.documents.prompt import token_counter

    # two first counts at once make it twice: no harm
    counter = functools.cache(lambda: token_counter(engine.count_tokens))

    def count(text: str) -> int | None:
        try:
            return counter()(text)
        except Exception:  # noqa: BLE001 - the document still attaches, without its cost
            log.warning("counting a document's tokens failed", exc_info=True)
            return None
    return count


def local_models(models_dir: str | None) -> list[tuple[str, str]]:
    """(model, projector) of the loadable models in the models folder (runs as a job)."""
    from ..engine.library.models_folder import scan_models

    return [(str(m.path), str(m.mmproj or "")) for m in scan_models(models_dir)
            if not m.is_projector and m.error is None]


class Conversation(QObject):
    """Shows the session's state on the window's widgets; called whenever it changed."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.session = window.session
        self.local_found: list[tuple[str, str]] | None = None  # models found on this computer
        self.scanning = False
        self.counted_for = None  # the EngineInfo the composer's token counter was made for

    def refresh_view(self) -> None:
        """Show the current chat as the store has it, with the reply being written."""
        w, session = self.window, self.session
        chat = session.read_current()
        messages = session.messages
        streaming_id = session.streaming_id(chat.id if chat else None)
        w.view.show_messages(messages, live=session.live_stats, errors=session.errors,
                             busy=session.pending is not None, streaming_id=streaming_id)
        if streaming_id is not None and session.pending.reasoning:
            w.view.stream_thought(session.pending.reasoning)
        if streaming_id is not None and session.pending.text:
            w.view.stream_text(session.pending.text)
        notice = session.notices.get(session.current_chat_id, "")
        w.view.show_notice(notice)
        queued = self.show_queued()
        if messages or notice or queued:
            w.stack.setCurrentWidget(w.view)
        else:
            self.show_empty_state()
        self.update_header(chat.title if chat else "New chat")
        self.update_busy()
        self.update_context_meter()
        w.tools_switch.update(chat.settings.get("tools") is True if chat else w.tools_switch.new_chat_tools)

    def show_queued(self, progress: float | None = None) -> bool:
        """A message sent here that the worker has not saved yet (it waits for the model to
        load): shown at once, with the load's progress."""
        view, p, loading = self.window.view, self.session.pending, self.session.loading
        if p is None or p.message_id is not None or p.sent is None or not self.session.writing_here():
            view.drop_queued()
            return False
        if loading:
            pct = f" ({int(progress * 100)} %)" if progress is not None else ""
            note = f"Queued: sent when {Path(loading).name} has loaded{pct}"
        else:
            note = "Sending…"
        view.show_queued(*p.sent, note)
        return True

    def update_context_meter(self) -> None:
        """The model bar's meter: the tokens the open chat's last reply left in the context."""
        info = self.session.engine_info
        last = next((m for m in reversed(self.session.messages) if m.prompt_tokens), None)
        used, size = 0, info.context_size if info else 0
        if last is not None:
            live = self.session.live_stats.get(last.id)
            used = context_used(live if live is not None else last, size)
        self.window.model_bar.show_context(used, size)
        self.window.composer.set_context_room(size - used if size else None)

    def show_empty_state(self) -> None:
        w, info, loading = self.window, self.session.engine_info, self.session.loading
        no_model = info is None and not loading
        w.empty.show_state(loaded=info, loading=bool(loading),
                           local_models=self.local_found or [] if no_model else [],
                           on_load=w.model_loading.load_model)
        w.stack.setCurrentWidget(w.empty)
        if no_model and not self.scanning:
            # The models on this computer are looked for off the UI thread (reading their
            # headers imports the GGUF reader); the buttons come when they are found.
            self.scanning = True
            folder = w.settings.models_dir or None
            w.jobs.run(lambda: local_models(folder), self.local_scanned, lambda _error: self.local_scanned([]))

    def local_scanned(self, found: list[tuple[str, str]]) -> None:
        w = self.window
        self.scanning = False
        changed, self.local_found = found != self.local_found, found
        if (changed and w.stack.currentWidget() is w.empty and self.session.engine_info is None
                and not self.session.loading):
            w.empty.show_state(loaded=None, loading=False, local_models=found, on_load=w.model_loading.load_model)

    def update_header(self, title: str | None = None) -> None:
        if title is None:
            title = self.session.title()
        self.window.chat_title.setText(f"<b>{escape(title)}</b>")
        self.window.setWindowTitle(f"{title} — Tramontane" if title else "Tramontane")

    def update_busy(self) -> None:
        # Stop belongs to the chat that is writing; another chat shows Send (which says why
        # it must wait) and the sidebar shows which chat is writing.
        w = self.window
        here = self.session.writing_here()
        can_regenerate = self.session.can_regenerate()
        w.composer.set_busy(here, can_regenerate=can_regenerate)
        if hasattr(w, "stop_action"):
            w.stop_action.setEnabled(here)
            w.regenerate_action.setEnabled(can_regenerate)
        pending = self.session.pending
        w.chat_model.set_writing(pending.chat_id if pending is not None else None)
        w.status_label.setText("Waiting for the model to load…" if here and self.session.loading
                               else "Writing…" if here else "Writing in another chat…" if pending else "")

    def update_model_state(self) -> None:
        w = self.window
        info = self.session.engine_info
        vision = info is not None and info.has_vision
        w.unload_action.setEnabled(info is not None and not info.remote)
        w.projector_action.setEnabled(info is not None and not info.remote)
        w.view.set_can_reply(self.session.can_reply())
        if info is None or info.remote:  # a server's context is not ours to raise
            w.view.set_context(0, info is None)
        else:
            w.view.set_context(info.context_size, can_grow_context(info.context_size, info.context_limit))
        self.update_busy()
        if info is None and self.session.loading:
            w.composer.set_vision(False, "The model is still loading")
        else:
            w.composer.set_vision(vision, "" if vision else NO_VISION_HINT)
        w.composer.set_image_geometry(info.image_geometry if info is not None else None)
        self.update_token_counter(info)
        if w.stack.currentWidget() is w.empty:
            self.show_empty_state()
        w.tools_switch.update()

    def update_token_counter(self, info) -> None:
        """Document chips count with the loaded local model's tokenizer; a server's chat (whose
        tokenizer is not ours) and no model: none (the chip shows its name and pages)."""
        if info is self.counted_for:
            return
        self.counted_for = info
        # the worker's engine, read here only for its count_tokens, which the job pool calls
        # (EngineInfo says local or not: nothing of the engine itself runs on the UI thread)
        engine = self.session.worker.engine if info is not None and not info.remote else None
        self.window.composer.set_token_counter(composer_counter(engine) if engine is not None else None)

    @Slot(int, int, int)
    def on_images_reading(self, request_id: int, done: int, total: int) -> None:
        """The reply being written in the chat on screen encodes its images first."""
        p = self.session.pending
        if p is not None and p.request_id == request_id and p.chat_id == self.session.current_chat_id:
            self.window.view.show_images_reading(done, total)

    @Slot(int, int)
    def on_turns_left_out(self, request_id: int, count: int) -> None:
        """The chat outgrew the context and its overflow choice left turns out of the prompt."""
        p = self.session.pending
        if p is not None and p.request_id == request_id:  # in the status bar: the busy line changes
            self.window.statusBar().showMessage(
                f"The chat is longer than the context: {count} earlier turn{'s' * (count != 1)} "
                f"left out of this reply's prompt (Chat settings)", 30000)

    @Slot(object)
    def on_chat_changed(self, chat_id) -> None:
        self.window.navigation.refresh_chat_list()
        if chat_id == self.session.current_chat_id:
            self.refresh_view()
        else:
            self.update_busy()

    @Slot(str)
    def show_status(self, text: str) -> None:
        self.window.status_label.setText(text)

    def remember_folder(self, kind: str, path: str) -> None:
        """File dialogs start where the user last was, per kind of file (models, images, chats)."""
        try:
            self.window.settings.remember_folder(kind, path)
        except StoreError as exc:
            self.show_status(str(exc))


__all__ = ["Conversation", "composer_counter", "local_models"]
