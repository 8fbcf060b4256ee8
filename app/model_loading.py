"""Loading and unloading the local model from the window: check a picked file first (off the UI
thread), then load it on the engine worker; the worker's answers shown on the model bar, the
composer and the chats.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Slot
from PySide6.QtWidgets import QFileDialog

from .engine_info import EngineInfo
from .model_files import why_not_a_model
from .widgets.model_bar import device_line, device_tip
from .worker import memory_words

GGUF_FILTER = "GGUF models (*.gguf)"


def pairing_note(model_path: str) -> str:
    """Which projectors beside the model were refused and why ('' none), for a model that
    loads without one (runs as a job: it reads their headers)."""
    from ..engine.library.projector import pair_projector

    return pair_projector(model_path).note
MEMORY_REFRESH_MS = 2000


class ModelLoading(QObject):
    """The check-then-load flow and the worker's load signals, on the UI thread."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.session = window.session
        self.settings = window.settings
        self.worker = window.worker
        self.checking_model: str | None = None  # a picked file whose header a job is reading
        # What was said about the model that stops being true once another loads: load
        # failures, a refused file ("… stays loaded"), replies that failed on this model
        # ("more than the model's context of 256"), in the composer and as chat notices.
        self.load_errors: set[str] = set()
        self.session.replyFailed.connect(self.load_errors.add)
        self.projector_note = ("", "")  # (model, why its neighbours were refused) of the load under way
        self.projector_picker = None  # Model ▸ Projector…'s dialog while it is open
        self.model_offer = None  # "open it as the model?" for a dropped .gguf, while it asks
        self.before_load: tuple[str, str] | None = None  # (model, projector) loaded when the load began
        # The draft model (Settings ▸ Speculative decoding) the latest load asked for ('' none),
        # and what the worker said of it: (model, the draft loaded or '', why not or '').
        self.draft_asked = ""
        self.draft_outcome = ("", "", "")
        self.worker.draftOutcome.connect(self.on_draft_outcome)
        self.worker.loadProgress.connect(self.on_load_progress)
        self.worker.loaded.connect(self.on_loaded)
        self.worker.loadFailed.connect(self.on_load_failed)
        self.worker.loadCancelled.connect(self.on_load_cancelled)
        self.worker.unloaded.connect(self.on_unloaded)
        # The model bar's memory figure follows the process (it grows as pages are touched).
        self.memory_timer = QTimer(self)
        self.memory_timer.setInterval(MEMORY_REFRESH_MS)
        self.memory_timer.timeout.connect(self.refresh_memory)
        self.memory_timer.start()

    def refresh_memory(self) -> None:
        info = self.session.engine_info
        if info is None or info.remote:
            return
        memory = memory_words(info.device)
        if memory and memory != info.memory:
            self.session.engine_info = info = replace(info, memory=memory)
            self.window.model_bar.device_label.setText(device_line(info))
            self.window.model_bar.device_label.setToolTip(device_tip(info))

    def load_last_model(self) -> bool:
        model, mmproj = self.settings.last_model
        if model and Path(model).is_file():
            # Loaded before: not read again here (at start that would import the GGUF reader
            # before the window shows); the worker says it in words if the file changed.
            self.load_model(model, mmproj if mmproj and Path(mmproj).is_file() else "", check=False)
            return True
        return False

    def load_model(self, model_path: str, mmproj_path: str = "", check: bool = True) -> None:
        """Load a local GGUF (and its projector) on the worker; the bar shows progress. With
        `check`, a file that is not a model is refused first, in words, and the loaded model
        stays (check_then_load)."""
        if check:
            self.check_then_load(model_path, lambda: mmproj_path)
        else:
            self.start_load(model_path, mmproj_path)

    def check_then_load(self, model_path: str, projector: Callable[[], str]) -> None:
        """Read the file's header, and `projector()` when it is a model, on a job: a slow or
        network disk must not freeze the window. Then load it, or refuse it in words with the
        loaded model kept. A model chosen meanwhile wins over this one."""
        self.checking_model = model_path

        def check() -> tuple[str, str, str]:
            why_not = why_not_a_model(model_path)
            mmproj = "" if why_not else projector()
            return why_not, mmproj, "" if why_not or mmproj else pairing_note(model_path)

        self.window.jobs.run(
            check, lambda outcome: self.checked(model_path, *outcome),
            lambda error: self.checked(model_path, f"Cannot read “{Path(model_path).name}”: {error}", ""))

    def checked(self, model_path: str, why_not: str, mmproj_path: str, note: str = "") -> None:
        """`note`: why the projectors beside a model that loads without one were refused."""
        if self.checking_model != model_path:
            return  # another model was chosen while this one was read
        self.checking_model = None
        if why_not:
            info = self.session.engine_info
            if info is not None:
                why_not += f" {Path(info.model_path).name if not info.remote else info.description} stays loaded."
            self.load_errors.add(why_not)
            self.window.composer.show_message(why_not)
            return
        self.start_load(model_path, mmproj_path)
        self.projector_note = (model_path, note)

    def start_load(self, model_path: str, mmproj_path: str) -> None:
        w = self.window
        self.checking_model = None
        self.projector_note = ("", "")
        if self.session.pending is not None:
            self.session.pending.cancel.set()
        info = self.session.engine_info
        if info is not None and not info.remote:  # what Cancel brings back
            self.before_load = (info.model_path, info.mmproj_path)
        elif info is not None or not self.session.loading:  # a server's model, or none: nothing to reload
            self.before_load = None
        self.session.loading = str(model_path)
        self.session.engine_info = None
        w.reload_button.hide()
        if w.model_bar.model_combo is not None:
            combo = w.model_bar.model_combo
            combo.blockSignals(True)
            combo.setCurrentIndex(0)
            combo.blockSignals(False)
        w.model_bar.show_loading(Path(model_path).name)
        w.conversation.update_model_state()
        self.draft_asked, self.draft_outcome = self.settings.draft_to_load, ("", "", "")
        self.worker.load(model_path, mmproj_path or None, self.settings.device,
                         self.settings.context_length or None, self.settings.gpu_layers, self.draft_asked)

    def open_model_file(self) -> None:
        start = self.settings.last_folder("models") or self.settings.models_dir or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self.window, "Open a GGUF model", start, GGUF_FILTER)
        if path:
            self.window.conversation.remember_folder("models", path)
            self.open_as_model(path)

    def open_as_model(self, path: str) -> None:
        """Load `path` with the projector the pairing rule finds beside it (the refused ones
        named when it loads)."""
        from ..engine.library.projector import find_projector

        self.check_then_load(path, lambda: str(find_projector(path) or ""))

    def offer_model_file(self, path: str) -> None:
        """A .gguf dropped on the window: ask whether to load it as the model."""
        from PySide6.QtWidgets import QMessageBox

        box = QMessageBox(QMessageBox.Icon.Question, "Open as the model?",
                          f"{Path(path).name} is a model file, not an image. Load it as the model?",
                          QMessageBox.StandardButton.Open | QMessageBox.StandardButton.Cancel, self.window)
        box.setDefaultButton(QMessageBox.StandardButton.Open)
        box.finished.connect(lambda result: self._offer_answered(path, result))
        self.model_offer = box
        box.open()

    def _offer_answered(self, path: str, result: int) -> None:
        from PySide6.QtWidgets import QMessageBox

        self.model_offer = None
        if result == QMessageBox.StandardButton.Open:
            self.window.conversation.remember_folder("models", path)
            self.open_as_model(path)

    def choose_projector(self) -> None:
        """Model ▸ Projector…: the projectors that fit the loaded model (read off the UI
        thread), or none; the model loads again with the one chosen."""
        info = self.session.engine_info
        if info is None or info.remote or self.projector_picker is not None:
            return
        from ..engine.library.projector import projector_choices

        model = info.model_path
        self.window.jobs.run(lambda: projector_choices(model), lambda choices: self._pick_projector(model, choices),
                             self.window.conversation.show_status)

    def _pick_projector(self, model: str, choices: list) -> None:
        from .widgets.projector_picker import ProjectorPicker

        info = self.session.engine_info
        if info is None or info.model_path != model:
            return  # another model was loaded meanwhile
        picker = ProjectorPicker(model, info.mmproj_path, choices, self.window)
        picker.accepted.connect(lambda: self._projector_chosen(model, picker.chosen()))
        picker.finished.connect(lambda _result: setattr(self, "projector_picker", None))
        self.projector_picker = picker
        picker.open()

    def _projector_chosen(self, model: str, mmproj: str) -> None:
        info = self.session.engine_info
        if info is not None and info.model_path == model and info.mmproj_path != mmproj:
            self.start_load(model, mmproj)  # chosen by hand: no note about the neighbours

    def cancel_load(self) -> None:
        """The model bar's Cancel while a model loads: the worker stops it at its next layer
        (`on_load_cancelled` then loads the model there was before, if any)."""
        if not self.session.loading:
            return
        self.window.model_bar.show_cancelling()
        self.worker.cancel_load()

    @Slot(str)
    def on_load_cancelled(self, model_path: str) -> None:
        if self.session.loading != model_path:
            return  # another load was asked meanwhile: it stands
        w = self.window
        self.session.loading = None
        previous, self.before_load = self.before_load, None
        words = f"Loading {Path(model_path).name} was cancelled"
        if self.session.pending is not None:
            self.session.pending.cancel.set()
        if previous is not None and Path(previous[0]).is_file():
            w.statusBar().showMessage(f"{words}: {Path(previous[0]).name} loads again", 15000)
            self.start_load(*previous)  # Cancel on this load too leaves no model
            return
        w.statusBar().showMessage(words, 15000)
        w.model_bar.show_info(None)
        w.conversation.update_model_state()
        w.conversation.refresh_view()

    def unload_model(self) -> None:
        info = self.session.engine_info
        if info is not None and info.remote:
            return  # nothing to free here (the button and menu item are off)
        if self.session.pending is not None:
            self.session.pending.cancel.set()
        self.worker.unload()

    def reload_model(self) -> None:
        """Load the model again, with the settings that apply at a load."""
        info = self.session.engine_info
        if info is not None and not info.remote:
            self.load_model(info.model_path, info.mmproj_path)

    def apply_draft_setting(self) -> bool:
        """Settings changed the draft model (or turned it on or off): the loaded local model
        loads again with it, as LM Studio does. False when nothing needed to reload."""
        info = self.session.engine_info
        if info is None or info.remote or self.settings.draft_to_load == self.draft_asked:
            return False
        self.reload_model()
        return True

    @Slot(str, str, str)
    def on_draft_outcome(self, model_path: str, draft: str, why_not: str) -> None:
        self.draft_outcome = (model_path, draft, why_not)

    @property
    def draft_in_use(self) -> str:
        """The draft model the loaded model drafts with ('' none)."""
        info = self.session.engine_info
        model, draft, _why = self.draft_outcome
        return draft if info is not None and not info.remote and model == info.model_path else ""

    @Slot(float, str)
    def on_load_progress(self, frac: float, what: str) -> None:
        if self.session.loading:
            self.window.model_bar.show_progress(frac, what)
            if self.window.view.queued is not None:
                self.window.conversation.show_queued(frac)

    @Slot(object)
    def on_loaded(self, info: EngineInfo) -> None:
        w = self.window
        self.session.loading = None
        self.before_load = None
        self.session.engine_info = info
        if not info.remote:
            self.settings.last_model = (info.model_path, info.mmproj_path)
        w.model_bar.show_info(info)
        noted_model, note = self.projector_note
        self.projector_note = ("", "")
        if note and noted_model == info.model_path and not info.mmproj_path:
            w.model_bar.show_projector_note(note)
            w.statusBar().showMessage(note, 30000)
        drafted_model, _draft, why_not = self.draft_outcome
        if why_not and drafted_model == info.model_path and not info.remote:
            w.statusBar().showMessage(why_not, 30000)  # the model runs, without the draft: said once
        w.conversation.update_context_meter()
        # What was said about the missing model (no model, no projector, a failed load) is no
        # longer true: in the composer and in every chat.
        stale = self.session.model_hints(info) | self.load_errors
        if w.composer.message.text() in stale:
            w.composer.show_message("")
        notices = self.session.notices
        for chat_id, text in list(notices.items()):
            if text in stale:
                del notices[chat_id]
        self.load_errors.clear()
        w.conversation.refresh_view()
        w.conversation.update_model_state()
        w.modelLoaded.emit(info)

    @Slot(str)
    def on_load_failed(self, message: str) -> None:
        w = self.window
        self.session.loading = None
        self.before_load = None
        self.session.engine_info = None
        w.model_bar.show_info(None)  # the previous model is gone: no stale projector/device line
        w.model_bar.show_error(message)
        self.session.notices[self.session.current_chat_id] = message
        self.load_errors.add(message)
        w.conversation.update_model_state()
        w.conversation.refresh_view()

    @Slot()
    def on_unloaded(self) -> None:
        if self.session.loading:
            return  # a new model is on its way
        self.session.engine_info = None
        self.window.model_bar.show_info(None)
        self.window.conversation.update_model_state()


__all__ = ["GGUF_FILTER", "ModelLoading"]
