"""RemoteEngine: the same chat window on an OpenAI-compatible server (vLLM, llama.cpp, ...).

Maps the Engine protocol onto streaming `/v1/chat/completions`; the transport (connections,
errors, `/v1/models`, server-sent events) is engine/remote/transport.py.

How a reply ends (`GenerationResult.finish_reason`):
- "stop" / "length" / "stop_string": the server finished (a reply of tool calls is "stop", its
  calls in `tool_calls`) (stop_string when the server reports
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
it lives in a `Secret` and any server message that echoes it is redacted.

What a local reply carries, a server's does too: a thought the server separates (vLLM's
`reasoning_content`, newer vLLM's and Ollama's `reasoning`, llama.cpp's `reasoning_content`)
streams as `ReasoningPiece`s and ends in `GenerationResult.reasoning`, and so does one it
leaves in the content, `[THINK]thought[/THINK]answer` (llama.cpp's `--reasoning-format none`,
this project's `serve` asked for `reasoning_format: none`; see `_InlineThought`); OpenAI `tool_calls`
(streamed in pieces by index) end in `GenerationResult.tool_calls`, so the window's tool loop
runs on a server as it does on the local model. Tools go out as OpenAI `tools`, earlier calls as
assistant `tool_calls` and their results as `tool` messages.
"""
from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from ..api import (
    ChatMessage,
    FinishReason,
    GenerationResult,
    GenerationStats,
    ImagePart,
    PieceCallback,
    ReasoningPiece,
    SamplingParams,
    ToolCall,
    ToolSpec,
)
from ..runtime.reasoning import END_THINK, THINK
from .transport import (
    CancelWatch, check_api_key, connect, DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S,
    fetch_models, loads_json, parse_base_url, read_body, RemoteError, RemoteModel, request_headers, Secret,
    server_message, sse_data, status_error, StreamBroken,
)

log = logging.getLogger(__name__)


@dataclass
class RemoteGenerationResult(GenerationResult):
    """A GenerationResult plus what only a server can tell: its own usage object and, for an
    "interrupted" reply, why the stream broke."""

    error: str | None = None
    usage: dict | None = None


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
    takes that); a message with images becomes a list of text and image_url parts, in order.
    An assistant's calls go as `tool_calls` (content null when it wrote nothing else, as OpenAI
    sends it), a tool result as a `tool` message naming its call. A thought (ThinkPart) is not
    sent: OpenAI's messages have no place for it, and a server's template drops earlier ones."""
    if message.role not in ("system", "user", "assistant", "tool"):
        raise RemoteError(f"message role {message.role!r}: a remote chat takes only system, "
                          "user, assistant and tool messages", "config")
    if message.role == "tool":
        if not message.tool_call_id:
            raise RemoteError("a tool result must name the call it answers (tool_call_id)", "config")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text_content}
    if message.role == "assistant" and message.tool_calls:
        return {"role": "assistant", "content": message.text_content or None,
                "tool_calls": [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}}
                               for c in message.tool_calls]}
    if not message.images:
        return {"role": message.role, "content": message.text_content}
    content: list[dict] = []
    for part in message.parts:
        if isinstance(part, ImagePart):
            content.append({"type": "image_url", "image_url": {"url": image_data_url(part)}})
        elif isinstance(part, str) and part:
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


def tools_payload(tools: list[ToolSpec]) -> list[dict]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters or {"type": "object", "properties": {}}}}
            for t in tools]


TOOL_CHOICES = ("auto", "required", "none")


def chat_payload(model: str, messages: list[ChatMessage], params: SamplingParams,
                 include_usage: bool = True, tools: list[ToolSpec] | None = None,
                 tool_choice: str | None = None) -> dict:
    """`tool_choice`: OpenAI's "required" (the reply must call a tool) or "none"; None or
    "auto": the field is left out, the server chooses (OpenAI's default when tools are given)."""
    if tool_choice is not None and tool_choice not in TOOL_CHOICES:
        raise RemoteError(f"tool_choice {tool_choice!r}: expected one of {', '.join(TOOL_CHOICES)}", "config")
    body = {"model": model, "messages": [message_payload(m) for m in messages], "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = tools_payload(tools)
        if tool_choice not in (None, "auto"):
            body["tool_choice"] = tool_choice
    body.update(sampling_payload(params))
    return body


# The fields servers put a separated thought in: vLLM's reasoning parsers and llama.cpp write
# `reasoning_content`; newer vLLM, Ollama's OpenAI API and OpenRouter write `reasoning`.
REASONING_FIELDS = ("reasoning_content", "reasoning")


def _reasoning_of(obj: dict) -> str:
    for name in REASONING_FIELDS:
        value = obj.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


class _InlineThought:
    """A thought a server left in the content: a reply whose content begins with `[THINK]`
    (a Mistral reasoning model's control token, as llama.cpp writes it when it does not parse
    the thought out) has its thought up to `[/THINK]` routed apart, as the local engine splits it
    at the tokens (engine/runtime/reasoning.py). Text-level and streamed: a marker split across
    pieces is held back until the next piece (or the reply's end) tells. Content that does not
    begin with [THINK] is all answer; a thought never closed is all thought; the markers
    themselves are in neither. A server that separates the thought itself (`reasoning_content`)
    is never looked at this way."""

    def __init__(self) -> None:
        self.state = "start"  # deciding (no content yet, or a prefix of [THINK]); "thought"; "answer"
        self.held = ""  # while deciding: what could still begin [THINK]
        self._thought = None  # in the thought: a StopStringFilter at [/THINK] (it holds back a partial one)
        self._in_thought = ""  # everything fed to it

    def push(self, text: str) -> tuple[str, str]:
        """(thought, answer) that this piece of content adds."""
        if self.state == "start":
            text, self.held = self.held + text, ""
            if not text.startswith(THINK):
                if THINK.startswith(text):  # could still become [THINK]
                    self.held = text
                    return "", ""
                self.state = "answer"
                return "", text
            from ..runtime.generate import StopStringFilter  # torch: not at the CLI parser's import

            self.state, self._thought, text = "thought", StopStringFilter(END_THINK), text[len(THINK):]
        if self.state == "answer":
            return "", text
        self._in_thought += text
        thought = self._thought.feed(text)
        if not self._thought.stopped:
            return thought, ""
        self.state = "answer"  # what followed the first [/THINK]: the filter keeps the text before it
        return thought, self._in_thought[len(self._thought.text) + len(END_THINK):]

    def flush(self) -> tuple[str, str]:
        """The held-back text at the reply's end, to the side it was on."""
        if self.state == "thought":
            return self._thought.feed("", final=True), ""
        held, self.held = self.held, ""
        return "", held


@dataclass
class _CallSoFar:
    """A streamed tool call: OpenAI sends its id and name first, its arguments in pieces."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _add_tool_call_deltas(calls: dict[int, _CallSoFar], deltas) -> bool:
    """Streamed `tool_calls` entries into `calls` (by their index); whether any arrived."""
    if not isinstance(deltas, list):
        return False
    seen = False
    for position, d in enumerate(deltas):
        if not isinstance(d, dict):
            continue
        index = d.get("index", position)
        call = calls.setdefault(int(index) if isinstance(index, int) else position, _CallSoFar())
        if isinstance(d.get("id"), str) and d["id"]:
            call.id = d["id"]
        fn = d.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str) and fn["name"]:
                call.name = fn["name"]
            arguments = fn.get("arguments")
            if isinstance(arguments, dict):  # a server that sends the object itself (Ollama)
                arguments = json.dumps(arguments, ensure_ascii=False)
            if isinstance(arguments, str):
                call.arguments.append(arguments)
        seen = True
    return seen


def _finished_calls(calls: dict[int, _CallSoFar]) -> list[ToolCall]:
    """The calls in index order; a call without an id gets one (the next request must name it)."""
    from ..mistral3.chat_format import new_call_id

    return [ToolCall(c.id or new_call_id(), c.name, "".join(c.arguments) or "{}")
            for _, c in sorted(calls.items()) if c.name]


@dataclass
class _Progress:
    pieces: list[str] = field(default_factory=list)
    thought: list[str] = field(default_factory=list)  # reasoning pieces
    separated: bool = False  # the server sent a reasoning field: its content is all answer
    inline: _InlineThought = field(default_factory=_InlineThought)  # else a thought left in the content
    calls: dict[int, _CallSoFar] = field(default_factory=dict)
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

    @property
    def received(self) -> bool:
        """Whether anything worth keeping arrived (answer text, thought or calls)."""
        return bool(self.pieces or self.thought or self.calls)


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


def _add_thought(progress: _Progress, text: str, on_piece: PieceCallback | None) -> None:
    if text:
        progress.thought.append(text)
        if on_piece is not None:
            on_piece(ReasoningPiece(text))


def _add_text(progress: _Progress, text: str, on_piece: PieceCallback | None) -> None:
    if text:
        progress.pieces.append(text)
        if on_piece is not None:
            on_piece(text)


def _add_content(progress: _Progress, content: str, on_piece: PieceCallback | None) -> None:
    """The server's content: answer, or a thought it left there (`_InlineThought`)."""
    if progress.separated and progress.inline.state == "start":
        _add_text(progress, content, on_piece)
        return
    thought, answer = progress.inline.push(content)
    _add_thought(progress, thought, on_piece)
    _add_text(progress, answer, on_piece)


def _flush_inline(progress: _Progress, on_piece: PieceCallback | None) -> None:
    """The reply ended: text held back as a possible marker goes where it was."""
    thought, answer = progress.inline.flush()
    _add_thought(progress, thought, on_piece)
    _add_text(progress, answer, on_piece)


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
        if not isinstance(delta, dict):
            delta = {}
        content = delta.get("content")
        thought = _reasoning_of(delta)
        called = _add_tool_call_deltas(progress.calls, delta.get("tool_calls"))
        if (isinstance(content, str) and "role" not in delta) or thought or called:
            # One chunk per token, even when the token completes no character yet ("" from
            # llama.cpp, vLLM's EOS); the opening role chunk is not a token.
            progress.token_chunks += 1
        if thought or called:
            if progress.t_first is None:
                progress.t_first = now
            progress.t_last = now
        if thought:
            progress.separated = True
            _add_thought(progress, thought, on_piece)
        if isinstance(content, str) and content:
            if progress.t_first is None:
                progress.t_first = now
            progress.t_last = now
            _add_content(progress, content, on_piece)
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
        check_api_key(api_key)
        self._endpoint = parse_base_url(base_url)
        self._secret = Secret(api_key)
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
    def device_kind(self) -> str:
        return "remote"

    @property
    def context_size(self) -> int:
        """The server's max_model_len for this model once /v1/models said it (0 before)."""
        return self._context_size or 0

    @property
    def context_limit(self) -> int:
        return 0  # the server's model file is not ours to read

    @property
    def placement(self) -> dict:
        return {}

    @property
    def writes_tool_calls(self) -> bool:
        return False  # the server writes and parses its model's calls: they come back as OpenAI tool_calls

    def count_tokens(self, messages: list[ChatMessage]) -> None:
        return None  # an OpenAI-compatible server has no token count endpoint

    def forget_chat(self, messages: list[ChatMessage]) -> None:
        pass  # nothing of a chat is kept here

    def forget_session(self, session_key: str) -> None:
        pass

    model_path = None  # the server's model file is not ours to read
    image_geometry = None  # nor its tower
    think_ids = None  # nor its tokenizer's ids (its reasoning comes apart: reasoning_content)
    chat_version = 0

    def encode_images(self, messages, last: int, progress=None) -> None:
        """The server encodes its images: nothing to do here."""

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
             session_key: str | None = None, tools: list[ToolSpec] | None = None,
             on_prompt_progress=None, tool_choice: str | None = None) -> RemoteGenerationResult:
        # on_prompt_progress: never called (an OpenAI-compatible server does not report its prompt reading)
        if not messages:
            raise RemoteError("nothing to send: the chat has no messages", "config")
        payload = chat_payload(self.model, messages, params, self._include_usage, tools, tool_choice)
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
        conn = connect(ep, self.connect_timeout)
        watch = CancelWatch(cancel, conn.sock)
        t_sent = time.perf_counter()
        broken: StreamBroken | None = None
        try:
            conn.sock.settimeout(self.read_timeout)
            try:
                conn.request("POST", ep.prefix + "/chat/completions", body=body,
                             headers=request_headers(self._secret, body, True))
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
            except StreamBroken as exc:
                broken = exc
        finally:
            watch.stop()
            conn.close()
        _flush_inline(progress, on_piece)

        complete = progress.done or progress.server_finish is not None
        if not complete and (watch.fired or (cancel is not None and cancel.is_set())):
            return self._result(progress, "cancelled", t_sent, None)
        if broken is None and not progress.done and progress.server_finish is None:
            broken = StreamBroken("the server closed the stream before [DONE]", "protocol")
        if broken is not None and progress.server_finish is None:
            message = f"{ep.display}: {self._secret.redact(str(broken))}"
            if not progress.received:
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
                    raise StreamBroken(f"the server sent nothing for {self.read_timeout:g} s",
                                        "timeout") from None
                except (http.client.HTTPException, OSError) as exc:
                    raise StreamBroken(f"the connection broke mid-stream "
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
                obj = loads_json(data)
            except ValueError:
                raise StreamBroken(f"malformed stream line (not JSON): {data[:80]!r}",
                                    "malformed") from None
            if not isinstance(obj, dict):
                raise StreamBroken(f"malformed stream line (not an object): {data[:80]!r}",
                                    "malformed")
            error = _stream_error_message(obj)
            if error is not None:
                raise StreamBroken(f"the server reported an error mid-stream: {error}",
                                    "server")
            _consume_chunk(obj, progress, on_piece, time.perf_counter())

    def _non_streamed(self, resp: http.client.HTTPResponse, on_piece: PieceCallback | None,
                      t_sent: float) -> RemoteGenerationResult:
        """A server that ignored `stream: true` and sent one JSON completion."""
        body = read_body(resp, self._endpoint, self.read_timeout)
        progress = _Progress()
        try:
            obj = loads_json(body)
            choice = obj["choices"][0]
            message = choice["message"]
            text = message.get("content") or ""
            thought = _reasoning_of(message)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise RemoteError(f"{self._endpoint.display} answered neither an event stream nor "
                              "a chat completion", "malformed") from None
        now = time.perf_counter()
        progress.t_first_any = progress.t_first = progress.t_last = now
        _add_tool_call_deltas(progress.calls, message.get("tool_calls"))
        if thought:
            progress.separated = True
            _add_thought(progress, thought, on_piece)
        if text:
            progress.token_chunks = 1
            _add_content(progress, text, on_piece)
            _flush_inline(progress, on_piece)
        progress.server_finish = choice.get("finish_reason") or "stop"
        progress.stop_reason = choice.get("stop_reason")
        progress.usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
        progress.done = True
        return self._result(progress, _map_finish(progress), t_sent, None)

    def _result(self, progress: _Progress, finish: FinishReason, t_sent: float,
                error: str | None) -> RemoteGenerationResult:
        stats = _stats(progress, t_sent, finish, self._context_size or 0)
        # calls cut by Stop or a broken stream are never run: only a reply the server ended has them
        calls = _finished_calls(progress.calls) if finish not in ("cancelled", "interrupted") else []
        return RemoteGenerationResult(progress.text, [], [], stats, error=error, usage=progress.usage,
                                      tool_calls=calls,
                                      reasoning="".join(progress.thought))

    def _http_error(self, resp: http.client.HTTPResponse) -> RemoteError:
        ep = self._endpoint
        try:
            body = resp.read()
        except (http.client.HTTPException, OSError):
            body = b""
        message = server_message(body, self._secret)
        if resp.status == 404:
            return self._not_found(message)
        return status_error(resp.status, resp.reason, message, ep, self._secret,
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
        return status_error(404, "Not Found", message, ep, self._secret, "chat")

    def _fill_context_size(self) -> None:
        self._context_size_tried = True
        try:
            self.list_models()
        except RemoteError as exc:
            log.debug("no context size from %s: %s", self._endpoint.display, exc)
