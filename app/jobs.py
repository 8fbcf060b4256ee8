"""Background jobs: a function run on a QThreadPool, its outcome handed back on the UI thread.

The one way the app runs work off the UI thread besides the engine worker (worker.py): hub
look-ups and searches, server probes, download starts. Downloads move their bytes on the
engine's DownloadManager threads (shared with the CLI); app/downloads.py turns their
progress into Qt signals.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, Signal, Slot

from ..engine.api import EngineError

Done = Callable[[Any], None]
Failed = Callable[[str], None]

_pool: QThreadPool | None = None
# Jobs on the pool, kept alive until their run() returns: the Jobs that started one may be
# gone by then (its dialog closed), and with it the last other reference to the job.
_running: set["_Job"] = set()


def shared_pool() -> QThreadPool:
    """The app's one pool for jobs. Not owned by any dialog: a QThreadPool waits for its jobs
    when destroyed, and closing a dialog must not wait for a hub search to time out."""
    global _pool
    if _pool is None:
        _pool = QThreadPool()
        _pool.setMaxThreadCount(4)
    return _pool


def describe_error(exc: BaseException) -> str:
    """An error in words for the user: the engine's own errors already say what and where;
    anything else gets its type in front (an OSError alone often says too little)."""
    return str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"


class _Outcome(QObject):
    """Created on the UI thread, emitted from the pool thread: the emission is queued."""

    finished = Signal(int, object, object)  # job id, result, error (an exception or None)


class _Job(QRunnable):
    def __init__(self, job_id: int, fn: Callable[[], Any]):
        super().__init__()
        self.setAutoDelete(False)  # Jobs keeps it until its outcome is delivered
        self.job_id, self.fn, self.outcome = job_id, fn, _Outcome()

    def run(self) -> None:
        try:
            result, error = self.fn(), None
        except Exception as exc:  # noqa: BLE001 - handed to on_failed in words
            result, error = None, exc
        try:
            self.outcome.finished.emit(self.job_id, result, error)
        except RuntimeError:  # the outcome went with its owner: nobody is waiting for it
            pass
        finally:
            _running.discard(self)


class Jobs(QObject):
    """Runs functions off the UI thread. `run(fn, on_done, on_failed)` later calls
    `on_done(result)` or `on_failed(message)` on this object's thread. Nothing is called once
    this object is gone (its parent dialog closed): the connection dies with it."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.pool = shared_pool()
        self._ids = itertools.count()
        self._pending: dict[int, tuple[_Job, Done, Failed | None]] = {}

    def run(self, fn: Callable[[], Any], on_done: Done, on_failed: Failed | None = None) -> None:
        """Start `fn()` on the pool. Without `on_failed` a failure is dropped silently."""
        job = _Job(next(self._ids), fn)
        self._pending[job.job_id] = (job, on_done, on_failed)
        job.outcome.finished.connect(self._deliver, Qt.ConnectionType.QueuedConnection)
        _running.add(job)
        self.pool.start(job)

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    @Slot(int, object, object)
    def _deliver(self, job_id: int, result: Any, error: BaseException | None) -> None:
        entry = self._pending.pop(job_id, None)
        if entry is None:
            return
        _job, on_done, on_failed = entry
        if error is None:
            on_done(result)
        elif on_failed is not None:
            on_failed(describe_error(error))
