"""The window's first turn on screen: the engine (torch...) is imported on the worker and the
last model loads behind it, and the first code block's lexer is imported off the UI thread, so
the window never waits for them. Missing native CPU kernels are said then, not silently.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Slot

from .widgets import markdown

log = logging.getLogger(__name__)


class WarmUp(QObject):
    """Runs once, when the window is first shown; `done` once both imports are over."""

    def __init__(self, window, autoload: bool):
        super().__init__(window)
        self.window = window
        self.autoload = autoload
        self._waiting = 2  # the engine's imports and the lexers'
        window.worker.warmedUp.connect(self.on_engine_imported)

    @property
    def done(self) -> bool:
        return self._waiting == 0

    def _one_done(self, _result=None) -> None:
        self._waiting -= 1

    def first_turn(self) -> None:
        w, session = self.window, self.window.session
        w.firstShown.emit()
        w.worker.warm_up()
        # A chat bound to a server has asked for it already (open_chat): the last local model
        # would take its place and answer its next message.
        if self.autoload and w.binding.chosen().is_local and session.engine_info is None and not session.loading:
            w.model_loading.load_last_model()
        w.jobs.run(markdown.warm_up, self._one_done, lambda _error: self._one_done())

    @Slot(float)
    def on_engine_imported(self, seconds: float) -> None:
        """Replies on the CPU run on torch's much slower path without the native kernels."""
        self._one_done()
        log.info("engine imported on the worker in %.2f s", seconds)
        from ..kernels import cpu_native

        if not cpu_native.AVAILABLE:
            text = f"The native CPU kernels are not built, so CPU replies are slow: {cpu_native.NO_KERNELS_FIX}."
            log.warning("%s (%s)", text, cpu_native.IMPORT_ERROR)
            self.window.conversation.show_status(text)


__all__ = ["WarmUp"]
