"""HTTP and server-sent events for OpenAI-compatible servers, standard library only: base URLs,
connections (TLS, timeouts), errors in words with the API key redacted, `/v1/models`, SSE
parsing, and cancelling a blocked read by shutting its socket down."""
from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

from ..api import EngineError

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT_S = 10.0
# A server may think a long time before its first chunk (big prompt, many images): the read
# timeout is the longest silence we accept, before the first chunk and between chunks.
DEFAULT_READ_TIMEOUT_S = 300.0
CANCEL_POLL_S = 0.05
MAX_ERROR_CHARS = 500


class RemoteError(EngineError):
    """A server problem in words. `kind` is one of: unreachable, auth, model_not_found,
    rejected, server, timeout, malformed, protocol, config. `status` is the HTTP status when
    there was one; `available_models` is filled for model_not_found when the server said."""

    def __init__(self, message: str, kind: str, status: int | None = None,
                 available_models: list[str] | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.available_models = available_models or []


@dataclass(frozen=True)
class RemoteModel:
    id: str
    max_model_len: int | None = None  # vLLM reports it; other servers may not
    owned_by: str | None = None


class Secret:
    """Holds the API key so that no repr, f-string or log record can show it."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None):
        self._value = value or None

    def reveal(self) -> str | None:
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "<hidden>" if self._value else "<none>"

    __str__ = __repr__

    def __reduce__(self):  # never pickle the key along with an object that holds it
        raise TypeError("an API key cannot be pickled")

    def redact(self, text: str) -> str:
        return text.replace(self._value, "<hidden>") if self._value else text


def check_api_key(api_key: str | None) -> None:
    # http.client would put a bad header value (with the key) into its exception message.
    if api_key and not all(33 <= ord(c) <= 126 for c in api_key):
        raise RemoteError("API key: contains spaces, line breaks or non-ASCII characters",
                          "config")


@dataclass(frozen=True)
class Endpoint:
    """A parsed base URL. `display` is safe to show (it never holds credentials)."""

    scheme: str
    host: str
    port: int
    prefix: str  # path before /models, /chat/completions: usually "/v1"

    @property
    def display(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"


def parse_base_url(url: str) -> Endpoint:
    """`http://host:8000`, `http://host:8000/v1` and `https://host/some/v1` all work; a bare
    host (no path) gets `/v1` added, the way the OpenAI clients expect."""
    text = (url or "").strip()
    if text and "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"server URL {url!r}: expected http(s)://host[:port][/v1]", "config")
    if parts.username or parts.password:
        raise RemoteError("server URL: put the API key in the API key field, not in the URL",
                          "config")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise RemoteError(f"server URL {url!r}: the port is not a number 1-65535",
                          "config") from None
    prefix = parts.path.rstrip("/")
    if not prefix:
        prefix = "/v1"
    return Endpoint(parts.scheme, parts.hostname, port, prefix)


# ---------------------------------------------------------------------------------------------
# HTTP plumbing

def connect(ep: Endpoint, connect_timeout: float) -> http.client.HTTPConnection:
    if ep.scheme == "https":
        conn = http.client.HTTPSConnection(ep.host, ep.port, timeout=connect_timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(ep.host, ep.port, timeout=connect_timeout)
    try:
        conn.connect()
    except socket.gaierror:
        raise RemoteError(f"cannot reach {ep.display}: the host name {ep.host!r} does not "
                          "resolve (check the URL and the network)", "unreachable") from None
    except ConnectionRefusedError:
        raise RemoteError(f"cannot reach {ep.display}: connection refused (is the server "
                          "running on that port?)", "unreachable") from None
    except ssl.SSLError as exc:
        raise RemoteError(f"cannot reach {ep.display}: TLS failed ({exc.reason or exc})",
                          "unreachable") from None
    except (TimeoutError, socket.timeout):
        raise RemoteError(f"cannot reach {ep.display}: no answer within {connect_timeout:g} s",
                          "timeout") from None
    except OSError as exc:
        raise RemoteError(f"cannot reach {ep.display}: {exc.strerror or exc}",
                          "unreachable") from None
    return conn


def request_headers(secret: Secret, body: bytes | None, stream: bool) -> dict[str, str]:
    headers = {"Accept": "text/event-stream" if stream else "application/json",
               "User-Agent": "tramontane"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if secret:
        headers["Authorization"] = f"Bearer {secret.reveal()}"
    return headers


def loads_json(data):
    """json.loads; JSON nested past Python's recursion limit is a ValueError like any other
    bad JSON from a server (json raises RecursionError for it)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def server_message(body: bytes, secret: Secret) -> str:
    """The human part of an error body: vLLM's {"object":"error","message":...}, OpenAI's
    {"error":{"message":...}}, FastAPI's {"detail":...}, or the text itself."""
    text = body.decode("utf-8", errors="replace").strip()
    message = text
    try:
        obj = loads_json(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"])
        elif isinstance(err, str) and err:
            message = err
        elif obj.get("message"):
            message = str(obj["message"])
        elif obj.get("detail"):
            detail = obj["detail"]
            if isinstance(detail, list):
                message = "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d)
                                    for d in detail)
            else:
                message = str(detail)
    message = secret.redact(" ".join(message.split()))
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "…"
    return message


def status_error(status: int, reason: str, message: str, ep: Endpoint, secret: Secret,
                  what: str) -> RemoteError:
    said = f": {message}" if message else ""
    if status in (401, 403):
        if secret:
            return RemoteError(f"{ep.display} refused the API key ({status} {reason}){said}",
                               "auth", status)
        return RemoteError(f"{ep.display} needs an API key ({status} {reason}){said}",
                           "auth", status)
    if status in (400, 413, 422):
        return RemoteError(f"{ep.display} rejected the {what} ({status}){said}", "rejected",
                           status)
    if status == 429:
        return RemoteError(f"{ep.display} is busy or rate-limited (429){said}", "rejected",
                           status)
    if status == 404:
        return RemoteError(f"{ep.display} has no OpenAI-compatible {what} endpoint (404){said} "
                           "- check the base URL", "protocol", status)
    if status >= 500:
        return RemoteError(f"{ep.display} failed with a server error ({status} {reason}){said}",
                           "server", status)
    return RemoteError(f"{ep.display} answered {status} {reason}{said}", "protocol", status)


def read_body(resp: http.client.HTTPResponse, ep: Endpoint, timeout: float) -> bytes:
    try:
        return resp.read()
    except (TimeoutError, socket.timeout):
        raise RemoteError(f"{ep.display} stopped answering for {timeout:g} s", "timeout") \
            from None
    except (http.client.HTTPException, OSError) as exc:
        raise RemoteError(f"{ep.display} closed the connection mid-answer "
                          f"({type(exc).__name__})", "protocol") from None


def fetch_models(base_url: str, api_key: str | None = None, *,
                 timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[RemoteModel]:
    """GET {base}/models. Raises RemoteError in words."""
    ep = parse_base_url(base_url)
    check_api_key(api_key)
    secret = Secret(api_key)
    conn = connect(ep, timeout)
    try:
        try:
            conn.request("GET", ep.prefix + "/models", headers=request_headers(secret, None, False))
            resp = conn.getresponse()
        except (TimeoutError, socket.timeout):
            raise RemoteError(f"{ep.display} did not answer within {timeout:g} s",
                              "timeout") from None
        except (http.client.HTTPException, OSError) as exc:
            raise RemoteError(f"{ep.display} dropped the connection "
                              f"({type(exc).__name__})", "protocol") from None
        body = read_body(resp, ep, timeout)
        if resp.status != 200:
            raise status_error(resp.status, resp.reason, server_message(body, secret), ep,
                                secret, "model list request")
    finally:
        conn.close()
    try:
        obj = loads_json(body)
        entries = obj["data"]
        models = [RemoteModel(str(e["id"]),
                              int(e["max_model_len"]) if e.get("max_model_len") else None,
                              e.get("owned_by"))
                  for e in entries]
    except (ValueError, KeyError, TypeError):
        raise RemoteError(f"{ep.display}/models did not return an OpenAI model list "
                          f"(expected {{\"data\": [{{\"id\": ...}}]}})", "protocol") from None
    log.debug("%s serves %d model(s)", ep.display, len(models))
    return models


# ---------------------------------------------------------------------------------------------
# Server-sent events

class StreamBroken(Exception):
    """Internal: the stream ended badly; `kind` and the message say how."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def sse_data(lines: Iterator[bytes]) -> Iterator[str]:
    """The `data` of each server-sent event (multi-line data joined by newlines; comments,
    `event:`/`id:`/`retry:` fields skipped). A last event without its blank line still
    counts, so a `[DONE]` at the very end of the body is seen; a cut line raises."""
    data: list[str] = []
    for raw in lines:
        if not raw.endswith(b"\n"):  # only the last line can lack it: the body was cut
            raise StreamBroken("the connection broke mid-stream (the last line was cut)",
                                "protocol")
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise StreamBroken("the stream is not UTF-8 text", "malformed") from None
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
    if data:
        yield "\n".join(data)


class CancelWatch:
    """Shuts the socket down as soon as `cancel` is set, so a blocked read returns at once."""

    def __init__(self, cancel: threading.Event | None, sock: socket.socket | None):
        self.fired = False
        self._done = threading.Event()
        self._thread = None
        if cancel is not None and sock is not None:
            self._thread = threading.Thread(target=self._watch, args=(cancel, sock),
                                            name="remote-cancel-watch", daemon=True)
            self._thread.start()

    def _watch(self, cancel: threading.Event, sock: socket.socket) -> None:
        while not self._done.wait(CANCEL_POLL_S):
            if cancel.is_set():
                self.fired = True
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
