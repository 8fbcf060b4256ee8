"""Hugging Face hub access for the model manager: search, file lists, metadata, downloads' URLs.

Everything that talks to the hub goes through `Hub`, which takes the endpoint (a mirror or a
test server), the token and the offline switch at construction time. huggingface_hub reads
`HF_ENDPOINT` / `HF_HUB_OFFLINE` once at import, so we read them ourselves at call time and
pass `endpoint=` explicitly everywhere.

Every failure leaves as one `HubError` whose `kind` says what happened (gated, not_found,
network, offline, http) and whose message a user can act on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePosixPath

from ..api import EngineError
from .projector import is_projector_name, name_rank, quant_from_name

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "true", "yes", "on"}


class HubError(EngineError):
    """A hub problem in words. kind: gated | not_found | network | offline | http | bad_data."""

    def __init__(self, message: str, kind: str = "http"):
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------------------------------
# settings


def hub_endpoint(setting: str | None = None) -> str:
    """The hub base URL: the app setting, else `HF_ENDPOINT`, else huggingface.co."""
    return (setting or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_mode(setting: bool | None = None) -> bool:
    """True when the app setting or `HF_HUB_OFFLINE` (either one) forbids the network."""
    return bool(setting) or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


# ---------------------------------------------------------------------------------------
# plain data


@dataclass(frozen=True)
class HubFile:
    """One file of a repo as the hub lists it."""

    repo_id: str
    path: str
    size: int | None
    sha256: str | None = None  # LFS files only; None for small git-stored files
    revision: str = "main"

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def is_gguf(self) -> bool:
        return self.path.lower().endswith(".gguf")

    @property
    def is_mmproj(self) -> bool:
        return self.is_gguf and is_projector_name(self.name)

    @property
    def quant(self) -> str | None:
        return quant_from_name(self.name)


@dataclass(frozen=True)
class RepoSummary:
    repo_id: str
    downloads: int | None = None
    likes: int | None = None
    gated: bool = False
    last_modified: str | None = None


@dataclass(frozen=True)
class ModelChoice:
    """A downloadable model file and the projector that gives it vision (or None)."""

    model: HubFile
    mmproj: HubFile | None

    @property
    def total_size(self) -> int | None:
        if self.model.size is None or (self.mmproj and self.mmproj.size is None):
            return None
        return self.model.size + (self.mmproj.size if self.mmproj else 0)


@dataclass(frozen=True)
class RemoteFile:
    """What a HEAD on the resolve URL tells us right before downloading."""

    url: str  # the hub resolve URL
    location: str  # where the bytes are (a CDN after a redirect, or `url`)
    size: int | None
    etag: str | None
    commit: str | None


def pair_projectors(files: list[HubFile]) -> list[ModelChoice]:
    """Pair every model GGUF of a repo with the projector it should use, by the library's one
    rule on names (projector.name_rank; widths are unknown until downloaded, and are checked
    again before loading). A projector in the model's folder wins over one elsewhere."""
    ggufs = [f for f in files if f.is_gguf]
    projectors = [f for f in ggufs if f.is_mmproj]
    models = sorted((f for f in ggufs if not f.is_mmproj), key=lambda f: f.path)
    choices = []
    for m in models:
        folder = str(PurePosixPath(m.path).parent)
        near = [p for p in projectors if str(PurePosixPath(p.path).parent) == folder] or projectors
        best = min(near, key=lambda p: name_rank(m.path, p.path)) if near else None
        choices.append(ModelChoice(m, best))
    return choices


# ---------------------------------------------------------------------------------------
# the hub


def translate_error(exc: BaseException, what: str) -> HubError:
    """Turn a huggingface_hub / httpx exception into a HubError a user can act on."""
    from huggingface_hub import errors as hf_errors

    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, hf_errors.GatedRepoError):
        return HubError(
            f"{what}: access denied — this is a gated repository. Accept its license on the "
            "model's hub page while logged in, then set a hub access token (Settings, or the "
            "HF_TOKEN environment variable).", "gated")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        # The hub answers 401 for a repo that does not exist *or* is private.
        private = (" If it is private, set a hub access token (Settings, or HF_TOKEN)."
                   if status == 401 else "")
        return HubError(f"{what}: repository not found ({status or 404}). Check the repository "
                        f"name.{private}", "not_found")
    if status in (401, 403):
        return HubError(
            f"{what}: access denied ({status}). The repository may be gated or private: accept "
            "its license on the hub and set a hub access token (Settings, or HF_TOKEN).", "gated")
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return HubError(f"{what}: revision not found (404).", "not_found")
    if isinstance(exc, hf_errors.EntryNotFoundError) or status == 404:
        return HubError(f"{what}: file not found in the repository (404).", "not_found")
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return HubError(f"{what}: offline mode is on; the hub is not contacted.", "offline")
    if status is not None:
        return HubError(f"{what}: the hub answered HTTP {status}.", "http")
    if isinstance(exc, (OSError, ConnectionError, TimeoutError)) or _is_transport_error(exc):
        return HubError(f"{what}: cannot reach the hub (network down or server unreachable: "
                        f"{type(exc).__name__}).", "network")
    return HubError(f"{what}: {type(exc).__name__}: {exc}", "http")


def _is_transport_error(exc: BaseException) -> bool:
    try:
        import httpx2
        return isinstance(exc, httpx2.TransportError)
    except ImportError:  # pragma: no cover - huggingface_hub always brings its HTTP client
        return False


class Hub:
    """The hub as the model manager sees it; safe to use from worker threads."""

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None,
                 offline: bool | None = None, timeout: float = 20.0):
        self.endpoint = hub_endpoint(endpoint)
        self.token = token  # None: huggingface_hub's own (HF_TOKEN or `hf auth login`)
        self.offline = offline_mode(offline)
        self.timeout = timeout
        self._reachable_at = -1e9

    def _check_online(self, what: str) -> None:
        if self.offline:
            raise HubError(f"{what}: offline mode is on (HF_HUB_OFFLINE or the app setting); "
                           "only models already on disk are available.", "offline")
        self._check_reachable(what)

    def _check_reachable(self, what: str) -> None:
        """One quick TCP connect before an API call: huggingface_hub retries a dead network
        with back-off for ~20 s, far too long for a search box. Skipped behind a proxy."""
        import socket
        import time
        from urllib.parse import urlsplit

        if time.monotonic() - self._reachable_at < 60 or any(
                os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                                            "http_proxy", "ALL_PROXY", "all_proxy")):
            return
        parts = urlsplit(self.endpoint)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=min(self.timeout, 5)).close()
        except OSError as exc:
            raise HubError(f"{what}: cannot reach the hub at {self.endpoint} (network down or "
                           f"server unreachable: {exc.strerror or exc}).", "network") from exc
        self._reachable_at = time.monotonic()

    def _api(self):
        from huggingface_hub import HfApi
        return HfApi(endpoint=self.endpoint, token=self.token)

    def search(self, query: str, limit: int = 50) -> list[RepoSummary]:
        """GGUF model repos whose name matches `query`, most downloaded first."""
        what = f"searching the hub for {query!r}"
        self._check_online(what)
        try:
            models = self._api().list_models(search=query or None, filter="gguf",
                                             sort="downloads", limit=limit)
            return [RepoSummary(m.id, m.downloads, m.likes, bool(m.gated),
                                m.last_modified.isoformat() if m.last_modified else None)
                    for m in models]
        except Exception as exc:  # noqa: BLE001 - translated into words
            raise translate_error(exc, what) from exc

    def list_files(self, repo_id: str, revision: str = "main") -> list[HubFile]:
        """Every file of the repo with its size and (for LFS files) sha256."""
        from huggingface_hub.hf_api import RepoFile

        what = f"listing {repo_id}"
        self._check_online(what)
        try:
            tree = self._api().list_repo_tree(repo_id, recursive=True, revision=revision)
            return [HubFile(repo_id, e.path, e.size, e.lfs.sha256 if e.lfs else None, revision)
                    for e in tree if isinstance(e, RepoFile)]
        except Exception as exc:  # noqa: BLE001
            raise translate_error(exc, what) from exc

    def gguf_files(self, repo_id: str, revision: str = "main") -> list[HubFile]:
        return [f for f in self.list_files(repo_id, revision) if f.is_gguf]

    def model_choices(self, repo_id: str, revision: str = "main") -> list[ModelChoice]:
        return pair_projectors(self.gguf_files(repo_id, revision))

    def file_info(self, repo_id: str, filename: str, revision: str = "main") -> HubFile:
        """The listing entry for one file (size and sha256), or HubError not_found."""
        for f in self.list_files(repo_id, revision):
            if f.path == filename:
                return f
        raise HubError(f"{repo_id}: file {filename!r} not found in the repository (404).",
                       "not_found")

    def url(self, repo_id: str, filename: str, revision: str = "main") -> str:
        from huggingface_hub import hf_hub_url
        return hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)

    def remote_file(self, repo_id: str, filename: str, revision: str = "main") -> RemoteFile:
        """HEAD the resolve URL: final location, size, etag, commit."""
        from huggingface_hub import get_hf_file_metadata

        what = f"{repo_id}/{filename}"
        self._check_online(what)
        url = self.url(repo_id, filename, revision)
        try:
            meta = get_hf_file_metadata(url, token=self.token, timeout=self.timeout,
                                        endpoint=self.endpoint)
        except Exception as exc:  # noqa: BLE001
            raise translate_error(exc, what) from exc
        return RemoteFile(url, meta.location or url, meta.size, meta.etag, meta.commit_hash)

    def auth_headers(self, url: str) -> dict[str, str]:
        """Headers for a GET of `url`; the token goes only to the hub's own host (a CDN
        redirect target gets a signed URL instead, as huggingface_hub does)."""
        from urllib.parse import urlparse

        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers(token=self.token)
        if urlparse(url).netloc != urlparse(self.endpoint).netloc:
            headers.pop("authorization", None)
            headers.pop("Authorization", None)
        headers["Accept-Encoding"] = "identity"
        return headers
