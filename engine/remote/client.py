"""RemoteEngine: the same chat window on an OpenAI-compatible server (vLLM, llama.cpp, ...).

Speaks `/v1/models` and streaming `/v1/chat/completions` (server-sent events) with the
standard library only, so no new runtime dependency.

How a reply ends (`GenerationResult.finish_reason`):
- "stop" / "length" / "stop_string": the server finished (stop_string when the server reports
  that a user stop string ended it, as vLLM does through `stop_reason`).
- "cancelled": the caller set `cancel`; the connection is closed at once (a watcher thread
  shuts the socket down, so even a server that is still thinking cannot hold us) and the
  text received so far is returned.
- "interrupted": the stream broke after some text had arrived (connection cut before
  `[DONE]`, server stalled past `read_timeout`, malformed SSE line, error event mid-stream).
  chat() then RETURNS a `RemoteGenerationResult` holding the partial text, with the reason in
  words in `.error`, so the caller never loses what was already shown. If the stream breaks
  before any text arrived there is nothing to save and chat() raises `RemoteError` instead.

Every failure the user should read is a `RemoteError` (an `EngineError`) whose `kind` says
what happened (unreachable, auth, model_not_found, rejected, server, timeout, malformed,
protocol, config). The API key is never written into reprs, log records or error messages:
it lives in a `_Secret` and any server message that echoes it is redacted.
"""
from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit

from ..api import (
    ChatMessage,
    EngineError,
    FinishReason,
    GenerationResult,
    GenerationStats,
    ImagePart,
    PieceCallback,
    SamplingParams,
)

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT_S = 10.0
# A server may think a long time before its first chunk (big prompt, many images): the read
# timeout is the longest silence we accept, before the first chunk and between chunks.
DEFAULT_READ_TIMEOUT_S = 300.0
_CANCEL_POLL_S = 0.05
_MAX_ERROR_CHARS = 500


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


@dataclass
class RemoteGenerationResult(GenerationResult):
    """A GenerationResult plus what only a server can tell: its own usage object and, for an
    "interrupted" reply, why the stream broke."""

    error: str | None = None
    usage: dict | None = None


@dataclass(frozen=True)
class RemoteModel:
    id: str
    max_model_len: int | None = None  # vLLM reports it; other servers may not
    owned_by: str | None = None


class _Secret:
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


def _check_api_key(api_key: str | None) -> None:
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

def _connect(ep: Endpoint, connect_timeout: float) -> http.client.HTTPConnection:
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


def _headers(secret: _Secret, body: bytes | None, stream: bool) -> dict[str, str]:
    headers = {"Accept": "text/event-stream" if stream else "application/json",
               "User-Agent": "tramontane"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if secret:
        headers["Authorization"] = f"Bearer {secret.reveal()}"
    return headers


def _server_message(body: bytes, secret: _Secret) -> str:
    """The human part of an error body: vLLM's {"object":"error","message":...}, OpenAI's
    {"error":{"message":...}}, FastAPI's {"detail":...}, or the text itself."""
    text = body.decode("utf-8", errors="replace").strip()
    message = text
    try:
        obj = json.loads(text)
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
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + "…"
    return message


def _status_error(status: int, reason: str, message: str, ep: Endpoint, secret: _Secret,
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


def _read_body(resp: http.client.HTTPResponse, ep: Endpoint, timeout: float) -> bytes:
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
    _check_api_key(api_key)
    secret = _Secret(api_key)
    conn = _connect(ep, timeout)
    try:
        try:
            conn.request("GET", ep.prefix + "/models", headers=_headers(secret, None, False))
            resp = conn.getresponse()
        except (TimeoutError, socket.timeout):
            raise RemoteError(f"{ep.display} did not answer within {timeout:g} s",
                              "timeout") from None
        except (http.client.HTTPException, OSError) as exc:
            raise RemoteError(f"{ep.display} dropped the connection "
                              f"({type(exc).__name__})", "protocol") from None
        body = _read_body(resp, ep, timeout)
        if resp.status != 200:
            raise _status_error(resp.status, resp.reason, _server_message(body, secret), ep,
                                secret, "model list request")
    finally:
        conn.close()
    try:
        obj = json.loads(body)
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
# Request building

_IMAGE_MAGIC = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
]


def image_mime(image: ImagePart) -> str:
    """The MIME type from the file's own bytes (never its name)."""
    data = image.data
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    for magic, mime in _IMAGE_MAGIC:
        if data.startswith(magic):
            return mime
    raise RemoteError(f"{image.name}: not a PNG, JPEG, WebP, GIF, BMP or TIFF image "
                      "(unrecognised file header)", "config")


def image_data_url(image: ImagePart) -> str:
    return f"data:{image_mime(image)};base64,{base64.b64encode(image.data).decode('ascii')}"


def message_payload(message: ChatMessage) -> dict:
    """One OpenAI chat message. Text-only messages keep a plain string content (every server
    takes that); a message with images becomes a list of text and image_url parts, in order."""
    if message.role not in ("system", "user", "assistant"):
        raise RemoteError(f"message role {message.role!r}: a remote chat takes only system, "
                          "user and assistant messages", "config")
    if not message.images:
        return {"role": message.role, "content": message.text_content}
    content: list[dict] = []
    for part in message.parts:
        if isinstance(part, ImagePart):
            content.append({"type": "image_url", "image_url": {"url": image_data_url(part)}})
        elif part:
            if content and content[-1]["type"] == "text":  # merge neighbouring text parts
                content[-1]["text"] += part
            else:
                content.append({"type": "text", "text": part})
    return {"role": message.role, "content": content}


def sampling_payload(params: SamplingParams) -> dict:
    """OpenAI fields always; vLLM's extra fields only when set away from their defaults, so
    strict servers that do not know them are not bothered."""
    body: dict = {"max_tokens": int(params.max_tokens), "temperature": float(params.temperature),
                  "top_p": float(params.top_p)}
    if params.seed is not None:
        body["seed"] = int(params.seed)
    if params.stop:
        body["stop"] = list(params.stop)
    if params.top_k and params.top_k > 0:
        body["top_k"] = int(params.top_k)
    if params.min_p and params.min_p > 0.0:
        body["min_p"] = float(params.min_p)
    if params.repetition_penalty != 1.0:
        body["repetition_penalty"] = float(params.repetition_penalty)
    if params.ignore_eos:
        body["ignore_eos"] = True
    return body


def chat_payload(model: str, messages: list[ChatMessage], params: SamplingParams,
                 include_usage: bool = True) -> dict:
    body = {"model": model, "messages": [message_payload(m) for m in messages], "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(sampling_payload(params))
    return body


# ---------------------------------------------------------------------------------------------
# Streaming

class _StreamBroken(Exception):
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
            raise _StreamBroken("the connection broke mid-stream (the last line was cut)",
                                "protocol")
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise _StreamBroken("the stream is not UTF-8 text", "malformed") from None
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


class _CancelWatch:
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
        while not self._done.wait(_CANCEL_POLL_S):
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


@dataclass
class _Progress:
    pieces: list[str] = field(default_factory=list)
    token_chunks: int = 0
    t_first: float | None = None  # first chunk with text
    t_last: float | None = None
    t_first_any: float | None = None  # first chunk of any kind (for empty replies)
    server_finish: str | None = None
    stop_reason: object = None
    usage: dict | None = None
    done: bool = False

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _stream_error_message(obj: dict) -> str | None:
    """vLLM sends a mid-stream failure as an event `{"error": {...}}` (older versions:
    `{"object": "error", "message": ...}`)."""
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)
    if isinstance(err, str):
        return err
    if obj.get("object") == "error":
        return str(obj.get("message") or "unknown error")
    return None


def _consume_chunk(obj: dict, progress: _Progress, on_piece: PieceCallback | None,
                   now: float) -> None:
    if progress.t_first_any is None:
        progress.t_first_any = now
    if isinstance(obj.get("usage"), dict):
        progress.usage = obj["usage"]
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str) and "role" not in delta:
            # One chunk per token, even when the token completes no character yet ("" from
            # llama.cpp, vLLM's EOS); the opening role chunk is not a token.
            progress.token_chunks += 1
        if isinstance(content, str) and content:
            if progress.t_first is None:
                progress.t_first = now
            progress.t_last = now
            progress.pieces.append(content)
            if on_piece is not None:
                on_piece(content)
        if choice.get("finish_reason"):
            progress.server_finish = str(choice["finish_reason"])
            progress.stop_reason = choice.get("stop_reason")


def _map_finish(progress: _Progress) -> FinishReason:
    reason = progress.server_finish
    if reason == "length":
        return "length"
    if reason == "stop" and isinstance(progress.stop_reason, str):
        return "stop_string"  # vLLM names the user stop string that ended the reply
    if reason == "abort":
        return "interrupted"
    return "stop"  # stop, tool_calls, content_filter, eos...


def _stats(progress: _Progress, t_sent: float, finish: FinishReason,
           context_size: int) -> GenerationStats:
    usage = progress.usage or {}

    def count(key: str) -> int:
        value = usage.get(key)
        return int(value) if isinstance(value, (int, float)) else 0

    prompt_tokens = count("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    reused = int(cached) if isinstance(cached, (int, float)) else 0
    # Without usage (cancelled, cut, or a server that ignores include_usage), count token
    # chunks: vLLM and llama.cpp send one chunk per token (vLLM may batch a few under load).
    generated = count("completion_tokens") if "completion_tokens" in usage \
        else progress.token_chunks
    t_first = progress.t_first if progress.t_first is not None else progress.t_first_any
    ttft = (t_first - t_sent) if t_first is not None else 0.0
    prefilled = max(prompt_tokens - reused, 0)
    prefill_tok_s = prefilled / ttft if ttft > 0 and prefilled else 0.0
    # The first token's time is in ttft; the rest streamed between first and last text chunk.
    decode_s = (progress.t_last - progress.t_first) if progress.t_first is not None else 0.0
    decode_tok_s = (generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0.0
    return GenerationStats(
        prompt_tokens=prompt_tokens, reused_tokens=reused, prefilled_tokens=prefilled,
        generated_tokens=generated, ttft_s=ttft, prefill_tok_s=prefill_tok_s,
        decode_tok_s=decode_tok_s, context_used=prompt_tokens + generated,
        context_size=context_size, finish_reason=finish)


class RemoteEngine:
    """`Engine` for an OpenAI-compatible server. Not thread-safe (one worker thread owns it),
    except that `cancel` may be set from any thread."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                 read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                 vision: bool = True):
        if not model or not model.strip():
            raise RemoteError("model: give the name of a model the server serves", "config")
        _check_api_key(api_key)
        self._endpoint = parse_base_url(base_url)
        self._secret = _Secret(api_key)
        self.model = model.strip()
        self.connect_timeout = float(connect_timeout)
        self.read_timeout = float(read_timeout)
        self._vision = vision
        self._include_usage = True  # dropped once if the server refuses stream_options
        self._context_size: int | None = None
        self._context_size_tried = False

    # -- Engine protocol ------------------------------------------------------------------
    @property
    def description(self) -> str:
        return f"{self.model} on {self._endpoint.display}"

    @property
    def has_vision(self) -> bool:
        # A server does not say; it answers 400 in words when the model cannot take images.
        return self._vision

    @property
    def base_url(self) -> str:
        return self._endpoint.display

    def __repr__(self) -> str:
        return (f"RemoteEngine(base_url={self._endpoint.display!r}, model={self.model!r}, "
                f"api_key={self._secret!r})")

    def close(self) -> None:
        pass  # one connection per request; nothing held open

    def list_models(self) -> list[RemoteModel]:
        models = fetch_models(self._endpoint.display, self._secret.reveal(),
                              timeout=self.connect_timeout)
        for m in models:
            if m.id == self.model and m.max_model_len:
                self._context_size = m.max_model_len
        self._context_size_tried = True
        return models

    def chat(self, messages: list[ChatMessage], params: SamplingParams,
             on_piece: PieceCallback | None = None, cancel: threading.Event | None = None,
             session_key: str | None = None) -> RemoteGenerationResult:
        if not messages:
            raise RemoteError("nothing to send: the chat has no messages", "config")
        payload = chat_payload(self.model, messages, params, self._include_usage)
        try:
            return self._stream(payload, on_piece, cancel)
        except RemoteError as exc:
            if (exc.kind == "rejected" and self._include_usage
                    and "stream_options" in str(exc)):
                # Older servers refuse stream_options: ask again without usage.
                log.info("%s refuses stream_options; retrying without usage",
                         self._endpoint.display)
                self._include_usage = False
                payload.pop("stream_options", None)
                return self._stream(payload, on_piece, cancel)
            raise

    # -- internals --------------------------------------------------------------------------
    def _stream(self, payload: dict, on_piece: PieceCallback | None,
                cancel: threading.Event | None) -> RemoteGenerationResult:
        ep = self._endpoint
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        n_images = sum(1 for m in payload["messages"] if isinstance(m["content"], list)
                       for p in m["content"] if p["type"] == "image_url")
        log.debug("POST %s/chat/completions model=%s messages=%d images=%d bytes=%d",
                  ep.display, self.model, len(payload["messages"]), n_images, len(body))
        progress = _Progress()
        if cancel is not None and cancel.is_set():
            return self._result(progress, "cancelled", time.perf_counter(), None)
        conn = _connect(ep, self.connect_timeout)
        watch = _CancelWatch(cancel, conn.sock)
        t_sent = time.perf_counter()
        broken: _StreamBroken | None = None
        try:
            conn.sock.settimeout(self.read_timeout)
            try:
                conn.request("POST", ep.prefix + "/chat/completions", body=body,
                             headers=_headers(self._secret, body, True))
                resp = conn.getresponse()
            except (TimeoutError, socket.timeout):
                if watch.fired:
                    return self._result(progress, "cancelled", t_sent, None)
                raise RemoteError(f"{ep.display} did not start answering within "
                                  f"{self.read_timeout:g} s", "timeout") from None
            except (http.client.HTTPException, OSError) as exc:
                if watch.fired:
                    return self._result(progress, "cancelled", t_sent, None)
                raise RemoteError(f"{ep.display} dropped the connection before answering "
                                  f"({type(exc).__name__})", "protocol") from None
            if resp.status != 200:
                raise self._http_error(resp)
            content_type = resp.getheader("Content-Type", "") or ""
            if "text/event-stream" not in content_type:
                return self._non_streamed(resp, on_piece, t_sent)
            try:
                self._read_events(resp, progress, on_piece, cancel)
            except _StreamBroken as exc:
                broken = exc
        finally:
            watch.stop()
            conn.close()

        complete = progress.done or progress.server_finish is not None
        if not complete and (watch.fired or (cancel is not None and cancel.is_set())):
            return self._result(progress, "cancelled", t_sent, None)
        if broken is None and not progress.done and progress.server_finish is None:
            broken = _StreamBroken("the server closed the stream before [DONE]", "protocol")
        if broken is not None and progress.server_finish is None:
            message = f"{ep.display}: {self._secret.redact(str(broken))}"
            if not progress.pieces:
                raise RemoteError(message, broken.kind)
            log.warning("reply interrupted after %d characters: %s", len(progress.text), message)
            return self._result(progress, "interrupted", t_sent, message)
        # A finish_reason arrived, so the text is complete even if [DONE] or usage did not.
        if not self._context_size_tried:
            self._fill_context_size()
        return self._result(progress, _map_finish(progress), t_sent, None)

    def _read_events(self, resp: http.client.HTTPResponse, progress: _Progress,
                     on_piece: PieceCallback | None, cancel: threading.Event | None) -> None:
        def lines() -> Iterator[bytes]:
            while True:
                try:
                    line = resp.readline()
                except (TimeoutError, socket.timeout):
                    raise _StreamBroken(f"the server sent nothing for {self.read_timeout:g} s",
                                        "timeout") from None
                except (http.client.HTTPException, OSError) as exc:
                    raise _StreamBroken(f"the connection broke mid-stream "
                                        f"({type(exc).__name__})", "protocol") from None
                if not line:
                    return
                yield line

        for data in sse_data(lines()):
            if cancel is not None and cancel.is_set():
                return
            if data.strip() == "[DONE]":
                progress.done = True
                return
            try:
                obj = json.loads(data)
            except ValueError:
                raise _StreamBroken(f"malformed stream line (not JSON): {data[:80]!r}",
                                    "malformed") from None
            if not isinstance(obj, dict):
                raise _StreamBroken(f"malformed stream line (not an object): {data[:80]!r}",
                                    "malformed")
            error = _stream_error_message(obj)
            if error is not None:
                raise _StreamBroken(f"the server reported an error mid-stream: {error}",
                                    "server")
            _consume_chunk(obj, progress, on_piece, time.perf_counter())

    def _non_streamed(self, resp: http.client.HTTPResponse, on_piece: PieceCallback | None,
                      t_sent: float) -> RemoteGenerationResult:
        """A server that ignored `stream: true` and sent one JSON completion."""
        body = _read_body(resp, self._endpoint, self.read_timeout)
        progress = _Progress()
        try:
            obj = json.loads(body)
            choice = obj["choices"][0]
            text = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise RemoteError(f"{self._endpoint.display} answered neither an event stream nor "
                              "a chat completion", "malformed") from None
        now = time.perf_counter()
        progress.t_first_any = progress.t_first = progress.t_last = now
        if text:
            progress.pieces.append(text)
            progress.token_chunks = 1
            if on_piece is not None:
                on_piece(text)
        progress.server_finish = choice.get("finish_reason") or "stop"
        progress.stop_reason = choice.get("stop_reason")
        progress.usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
        progress.done = True
        return self._result(progress, _map_finish(progress), t_sent, None)

    def _result(self, progress: _Progress, finish: FinishReason, t_sent: float,
                error: str | None) -> RemoteGenerationResult:
        stats = _stats(progress, t_sent, finish, self._context_size or 0)
        return RemoteGenerationResult(progress.text, [], [], stats, error=error,
                                      usage=progress.usage)

    def _http_error(self, resp: http.client.HTTPResponse) -> RemoteError:
        ep = self._endpoint
        try:
            body = resp.read()
        except (http.client.HTTPException, OSError):
            body = b""
        message = _server_message(body, self._secret)
        if resp.status == 404:
            return self._not_found(message)
        return _status_error(resp.status, resp.reason, message, ep, self._secret,
                             "chat request")

    def _not_found(self, message: str) -> RemoteError:
        """404 means an unknown model or a wrong base URL; the model list tells which."""
        ep = self._endpoint
        try:
            models = [m.id for m in fetch_models(ep.display, self._secret.reveal(),
                                                 timeout=self.connect_timeout)]
        except RemoteError:
            models = None
        if models is not None and self.model not in models:
            served = ", ".join(models) if models else "no models"
            return RemoteError(f"{ep.display} does not serve the model {self.model!r} "
                               f"(404); it serves: {served}", "model_not_found", 404, models)
        return _status_error(404, "Not Found", message, ep, self._secret, "chat")

    def _fill_context_size(self) -> None:
        self._context_size_tried = True
        try:
            self.list_models()
        except RemoteError as exc:
            log.debug("no context size from %s: %s", self._endpoint.display, exc)
