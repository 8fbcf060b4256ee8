"""The two streamed body formats the APIs use: server-sent events (OpenAI, Anthropic, the
Responses API) and newline-delimited JSON (Ollama)."""
from __future__ import annotations

import json

from aiohttp import web

SSE_TYPE = "text/event-stream; charset=utf-8"
NDJSON_TYPE = "application/x-ndjson"


def compact(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def sse(obj, event: str | None = None) -> bytes:
    """One event: `data:` and the JSON (or the text, e.g. OpenAI's [DONE]), named when
    `event` is given (Anthropic's and the Responses API's events carry their type)."""
    data = obj.encode("utf-8") if isinstance(obj, str) else compact(obj)
    head = b"event: " + event.encode("ascii") + b"\n" if event else b""
    return head + b"data: " + data + b"\n\n"


def ndjson(obj) -> bytes:
    return compact(obj) + b"\n"


async def open_stream(request: web.Request, content_type: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response
