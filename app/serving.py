"""The window's model behind the OpenAI-compatible server, batched with the window's own replies.

While the switch is on, the engine worker holds a `BatchExecutor` on its local model
(`EngineWorker.serve`): `WorkerExecutor` hands each server job to it, and every job runs at once
as a sequence of one batch scheduler, the window's replies on its priority lane (they never
queue behind API streams). Without a local model (none loaded, a remote one) a job is queued to
the worker's thread instead, behind the window's requests, and answers that no model is loaded.
`WindowServer` is the Settings switch and the status bar's line.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QLabel

from ..engine.api import EngineError
from ..engine.server.urls import API_FAMILIES, SHOWN_NAMES
from .engine_info import EngineInfo
from .worker import EngineWorker

if TYPE_CHECKING:  # the server (aiohttp, the engine) is imported when it first starts, not with the window
    from ..engine.server.http import OpenAIServer
    from ..engine.server.openai_api import RequestLimits, ServedModel

log = logging.getLogger(__name__)


class WorkerExecutor(QObject):
    """An `EngineExecutor` on the window's engine worker (start the worker first)."""

    _jobRequested = Signal(object, object)  # Future, job
    _refreshRequested = Signal()

    def __init__(self, worker: EngineWorker):
        super().__init__()
        self._worker = worker
        self._model: ServedModel | None = None
        self.moveToThread(worker.thread())
        self._jobRequested.connect(self._run)
        self._refreshRequested.connect(self._refresh)
        # Emitted on the worker thread, where this object lives: called there, right after the
        # engine changed and before any later job runs.
        worker.loaded.connect(self._refresh)
        worker.unloaded.connect(self._refresh)
        self._refreshRequested.emit()  # a model loaded before the switch was turned on

    # -- EngineExecutor (any thread) -------------------------------------------------------------
    def served_model(self) -> ServedModel | None:
        return self._model

    def submit(self, job) -> Future:
        batch = self._worker.batch_executor()
        if batch is not None:
            try:
                return batch.submit(job)  # runs at once, a sequence of the batch
            except RuntimeError:  # shut down meanwhile (a model switch): the worker thread answers
                pass
        future: Future = Future()
        self._jobRequested.emit(future, job)
        return future

    def refresh(self) -> None:
        """Read the served model again on the worker thread (after what was queued before)."""
        self._refreshRequested.emit()

    # -- the worker thread -----------------------------------------------------------------------
    @Slot(object, object)
    def _run(self, future: Future, job) -> None:
        if not future.set_running_or_notify_cancel():
            return  # the client left while it waited
        try:
            from ..engine.server.executor import ModelUnavailable

            batch = self._worker.batch_executor()
            if batch is not None:  # it started while this job waited here
                _chain(batch.submit(job), future)
                return
            engine = self._worker.engine
            if self._model is None:
                raise ModelUnavailable("no local model is loaded in the window: load one, then try again")
            future.set_result(job(engine))
        except BaseException as exc:  # noqa: BLE001 - the server turns it into an HTTP error
            future.set_exception(exc)

    @Slot()
    @Slot(object)
    def _refresh(self, _info: EngineInfo | None = None) -> None:
        engine = self._worker.engine
        if engine is None:
            self._model = None
            return
        from ..engine.server.executor import served_model_of

        batch = self._worker.batch_executor()
        self._model = served_model_of(batch.engine if batch is not None else engine)


def _chain(inner: Future, outer: Future) -> None:
    """outer gets inner's outcome (a job a stopping executor dropped: the model is unavailable)."""
    from ..engine.server.executor import ModelUnavailable

    def copy(done: Future) -> None:
        if done.cancelled():
            outer.set_exception(ModelUnavailable("the model was unloaded or changed before this request ran: "
                                                 "send it again"))
        elif done.exception() is not None:
            outer.set_exception(done.exception())
        else:
            outer.set_result(done.result())

    inner.add_done_callback(copy)


class WindowServer(QObject):
    """The Settings switch: serve the window's model on localhost:PORT while it is on.

    `status` is the status bar's line ('' when off); `changed` fires on the UI thread whenever
    it changes (started, stopped, a reply served, the model changed)."""

    changed = Signal()
    _served = Signal()  # from the server's thread

    def __init__(self, worker: EngineWorker, limits: RequestLimits | None = None):
        super().__init__()
        self._worker = worker
        self.executor = WorkerExecutor(worker)
        self.limits = limits  # None: the server's defaults
        self.server: OpenAIServer | None = None
        self.error = ""  # why the last start failed, in words
        self.served = 0  # replies finished since the switch was turned on
        self._served.connect(self._count)
        worker.loaded.connect(self._model_changed, Qt.ConnectionType.QueuedConnection)
        worker.unloaded.connect(self._model_changed, Qt.ConnectionType.QueuedConnection)

    @property
    def running(self) -> bool:
        return self.server is not None

    @property
    def status(self) -> str:
        if self.error:
            return f"API server off: {self.error}"
        if self.server is None:
            return ""
        model = self.executor.served_model()
        what = model.id if model is not None else "no local model loaded"
        replies = f" · {self.served} repl{'y' if self.served == 1 else 'ies'}" if self.served else ""
        urls = self.server.client_urls()
        others = "".join(f" · {SHOWN_NAMES[family]} {url}" for family, url in urls.items() if family != "openai")
        where = f"at {urls['openai']}" if "openai" in urls else "for"
        return f"Serving {what} {where}{others}{replies}"

    def apply(self, on: bool, port: int, apis: tuple[str, ...] | None = None, ollama_port: int = 0) -> None:
        """Turn the switch on (binding 127.0.0.1:port, serving the API families `apis`, all by
        default, and Ollama's on ollama_port too when not 0) or off; a failure lands in `status`."""
        apis = tuple(a for a in API_FAMILIES if a in (apis or API_FAMILIES))
        second = ollama_port if ollama_port and "ollama" in apis else None
        server = self.server
        if on and server is not None and (server.port, server.families, server.ollama_port) == (port, apis, second):
            return
        self.stop()
        if on:
            from ..engine.server.http import OpenAIServer

            self._worker.serve(True)  # the batch starts on the worker before any job can reach it
            try:
                self.server = OpenAIServer(self.executor, host="127.0.0.1", port=port, limits=self.limits,
                                           on_finished=lambda finished: self._served.emit(),
                                           apis=apis, ollama_port=second).start()
                log.info("serving the window's model at %s", self.server.url)
            except EngineError as exc:
                self.error = str(exc)
                self._worker.serve(False)
            self.executor.refresh()
        self.changed.emit()

    def stop(self) -> None:
        server, self.server = self.server, None
        self.error = ""
        self.served = 0
        if server is not None:
            server.stop()
            self._worker.serve(False)  # after the server: no job is left to hand to the batch
            self.executor.refresh()
            self.changed.emit()

    @Slot()
    def _count(self) -> None:
        self.served += 1
        self.changed.emit()

    @Slot()
    @Slot(object)
    def _model_changed(self, _info=None) -> None:
        if self.server is not None:
            self.changed.emit()


class ServerStatusLabel(QLabel):
    """The status bar's line for the switch (empty while it is off)."""

    def __init__(self, server: WindowServer):
        super().__init__(server.status)
        self.setObjectName("apiServerStatus")
        server.changed.connect(lambda: self.setText(server.status))
