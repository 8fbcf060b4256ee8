"""A loopback stand-in for `vllm serve`: the OpenAI routes vLLM has, its chunk and error
shapes, and faults on demand.

Shapes follow vLLM's `chat_completion_stream_generator` (chunks dumped with
`exclude_unset`): a first chunk with `{"role": "assistant", "content": ""}`, one chunk per
token, the last token's chunk carrying `finish_reason` (and `stop_reason`), then with
`stream_options.include_usage` a chunk with `"choices": []` and `usage`, then `data: [DONE]`.
Bodies go out with chunked transfer encoding, as uvicorn sends them. Errors are vLLM's
`ErrorResponse` (`{"object":"error","message":...,"type":...,"param":null,"code":...}`;
`error_style="nested"` gives the newer `{"error": {...}}`), and a bad key gets the API-key
middleware's `{"error": "Unauthorized"}` with 401.

Usage:
    with FakeVLLM(api_key="k", reply="Hello there") as server:
        server.url            # "http://127.0.0.1:PORT/v1"
        server.requests[-1]   # what arrived (headers, JSON body, decoded images)
"""
from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_DATA_URL = re.compile(r"^data:(image/[a-z0-9.+-]+);base64,(.*)$", re.S)
_WORD = re.compile(r"\s*\S+|\s+")


def split_tokens(text: str) -> list[str]:
    """The fake's 'tokens': each word with its leading blanks."""
    return _WORD.findall(text)


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict | None
    images: list[tuple[str, bytes]] = field(default_factory=list)  # (mime, bytes) in order


class FakeVLLM:
    """Settable attributes (change them between requests):

    api_key            required Bearer key, None for an open server
    models             served model ids; max_model_len reported for each
    reply              text the model 'generates' (split into word tokens)
    max_images         > this many images in a request -> 400 like vLLM's limit_mm_per_prompt
    max_model_len      prompt + max_tokens beyond it -> 400 with vLLM's context message
    chunk_delay_s      pause between token chunks
    models_delay_s     pause before answering /v1/models
    fault              None, "cut", "stall", "malformed", "deep", "error_event", "status"
    fault_after        token chunks sent before the fault
    fault_status       HTTP status for fault="status"
    stall_s            how long "stall" blocks (released early by stop())
    error_style        "legacy" (object: error) or "nested" ({"error": {...}})
    ignore_stream      answer one JSON completion even when stream is true
    reject_stream_options  400 for requests carrying stream_options (a strict old server)
    """

    def __init__(self, *, api_key: str | None = None, models: list[str] | None = None,
                 reply: str = "Hello from the fake vLLM server.", max_model_len: int = 4096):
        self.api_key = api_key
        self.models = list(models or ["mistral-small-3.1"])
        self.reply = reply
        self.max_images: int | None = None
        self.max_model_len = max_model_len
        self.chunk_delay_s = 0.0
        self.models_delay_s = 0.0
        self.fault: str | None = None
        self.fault_after = 2
        self.fault_status = 500
        self.stall_s = 30.0
        self.error_style = "legacy"
        self.ignore_stream = False
        self.reject_stream_options = False
        self.requests: list[RecordedRequest] = []
        self.last_usage: dict | None = None
        self.client_gone = threading.Event()  # set when a write hit a closed connection
        self._release = threading.Event()
        self._scheme = "http"
        self._server = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def use_tls(self, certfile: str, keyfile: str) -> "FakeVLLM":
        """Serve https with this certificate (call before start())."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile, keyfile)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._scheme = "https"
        return self

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeVLLM":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeVLLM":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- pieces shared with the handler ----------------------------------------------------
    def error_body(self, message: str, err_type: str, code: int) -> dict:
        if self.error_style == "nested":
            return {"error": {"message": message, "type": err_type, "param": None, "code": code}}
        return {"object": "error", "message": message, "type": err_type, "param": None,
                "code": code}

    @staticmethod
    def count_prompt_tokens(body: dict) -> int:
        """Deterministic stand-in for a tokenizer: 4 per message, 1 per word, 16 per image."""
        total = 0
        for message in body.get("messages", []):
            total += 4
            content = message.get("content")
            if isinstance(content, str):
                total += len(content.split())
            else:
                for part in content or []:
                    if part.get("type") == "text":
                        total += len(part.get("text", "").split())
                    elif part.get("type") == "image_url":
                        total += 16
        return total


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address) -> None:
        # A client that hangs up (cancel, cut tests, keep-alive closed) is not a fake bug.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def _make_handler(fake: FakeVLLM):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        # -- helpers ------------------------------------------------------------------------
        def _json(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, err_type: str) -> None:
            self._json(status, fake.error_body(message, err_type, status))

        def _authorized(self) -> bool:
            if fake.api_key is None:
                return True
            if self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                return True
            self._json(401, {"error": "Unauthorized"})
            return False

        def _record(self, body: dict | None) -> RecordedRequest:
            rec = RecordedRequest(self.command, self.path, dict(self.headers.items()), body)
            fake.requests.append(rec)
            return rec

        # -- routes -------------------------------------------------------------------------
        def do_GET(self) -> None:
            self._record(None)
            if self.path != "/v1/models":
                self._json(404, {"detail": "Not Found"})
                return
            if not self._authorized():
                return
            if fake.models_delay_s:
                fake._release.wait(fake.models_delay_s)
            now = int(time.time())
            self._json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": now, "owned_by": "vllm", "root": m,
                 "parent": None, "max_model_len": fake.max_model_len,
                 "permission": []} for m in fake.models]})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                self._record(None)
                self._error(400, "Invalid JSON body", "BadRequestError")
                return
            rec = self._record(body)
            if self.path != "/v1/chat/completions":
                self._json(404, {"detail": "Not Found"})
                return
            if not self._authorized():
                return
            if fake.fault == "status":
                self._error(fake.fault_status, "Internal server error: engine dead"
                            if fake.fault_status >= 500 else "fault", "InternalServerError")
                return
            if fake.reject_stream_options and "stream_options" in body:
                self._error(400, "Unrecognized request argument supplied: stream_options",
                            "BadRequestError")
                return
            model = body.get("model")
            if model not in fake.models:
                self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
                return
            for message in body.get("messages", []):
                content = message.get("content")
                if isinstance(content, list):
                    for part in content:
                        if part.get("type") == "image_url":
                            match = _DATA_URL.match(part["image_url"]["url"])
                            if not match:
                                self._error(400, "Invalid image URL", "BadRequestError")
                                return
                            rec.images.append((match[1], base64.b64decode(match[2])))
            if fake.max_images is not None and len(rec.images) > fake.max_images:
                self._error(400, f"At most {fake.max_images} image(s) may be provided in one "
                            "request. You can set `--limit-mm-per-prompt` to increase this "
                            "limit if the model supports it.", "BadRequestError")
                return
            prompt_tokens = fake.count_prompt_tokens(body)
            max_tokens = int(body.get("max_tokens") or 16)
            if prompt_tokens + max_tokens > fake.max_model_len:
                self._error(400, f"This model's maximum context length is "
                            f"{fake.max_model_len} tokens. However, you requested "
                            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                            f"messages, {max_tokens} in the completion). Please reduce the "
                            "length of the messages or completion.", "BadRequestError")
                return
            self._generate(body, prompt_tokens, max_tokens)

        # -- generation ---------------------------------------------------------------------
        def _plan(self, body: dict, max_tokens: int):
            """The tokens to send, finish_reason, stop_reason and completion token count."""
            tokens = split_tokens(fake.reply)
            stops = body.get("stop") or []
            if isinstance(stops, str):
                stops = [stops]
            text = ""
            for i, token in enumerate(tokens[:max_tokens]):
                candidate = text + token
                for stop in stops:
                    at = candidate.find(stop)
                    if at >= 0:
                        # vLLM cuts the text at the stop string and names it in stop_reason
                        return tokens[:i] + [candidate[len(text):at]], "stop", stop, i + 1
                text = candidate
            if len(tokens) > max_tokens:
                return tokens[:max_tokens], "length", None, max_tokens
            # An EOS token ends it: it is counted but detokenizes to "" in the final chunk.
            return tokens + [""], "stop", None, len(tokens) + 1

        def _generate(self, body: dict, prompt_tokens: int, max_tokens: int) -> None:
            tokens, finish, stop_reason, n_completion = self._plan(body, max_tokens)
            usage = {"prompt_tokens": prompt_tokens,
                     "total_tokens": prompt_tokens + n_completion,
                     "completion_tokens": n_completion}
            fake.last_usage = usage
            request_id = f"chatcmpl-{uuid.uuid4().hex}"
            created = int(time.time())
            model = body["model"]
            if fake.ignore_stream or not body.get("stream"):
                self._json(200, {"id": request_id, "object": "chat.completion",
                                 "created": created, "model": model, "choices": [{
                                     "index": 0, "message": {"role": "assistant",
                                                             "content": "".join(tokens)},
                                     "logprobs": None, "finish_reason": finish,
                                     "stop_reason": stop_reason}], "usage": usage})
                return

            def chunk(choices: list, **extra) -> dict:
                return {"id": request_id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "choices": choices, **extra}

            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                self._event(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]))
                for i, token in enumerate(tokens):
                    if fake.fault and i == fake.fault_after and self._fault():
                        return
                    if fake.chunk_delay_s:
                        time.sleep(fake.chunk_delay_s)
                    last = i == len(tokens) - 1
                    choice = {"index": 0, "delta": {"content": token}, "logprobs": None,
                              "finish_reason": finish if last else None}
                    if last:
                        choice["stop_reason"] = stop_reason
                    self._event(chunk([choice]))
                options = body.get("stream_options") or {}
                if options.get("include_usage"):
                    self._event(chunk([], usage=usage))
                self._send_chunk(b"data: [DONE]\n\n")
                self._send_chunk(b"")
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                fake.client_gone.set()
                self.close_connection = True

        def _fault(self) -> bool:
            """Does the fault; True when the stream must end here."""
            if fake.fault == "cut":
                # half an event, then the connection drops without the closing chunk
                self._send_chunk(b'data: {"id": "chatcmpl-x", "obj')
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return True
            if fake.fault == "stall":
                if fake._release.wait(fake.stall_s):
                    self.close_connection = True
                    return True
                return False
            if fake.fault == "malformed":
                self._send_chunk(b"data: {\"id\": \"chatcmpl-x\", \"choices\": [\n\n")
                return False
            if fake.fault == "deep":  # valid JSON nested past Python's recursion limit
                self._send_chunk(b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n")
                return False
            if fake.fault == "error_event":
                err = {"error": {"message": "CUDA out of memory while decoding",
                                 "type": "InternalServerError", "param": None, "code": 500}}
                self._event(err)
                self._send_chunk(b"data: [DONE]\n\n")
                self._send_chunk(b"")
                return True
            return False

        def _event(self, obj: dict) -> None:
            # pydantic's model_dump_json writes UTF-8 as is (no \\u escapes), like this
            self._send_chunk(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")

        def _send_chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler
