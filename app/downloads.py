"""The app's downloads: one DownloadManager alive while the app runs, its progress as Qt signals.

The window owns one `Downloads`; the Models dialog shows and steers it, and closing the
dialog leaves every download running (they pause only when the app quits; the parts resume
next time). A model and its projector are downloaded as a pair: `pair_ready` says when both
are verified, so the chat can load them together.
"""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal, Slot

from ..engine.library.downloads import (DownloadManager, DownloadRequest, DownloadState,
                                        DownloadStatus, final_path)
from ..engine.library.catalog import CatalogEntry, resolve_catalog_entry
from ..engine.library.hub import Hub, HubFile
from ..engine.library.models_folder import default_models_dir
from .jobs import Jobs

BUSY_STATES = (DownloadState.QUEUED, DownloadState.RUNNING, DownloadState.VERIFYING)


class Downloads(QObject):
    """Downloads hub files into `models_dir`; every signal arrives on the UI thread."""

    status_changed = Signal(object)  # DownloadStatus
    pair_ready = Signal(str, str, str)  # model download key, model path, projector path or ''
    started = Signal(str)  # what is being downloaded, in words
    notice = Signal(str, bool)  # a message for the user, and whether it is an error

    # Emitted from the manager's threads; queued to _on_status on this object's thread.
    _status_from_worker = Signal(object)

    def __init__(self, models_dir: str | os.PathLike | None = None, hub: Hub | None = None,
                 parent: QObject | None = None, **manager_options):
        super().__init__(parent)
        self.models_dir = Path(models_dir) if models_dir else default_models_dir()
        self.hub = hub or Hub()
        self.manager = DownloadManager(self.models_dir, hub=self.hub, **manager_options)
        self.jobs = Jobs(self)
        # model download key -> (model request, projector request or None)
        self.pairs: dict[str, tuple[DownloadRequest, DownloadRequest | None]] = {}
        # model download key -> (model path, projector path or None), once both are verified
        self.ready: dict[str, tuple[Path, Path | None]] = {}
        # (catalogue entry id, quant) -> (model bytes, projector bytes) as the hub listed them:
        # asked once per session, not at every opening of the Models dialog
        self.catalog_sizes: dict[tuple[str, str], tuple[int | None, int | None]] = {}
        self._status_from_worker.connect(self._on_status, Qt.ConnectionType.QueuedConnection)
        self.manager.add_listener(self._status_from_worker.emit)

    # -- starting -------------------------------------------------------------------------

    def start_pair(self, model: HubFile, mmproj: HubFile | None) -> list[DownloadRequest]:
        """Download a model file and its projector together; returns their requests."""
        reqs = [DownloadRequest(f.repo_id, f.path, f.revision, f.sha256, f.size)
                for f in (model, mmproj) if f is not None]
        self.pairs[reqs[0].key] = (reqs[0], reqs[1] if len(reqs) > 1 else None)
        self.ready.pop(reqs[0].key, None)
        self.started.emit(f"Downloading {model.path}" + (" and its projector" if mmproj else "")
                          + f" into {self.models_dir}.")
        for r in reqs:
            self.manager.start(r)
        return reqs

    def start_catalog_entry(self, entry: CatalogEntry, quant: str) -> None:
        """Look the entry up on the hub (off the UI thread), then download its pair."""
        def resolved(choice) -> None:
            for warning in choice.warnings:
                self.notice.emit(warning, False)
            self.start_pair(choice.model, choice.mmproj)

        self.notice.emit(f"Looking up {entry.repo_id}…", False)
        self.jobs.run(lambda: resolve_catalog_entry(self.hub, entry, quant), resolved,
                      lambda message: self.notice.emit(message, True))

    def unfinished(self) -> list[DownloadStatus]:
        """Parts left by an earlier session, as paused statuses (not restarted: the user
        resumes them); each becomes a pair of its own so it can be loaded when done."""
        known = {s.key for s in self.manager.statuses()}
        found = []
        for req in self.manager.unfinished_requests():
            if req.key in known:
                continue
            self.pairs.setdefault(req.key, (req, None))
            found.append(DownloadStatus(req.key, req, DownloadState.PAUSED,
                                        final_path(self.models_dir, req),
                                        self.manager.partial_bytes(req), req.size))
        return found

    # -- state ----------------------------------------------------------------------------

    def statuses(self) -> list[DownloadStatus]:
        return self.manager.statuses()

    def state(self, key: str) -> DownloadState | None:
        try:
            return self.manager.status(key).state
        except KeyError:
            return None

    def busy(self, repo_id: str | None = None) -> bool:
        """Whether any download (of `repo_id`, when given) is queued, running or verifying."""
        return any(s.state in BUSY_STATES and (repo_id is None or s.request.repo_id == repo_id)
                   for s in self.manager.statuses())

    def shutdown(self, timeout: float = 5.0) -> None:
        """App exit: pause everything (the parts resume next time) and stop reporting."""
        self.manager.remove_listener(self._status_from_worker.emit)
        self.manager.shutdown(wait=True, timeout=timeout)

    # -- progress -------------------------------------------------------------------------

    @Slot(object)
    def _on_status(self, status: DownloadStatus) -> None:
        self.status_changed.emit(status)
        if status.state is DownloadState.DONE:
            self._check_pairs()

    def _check_pairs(self) -> None:
        for key, (model_req, proj_req) in list(self.pairs.items()):
            if key in self.ready:
                continue
            reqs = [r for r in (model_req, proj_req) if r is not None]
            if all(self.state(r.key) is DownloadState.DONE for r in reqs):
                model = self.manager.status(model_req.key).path
                proj = self.manager.status(proj_req.key).path if proj_req else None
                self.ready[key] = (model, proj)
                self.pair_ready.emit(key, str(model), str(proj) if proj else "")



def downloads_in(current: Downloads | None, models_dir: str | os.PathLike | None,
                 parent: QObject | None = None) -> Downloads:
    """The app's downloads for the models folder of the settings: `current` when it uses that
    folder, or while it is busy (running downloads finish where they started); else new ones."""
    folder = Path(models_dir) if models_dir else default_models_dir()
    if current is not None and (current.models_dir == folder or current.busy()):
        return current
    if current is not None:
        current.shutdown()
        current.deleteLater()
    return Downloads(folder, current.hub if current is not None else None, parent)
