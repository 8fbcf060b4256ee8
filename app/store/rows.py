"""The store's row types (chats, messages, images) and every conversion between database
rows and engine types (ChatMessage, ImagePart, GenerationStats), in one place."""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ...engine.api import ChatMessage, DocumentPart, GenerationStats, ImagePart, ThinkPart, ToolCall
from .errors import StoreError

ROLES = ("system", "user", "assistant", "tool")
STATES = ("complete", "streaming", "interrupted")
# A stored document's ext starts with this ("doc.pdf"): it shares the images' content-addressed
# files and rows (issue 37), and an image's ext never holds a dot.
DOCUMENT_EXT_PREFIX = "doc."

# Columns a caller may set through create_chat / update_chat.
CHAT_FIELDS = (
    "title", "model_path", "projector_path", "remote_url", "remote_model",
    "system_prompt", "settings", "pinned",
)


@dataclass
class StoredImage:
    sha256: str
    ext: str
    name: str  # the file name the user attached
    text_offset: int  # where in the message text the image sits (0: before the text)
    path: Path

    @property
    def is_document(self) -> bool:
        return self.ext.startswith(DOCUMENT_EXT_PREFIX)


@dataclass
class Message:
    id: int
    chat_id: int
    position: int
    role: str
    text: str
    state: str  # complete | streaming | interrupted
    finish_reason: str | None
    prompt_tokens: int
    generated_tokens: int
    reused_tokens: int
    ttft_s: float | None
    prefill_tok_s: float | None
    decode_tok_s: float | None
    created_at: float
    # The attached images and documents in one list, in the message's order (message_images.idx):
    # two at one text offset keep the order they were sent in.
    attachments: list[StoredImage] = field(default_factory=list)
    versions: int = 1  # how many versions the reply has (regenerate keeps the older ones)
    version: int = 0  # which of them is shown (0-based)
    # Tool use (schema v5): an assistant message's {"calls": [{id, name, arguments}]}, or a tool
    # message's card {call_id, name, arguments, status, error, elapsed_s, note}; None otherwise.
    tool: dict | None = None
    # A reasoning model's thought (schema v6), apart from the answer in `text`: how long it
    # thought (seconds, None: not measured) and whether it was cut off before [/THINK].
    reasoning: str = ""
    reasoning_s: float | None = None
    reasoning_open: bool = False

    @property
    def images(self) -> list[StoredImage]:
        return [a for a in self.attachments if not a.is_document]

    @property
    def documents(self) -> list[StoredImage]:
        """Attached documents (a user message's)."""
        return [a for a in self.attachments if a.is_document]


@dataclass
class ChatInfo:
    """A chat without its messages, as listed in the sidebar."""

    id: int
    title: str
    created_at: float
    updated_at: float
    model_path: str | None
    projector_path: str | None
    remote_url: str | None  # set when the chat is bound to a server instead of a file
    remote_model: str | None
    system_prompt: str
    settings: dict[str, Any]
    pinned: bool
    message_count: int


@dataclass
class Chat(ChatInfo):
    messages: list[Message] = field(default_factory=list)


# --------------------------------------------------------------------------- rows -> objects


def chat_info(row: sqlite3.Row) -> ChatInfo:
    return ChatInfo(
        id=row["id"],
        title=row["title"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        model_path=row["model_path"],
        projector_path=row["projector_path"],
        remote_url=row["remote_url"],
        remote_model=row["remote_model"],
        system_prompt=row["system_prompt"],
        settings=json.loads(row["settings_json"]),
        pinned=bool(row["pinned"]),
        message_count=row["message_count"],
    )


def message(row: sqlite3.Row, attached: list[StoredImage]) -> Message:
    """`attached`: the message's images and documents, in their order."""
    return Message(
        id=row["id"], chat_id=row["chat_id"], position=row["position"], role=row["role"],
        text=row["text"], state=row["state"], finish_reason=row["finish_reason"],
        prompt_tokens=row["prompt_tokens"], generated_tokens=row["generated_tokens"],
        reused_tokens=row["reused_tokens"], ttft_s=row["ttft_s"], prefill_tok_s=row["prefill_tok_s"],
        decode_tok_s=row["decode_tok_s"], created_at=row["created_at"], attachments=list(attached),
        tool=tool_data(row["tool_json"]),
        reasoning=row["reasoning"], reasoning_s=row["reasoning_s"], reasoning_open=bool(row["reasoning_open"]),
    )


def tool_data(raw: str | None) -> dict | None:
    """A message's tool JSON; None when absent or unreadable (the message still shows)."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def thought_parts(message: Message) -> list[Any]:
    """A reply's thought as the first of its parts (the chat format encodes it as the model's
    format requires: a [THINK] chunk for a model that thinks, left out for one that cannot);
    [] for a message without one."""
    if message.role != "assistant" or not message.reasoning:
        return []
    return [ThinkPart(message.reasoning, closed=not message.reasoning_open)]


def to_chat_message(message: Message, read_image: Callable[[str, str], bytes]) -> ChatMessage:
    """A stored message as engine input; `read_image(sha256, ext)` gives an image's bytes."""
    tool = message.tool or {}
    thought = thought_parts(message)
    if message.role == "assistant" and tool.get("calls"):
        calls = [ToolCall(str(c.get("id", "")), str(c.get("name", "")), str(c.get("arguments", "{}")))
                 for c in tool["calls"] if isinstance(c, dict)]
        return ChatMessage("assistant", thought + ([message.text] if message.text else []), tool_calls=calls)
    if thought:
        return ChatMessage("assistant", thought + ([message.text] if message.text else []))
    if message.role == "tool":
        return ChatMessage("tool", [message.text], tool_call_id=tool.get("call_id") or None)
    if not message.attachments:
        return ChatMessage(message.role, [message.text])  # type: ignore[arg-type]
    parts: list[Any] = []
    pos = 0
    # a stable sort: those at one offset stay in the message's order
    for attached in sorted(message.attachments, key=lambda a: a.text_offset):
        offset = min(max(attached.text_offset, pos), len(message.text))
        if offset > pos:
            parts.append(message.text[pos:offset])
        kind = DocumentPart if attached.is_document else ImagePart
        parts.append(kind(read_image(attached.sha256, attached.ext), attached.name))
        pos = offset
    if pos < len(message.text):
        parts.append(message.text[pos:])
    return ChatMessage(message.role, parts)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- objects -> rows


def split_parts(parts: Sequence[Any]) -> tuple[str, list[tuple[ImagePart | DocumentPart, int]]]:
    """ChatMessage parts -> (text, [(image or document, offset in text)])."""
    text = ""
    images = []
    for part in parts:
        if isinstance(part, (ImagePart, DocumentPart)):
            images.append((part, len(text)))
        elif isinstance(part, str):
            text += part
        else:
            raise StoreError(f"message part of type {type(part).__name__}: expected str or ImagePart")
    return text, images


def stat_values(stats: GenerationStats) -> tuple:
    """The message columns filled from GenerationStats, in the INSERT's order (prompt_tokens,
    generated_tokens, reused_tokens, ttft_s, prefill_tok_s, decode_tok_s)."""
    return (
        stats.prompt_tokens,
        stats.generated_tokens,
        stats.reused_tokens,
        stats.ttft_s or None,
        stats.prefill_tok_s or None,
        stats.decode_tok_s or None,
    )


def chat_columns(fields: dict[str, Any]) -> dict[str, Any]:
    """create_chat / update_chat keyword fields -> checked column values."""
    values: dict[str, Any] = {}
    for key, value in fields.items():
        if key not in CHAT_FIELDS and key not in ("created_at", "updated_at"):
            raise StoreError(f"chat field {key!r}: unknown (known: {', '.join(CHAT_FIELDS)})")
        if key == "settings":
            if not isinstance(value, dict):
                raise StoreError(f"chat field 'settings': expected a dict, got {type(value).__name__}")
            try:
                values["settings_json"] = json.dumps(value, sort_keys=True)
            except (TypeError, ValueError) as exc:
                raise StoreError(f"chat field 'settings': not JSON-serialisable: {exc}") from exc
        elif key == "pinned":
            values["pinned"] = int(bool(value))
        elif key in ("title", "system_prompt"):
            if not isinstance(value, str):
                raise StoreError(f"chat field {key!r}: expected text, got {type(value).__name__}")
            values[key] = value
        elif key in ("created_at", "updated_at"):
            values[key] = float(value)
        else:
            values[key] = None if value is None else str(value)
    return values


def check_role_and_state(role: str, state: str, where: str = "message ") -> None:
    """`where` names the field in the error: 'message ' or 'messages[3].'."""
    if role not in ROLES:
        raise StoreError(f"{where}role {role!r}: expected one of {', '.join(ROLES)}")
    if state not in STATES:
        raise StoreError(f"{where}state {state!r}: expected one of {', '.join(STATES)}")
