"""Resumable, verified model downloads.

A download writes `<final>.part` plus a small JSON sidecar `<final>.part.json` (repo, file,
revision, url, size, sha256, etag). The byte count already on disk is the part file's size,
so a dropped connection, a pause, or an app restart continues with an HTTP `Range` request
instead of starting over (huggingface_hub itself resumes only within one call and deletes
its partial file on failure). The file gets its final name only after its size and sha256
match what the hub published, so a file with the final name is always a verified one.

`DownloadManager` runs each download on a worker thread and reports plain
`DownloadStatus` snapshots to listener callables (called from worker threads: a GUI must
hop to its own thread, e.g. by emitting a Qt signal).
"""
from __future__ import annotations

import enum
import errno
import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

from ..private_files import create_private_file, make_private_dir
from .hub import Hub, HubError, translate_error
from .sizes import size_text

PART_SUFFIX = ".part"
SIDECAR_SUFFIX = ".part.json"
MANIFEST_FILE = "downloads.json"
CHUNK_SIZE = 1 << 20
SPACE_RESERVE = 64 << 20  # keep this much free beyond the file itself
_ACTIVE_PARTS: set[Path] = set()  # final paths being written in this process
_ACTIVE_LOCK = threading.Lock()
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_GIT_OID_RE = re.compile(r"^[0-9a-f]{40}$")


class DownloadState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    VERIFYING = "verifying"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (DownloadState.DONE, DownloadState.FAILED, DownloadState.CANCELLED)


@dataclass(frozen=True)
class DownloadRequest:
    repo_id: str
    filename: str  # path inside the repo
    revision: str = "main"
    sha256: str | None = None  # expected; else taken from the hub (LFS) at start
    size: int | None = None

    @property
    def key(self) -> str:
        return f"{self.repo_id}/{self.filename}@{self.revision}"


@dataclass(frozen=True)
class DownloadStatus:
    """A snapshot of one download, handed to listeners."""

    key: str
    request: DownloadRequest
    state: DownloadState
    path: Path  # the final (verified) file
    done_bytes: int = 0
    total_bytes: int | None = None
    speed_bps: float = 0.0
    eta_s: float | None = None
    error: str | None = None
    error_kind: str | None = None  # gated, not_found, network, no_space, checksum, offline, io

    @property
    def fraction(self) -> float | None:
        if not self.total_bytes:
            return None
        return min(1.0, self.done_bytes / self.total_bytes)


Listener = Callable[[DownloadStatus], None]


def safe_repo_path(path: str) -> PurePosixPath:
    """A repo-relative path that cannot escape the target folder."""
    p = PurePosixPath(path)
    if p.is_absolute() or not p.parts or any(part in ("..", "") for part in p.parts):
        raise HubError(f"{path!r}: not a safe file path inside a repository", "bad_data")
    return p


def repo_folder(models_dir: Path, repo_id: str) -> Path:
    """Each repo gets its own folder so projectors of different models never mix."""
    owner_name = "__".join(safe_repo_path(repo_id).parts)
    return Path(models_dir) / owner_name


def final_path(models_dir: Path, request: DownloadRequest) -> Path:
    return repo_folder(models_dir, request.repo_id).joinpath(*safe_repo_path(request.filename).parts)


def part_path(final: Path) -> Path:
    return final.with_name(final.name + PART_SUFFIX)


def sidecar_path(final: Path) -> Path:
    return final.with_name(final.name + SIDECAR_SUFFIX)


def git_blob_oid(path: Path) -> str:
    """The git object id of a file (sha1 of 'blob <size>\\0' + bytes): what the hub gives
    as the etag of small, non-LFS files."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK_SIZE), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: Path, progress: Callable[[int], None] | None = None,
                stop: threading.Event | None = None) -> str:
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK_SIZE), b""):
            if stop is not None and stop.is_set():
                raise _Interrupted()
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done)
    return h.hexdigest()


class _Interrupted(Exception):
    """Raised inside a worker when pause or cancel was asked for."""


class _DiskError(Exception):
    """Writing the part failed (disk full, permissions): not a network problem, no retry."""

    def __init__(self, cause: OSError):
        super().__init__(str(cause))
        self.cause = cause


class _Restart(Exception):
    """The server's file changed or ignored our Range: start from byte 0."""


@dataclass(frozen=True)
class _Expected:
    """What a download must turn out to be, as the hub described it."""

    label: str  # repo_id/filename, for messages
    size: int
    etag: str | None
    sha256: str | None
    git_oid: str | None  # checked instead of sha256 for a plain git file
    location: str
    sidecar: dict  # written beside the part, to resume only this version of the file


def _etag(raw: str | None) -> str | None:
    return (raw or "").strip('"').lower() or None


def _resume_offset(part: Path, side: Path, want: _Expected) -> int:
    """Continue a part only if it belongs to exactly this version of the file."""
    if not part.exists():
        return 0
    try:
        old = json.loads(side.read_text("utf-8"))
    except (OSError, ValueError):
        old = {}
    same = all(old.get(k) == want.sidecar[k] for k in ("size", "sha256", "etag"))
    offset = part.stat().st_size if same else 0
    return 0 if offset > want.size else offset


def _check_space(want: _Expected, final: Path, offset: int) -> None:
    free = shutil.disk_usage(final.parent if final.parent.exists() else _existing_parent(final)).free
    needed = want.size - offset
    if free < needed + SPACE_RESERVE:
        raise HubError(
            f"{want.label}: not enough disk space in {final.parent}: needs "
            f"{size_text(needed + SPACE_RESERVE)} free, {size_text(free)} available.", "no_space")


class _Task:
    def __init__(self, request: DownloadRequest, path: Path):
        self.request = request
        self.path = path
        self.state = DownloadState.QUEUED
        self.done_bytes = 0
        self.total_bytes = request.size
        self.speed_bps = 0.0
        self.error: str | None = None
        self.error_kind: str | None = None
        self.stop = threading.Event()  # set for pause and cancel
        self.cancel_requested = False
        self.finished = threading.Event()
        self.thread: threading.Thread | None = None
        self.hasher = None  # sha256 of the bytes in the part so far
        self.response = None  # the HTTP response being read, closed to interrupt a stall

    def status(self) -> DownloadStatus:
        eta = None
        if self.speed_bps > 0 and self.total_bytes:
            eta = max(0.0, (self.total_bytes - self.done_bytes) / self.speed_bps)
        return DownloadStatus(self.request.key, self.request, self.state, self.path,
                              self.done_bytes, self.total_bytes, self.speed_bps, eta,
                              self.error, self.error_kind)


@dataclass
class _Speed:
    """Bytes per second over a sliding window of a few seconds."""

    window_s: float = 3.0
    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, t: float, total: int) -> float:
        self.samples.append((t, total))
        while len(self.samples) > 2 and t - self.samples[0][0] > self.window_s:
            self.samples.pop(0)
        t0, b0 = self.samples[0]
        return (total - b0) / (t - t0) if t > t0 else 0.0


class DownloadManager:
    """Downloads hub files into `models_dir`, several at once, resumable and verified."""

    def __init__(self, models_dir: str | os.PathLike, hub: Hub | None = None,
                 max_parallel: int = 3, chunk_size: int = CHUNK_SIZE, max_retries: int = 5,
                 retry_delay_s: float = 1.0, progress_interval_s: float = 0.2,
                 read_timeout_s: float = 30.0):
        self.models_dir = Path(models_dir)
        self.hub = hub or Hub()
        self.chunk_size = chunk_size
        self.max_retries = max_retries
        self.retry_delay_s = retry_delay_s
        self.progress_interval_s = progress_interval_s
        self.read_timeout_s = read_timeout_s
        # Daemon threads, not an executor: quitting the app must not wait for a 14 GB file
        # (the part and its sidecar stay on disk and resume next time).
        self._slots = threading.BoundedSemaphore(max_parallel)
        self._tasks: dict[str, _Task] = {}
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    # -- listeners ------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _notify(self, task: _Task) -> None:
        status = task.status()
        for listener in list(self._listeners):
            try:
                listener(status)
            except Exception:  # noqa: BLE001 - a broken listener must not kill a download
                pass

    # -- control --------------------------------------------------------------------------

    def start(self, request: DownloadRequest) -> DownloadStatus:
        """Queue a download (or resume a paused/failed one with the same key)."""
        with self._lock:
            task = self._tasks.get(request.key)
            if task is not None and not task.finished.is_set():
                return task.status()  # already queued or running
            if task is None or task.state in (DownloadState.DONE, DownloadState.CANCELLED):
                task = _Task(request, final_path(self.models_dir, request))
                self._tasks[request.key] = task
            task.stop.clear()
            task.finished.clear()
            task.cancel_requested = False
            task.error = task.error_kind = None
            task.state = DownloadState.QUEUED
            task.thread = threading.Thread(target=self._run_in_slot, args=(task,), daemon=True,
                                           name=f"download {request.filename}")
            task.thread.start()
        self._notify(task)
        return task.status()

    def pause(self, key: str) -> None:
        task = self._tasks.get(key)
        if task is not None and not task.finished.is_set():
            self._interrupt(task)

    @staticmethod
    def _interrupt(task: _Task) -> None:
        """Ask the worker to stop, and close its response so a stalled read ends now
        rather than at the read timeout."""
        task.stop.set()
        resp = task.response
        if resp is None:
            return
        try:  # shutting the socket down wakes a blocked recv(); the worker then sees stop
            import socket
            sock = resp.extensions["network_stream"].get_extra_info("socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except Exception:  # noqa: BLE001 - no socket to reach: the read timeout ends it
            pass

    def resume(self, key: str) -> DownloadStatus:
        task = self._tasks[key]
        return self.start(task.request)

    def cancel(self, key: str) -> None:
        """Stop the download and delete its partial file (a paused one too)."""
        task = self._tasks.get(key)
        if task is None:  # a part left by an earlier run: just delete it
            for req in self.unfinished_requests():
                if req.key == key:
                    self._discard_part(final_path(self.models_dir, req))
            return
        with self._lock:
            task.cancel_requested = True
            running = not task.finished.is_set()
        self._interrupt(task)
        if not running and task.state != DownloadState.DONE:
            self._discard_part(task.path)
            task.state = DownloadState.CANCELLED
            self._notify(task)

    def status(self, key: str) -> DownloadStatus:
        return self._tasks[key].status()

    def statuses(self) -> list[DownloadStatus]:
        return [t.status() for t in list(self._tasks.values())]

    def wait(self, key: str, timeout: float | None = None) -> DownloadStatus:
        task = self._tasks[key]
        task.finished.wait(timeout)
        return task.status()

    def unfinished_requests(self) -> list[DownloadRequest]:
        """Downloads left as `.part` + sidecar by an earlier run (e.g. before a restart)."""
        found = []
        if not self.models_dir.is_dir():
            return found
        for side in sorted(self.models_dir.rglob("*" + SIDECAR_SUFFIX)):
            try:
                meta = json.loads(side.read_text("utf-8"))
                req = DownloadRequest(meta["repo_id"], meta["filename"],
                                      meta.get("revision", "main"), meta.get("sha256"),
                                      meta.get("size"))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            found.append(req)
        return found

    def partial_bytes(self, request: DownloadRequest) -> int:
        part = part_path(final_path(self.models_dir, request))
        return part.stat().st_size if part.exists() else 0

    def pause_all(self) -> None:
        for task in list(self._tasks.values()):
            if not task.finished.is_set():
                self._interrupt(task)

    def shutdown(self, wait: bool = True, timeout: float | None = 10.0) -> None:
        """Pause everything (parts stay for the next run) and optionally wait for the
        workers to let go of their files."""
        self.pause_all()
        if wait:
            for task in list(self._tasks.values()):
                task.finished.wait(timeout)

    # -- the worker -----------------------------------------------------------------------

    def _discard_part(self, final: Path) -> None:
        for p in (part_path(final), sidecar_path(final)):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def _fail(self, task: _Task, message: str, kind: str) -> None:
        task.state = DownloadState.FAILED
        task.error, task.error_kind = message, kind

    def _run_in_slot(self, task: _Task) -> None:
        with self._slots:  # at most max_parallel downloads move bytes at once
            self._run(task)

    def _run(self, task: _Task) -> None:
        claimed = False
        try:
            if task.stop.is_set():  # paused or cancelled while waiting for a slot
                raise _Interrupted()
            with _ACTIVE_LOCK:  # two managers appending to one part would corrupt it
                if task.path in _ACTIVE_PARTS:
                    raise HubError(f"{task.path.name}: already being downloaded by another "
                                   "download manager in this program.", "busy")
                _ACTIVE_PARTS.add(task.path)
                claimed = True
            task.state = DownloadState.RUNNING
            self._notify(task)
            self._download(task)
            task.state = DownloadState.DONE
        except _Interrupted:
            if task.cancel_requested:
                self._discard_part(task.path)
                task.state = DownloadState.CANCELLED
            else:
                task.state = DownloadState.PAUSED
        except HubError as exc:
            self._fail(task, str(exc), exc.kind)
        except (OSError, _DiskError) as exc:
            exc = exc.cause if isinstance(exc, _DiskError) else exc
            kind = "no_space" if getattr(exc, "errno", None) == errno.ENOSPC else "io"
            self._fail(task, f"{task.path}: cannot write the download: {exc.strerror or exc}",
                       kind)
        except Exception as exc:  # noqa: BLE001 - never let a worker die silently
            self._fail(task, f"{task.request.key}: {type(exc).__name__}: {exc}", "io")
        finally:
            if claimed:
                with _ACTIVE_LOCK:
                    _ACTIVE_PARTS.discard(task.path)
            task.speed_bps = 0.0
            task.finished.set()
            self._notify(task)

    def _download(self, task: _Task) -> None:
        """Download, check and name one file: the steps below, in order."""
        final = task.path
        part, side = part_path(final), sidecar_path(final)
        if final.exists() and not part.exists():
            # Only verified files ever get the final name, so this one is ready.
            if task.request.size is None or final.stat().st_size == task.request.size:
                task.done_bytes = task.total_bytes = final.stat().st_size
                return
        want = self._expected(task.request)
        task.total_bytes = want.size
        offset = _resume_offset(part, side, want)
        _check_space(want, final, offset)
        make_private_dir(final.parent, tighten_existing=False)
        with os.fdopen(create_private_file(side), "w", encoding="utf-8") as f:
            f.write(json.dumps(want.sidecar, indent=1))
        self._start_part(task, part, offset)
        self._fetch_all(task, want, part)
        task.state = DownloadState.VERIFYING
        self._notify(task)
        self._verify(task, want, part)
        os.replace(part, final)
        try:
            side.unlink()
        except FileNotFoundError:
            pass
        record_download(self.models_dir, final, {**want.sidecar, "sha256": want.sha256, "git_oid": want.git_oid})

    def _expected(self, req: DownloadRequest) -> _Expected:
        """Ask the hub what the file is: its size, where to fetch it and how to check it."""
        label = f"{req.repo_id}/{req.filename}"
        remote = self.hub.remote_file(req.repo_id, req.filename, req.revision)
        size = remote.size if remote.size is not None else req.size
        etag = _etag(remote.etag)
        sha256 = (req.sha256 or "").lower() or None
        if sha256 is None and etag and _SHA256_RE.match(etag):
            sha256 = etag  # LFS files: the etag is the content's sha256
        if sha256 is None and not (etag and _GIT_OID_RE.match(etag)):
            try:
                sha256 = self.hub.file_info(req.repo_id, req.filename, req.revision).sha256
            except HubError:
                pass
        if sha256 and etag and _SHA256_RE.match(etag) and etag != sha256:
            raise HubError(f"{label}: the file on the hub (sha256 {etag}) is not the one "
                           f"expected (sha256 {sha256}); it changed since it was listed.",
                           "changed")
        git_oid = etag if sha256 is None and etag and _GIT_OID_RE.match(etag) else None
        if size is None:
            raise HubError(f"{label}: the hub did not tell the file size; refusing to download "
                           "a file that cannot be checked.", "bad_data")
        sidecar = {"repo_id": req.repo_id, "filename": req.filename, "revision": req.revision,
                   "url": remote.url, "size": size, "sha256": sha256, "etag": etag,
                   "commit": remote.commit}
        return _Expected(label, size, etag, sha256, git_oid, remote.location, sidecar)

    def _fetch_all(self, task: _Task, want: _Expected, part: Path) -> None:
        """Fetch the rest of the file into the part, retrying network trouble with backoff
        (failures in a row; an attempt that moved forward resets the count)."""
        req, size = task.request, want.size
        location = want.location
        retries = 0
        while task.done_bytes < size:
            if task.stop.is_set():
                raise _Interrupted()
            before = task.done_bytes
            try:
                self._fetch_range(task, location, part, size)
            except _Restart:
                self._start_part(task, part, 0)
                continue
            except (HubError, _DiskError):
                raise
            except Exception as exc:  # noqa: BLE001 - network trouble: retry, then report
                if task.stop.is_set():
                    raise _Interrupted() from exc
                retries = 1 if task.done_bytes > before else retries + 1
                if retries > self.max_retries:
                    raise HubError(
                        f"{want.label}: the connection keeps failing ({type(exc).__name__}); "
                        f"{size_text(task.done_bytes)} of {size_text(size)} are kept and the download "
                        "can be resumed later.", "network") from exc
                if task.stop.wait(self.retry_delay_s * 2 ** (retries - 1)):
                    raise _Interrupted() from exc
                # A CDN location is signed and expires: ask the hub again, and start over
                # if the file changed meanwhile.
                try:
                    fresh = self.hub.remote_file(req.repo_id, req.filename, req.revision)
                except HubError as hub_exc:
                    if hub_exc.kind != "network":
                        raise
                    continue
                if _etag(fresh.etag) != want.etag or fresh.size != size:
                    raise HubError(f"{want.label}: the file changed on the hub during the download; "
                                   "start it again.", "changed")
                location = fresh.location

    def _verify(self, task: _Task, want: _Expected, part: Path) -> None:
        """The part's size and checksum are the expected ones, or it is deleted."""
        got_size = part.stat().st_size
        if got_size != want.size:
            self._discard_part(task.path)
            raise HubError(f"{want.label}: size mismatch: expected {want.size} bytes, got {got_size}; the "
                           "partial file was deleted.", "checksum")
        if want.sha256 is not None:
            digest = task.hasher.hexdigest()
            if digest != want.sha256:
                self._discard_part(task.path)
                raise HubError(f"{want.label}: checksum mismatch: expected sha256 {want.sha256}, got "
                               f"{digest}; the downloaded data was deleted.", "checksum")
        elif want.git_oid is not None:
            digest = git_blob_oid(part)
            if digest != want.git_oid:
                self._discard_part(task.path)
                raise HubError(f"{want.label}: checksum mismatch: expected git oid {want.git_oid}, got "
                               f"{digest}; the downloaded data was deleted.", "checksum")

    def _start_part(self, task: _Task, part: Path, offset: int) -> None:
        """Hash the bytes already in the part (no network), or empty it when offset is 0."""
        hasher = hashlib.sha256()
        # 0600: what is being downloaded is nobody else's business on a shared machine
        if offset == 0:
            os.close(create_private_file(part))
        else:
            os.close(create_private_file(part, os.O_WRONLY))
            with open(part, "r+b") as f:
                f.truncate(offset)
                for chunk in iter(lambda: f.read(self.chunk_size), b""):
                    if task.stop.is_set():
                        raise _Interrupted()
                    hasher.update(chunk)
        task.done_bytes = offset
        task.hasher = hasher
        self._notify(task)

    def _fetch_range(self, task: _Task, location: str, part: Path, size: int) -> bool:
        """GET bytes done_bytes.. and append them; returns whether any byte arrived.
        Raises transport errors for the caller to retry, HubError for hopeless answers."""
        from huggingface_hub.utils import get_session

        req = task.request
        start = task.done_bytes
        headers = self.hub.auth_headers(location)
        headers["Range"] = f"bytes={start}-"
        got_any = False
        speed = _Speed()
        speed.add(time.monotonic(), start)
        last_note = 0.0
        try:
            with get_session().stream("GET", location, headers=headers, follow_redirects=True,
                                      timeout=self.read_timeout_s) as resp:
                task.response = resp
                if task.stop.is_set():
                    raise _Interrupted()
                if resp.status_code == 416 and start == size:
                    return False
                if resp.status_code == 200 and start > 0:
                    # The server ignored Range and sends the whole file: take it from byte 0.
                    self._start_part(task, part, 0)
                    start = 0
                    speed = _Speed()
                    speed.add(time.monotonic(), 0)
                if resp.status_code not in (200, 206):
                    if resp.status_code >= 500 or resp.status_code == 429:
                        raise ConnectionError(f"HTTP {resp.status_code}")
                    resp.read()
                    try:
                        from huggingface_hub.utils import hf_raise_for_status
                        hf_raise_for_status(resp)
                    except Exception as exc:  # noqa: BLE001
                        raise translate_error(exc, f"{req.repo_id}/{req.filename}") from exc
                    raise HubError(f"{req.repo_id}/{req.filename}: unexpected HTTP "
                                   f"{resp.status_code}", "http")
                if resp.status_code == 206:
                    content_range = resp.headers.get("Content-Range", "")
                    m = re.match(r"bytes (\d+)-", content_range)
                    if not m or int(m.group(1)) != start:
                        raise _Restart()
                # Unbuffered: each chunk is on disk once written (the part's size is the
                # resume offset) and a full disk fails at that write, not at some close.
                with open(part, "ab", buffering=0) as f:
                    # Chunks as they arrive: whatever came before a dropped connection is kept.
                    for chunk in resp.iter_bytes():
                        if task.stop.is_set():
                            raise _Interrupted()
                        if task.done_bytes + len(chunk) > size:
                            raise HubError(f"{req.repo_id}/{req.filename}: the server sent "
                                           f"more than the announced {size} bytes.", "checksum")
                        try:
                            f.write(chunk)
                        except OSError as exc:
                            raise _DiskError(exc) from exc
                        task.hasher.update(chunk)
                        task.done_bytes += len(chunk)
                        got_any = True
                        now = time.monotonic()
                        task.speed_bps = speed.add(now, task.done_bytes)
                        if now - last_note >= self.progress_interval_s:
                            last_note = now
                            self._notify(task)
        finally:
            task.response = None
        if task.done_bytes < size:
            raise ConnectionError(f"connection closed after {task.done_bytes} of {size} bytes")
        return got_any


_MANIFEST_LOCK = threading.Lock()


def manifest_path(models_dir: Path) -> Path:
    return Path(models_dir) / MANIFEST_FILE


def load_manifest(models_dir: Path) -> dict[str, dict]:
    """What each finished download was checked against, by path relative to the folder
    (lets `verify` re-check a file offline)."""
    try:
        data = json.loads(manifest_path(models_dir).read_text("utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record_download(models_dir: Path, final: Path, meta: dict) -> None:
    with _MANIFEST_LOCK:
        data = load_manifest(models_dir)
        data[final.relative_to(models_dir).as_posix()] = meta
        tmp = manifest_path(models_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), "utf-8")
        os.replace(tmp, manifest_path(models_dir))


def _existing_parent(path: Path) -> Path:
    p = path.parent
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def verify_file(path: str | os.PathLike, sha256: str) -> bool:
    """Whether a file on disk has the expected sha256."""
    return sha256_file(Path(path)) == sha256.lower()


__all__ = [
    "DownloadManager", "DownloadRequest", "DownloadState", "DownloadStatus", "final_path",
    "part_path", "sidecar_path", "repo_folder", "sha256_file", "verify_file", "git_blob_oid",
    "load_manifest", "record_download",
]
