"""Export a saved chat to Markdown or JSON, and import the JSON back.

JSON (`"format": "tramontane-chat"`, version 1) carries everything the store keeps about a
chat, images and attached documents included as base64, so export -> import -> export gives the
same document. Each image's and document's `position` is its place among the message's
attachments (images and documents apart in two lists, which older readers of version 1 read
as before; an export without positions is read by offset, images first). Markdown is for reading: the images and documents are written as files in
folders beside the .md.

A document's entry also says how the chat's replies read it (issue 37), for a reader of the
export: its kind, and either the text a whole document put into the prompt (engine/documents'
`document_block`) or, for one too long to read whole, the excerpts' sources its replies were
given. The store keeps no mode of its own: a document is "retrieved" when a later reply's
sources cite it, else "whole". Import restores the file; the rest is derived again from it.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

from ...engine.api import DocumentPart, GenerationStats, ImagePart
from ..reasoning import thought_title
from .errors import StoreError
from .rows import DOCUMENT_EXT_PREFIX, ROLES, STATES, Chat, Message, StoredImage
from .store import Store

FORMAT = "tramontane-chat"
FORMAT_VERSION = 1

_CHAT_KEYS = (
    "title", "created_at", "updated_at", "model_path", "projector_path", "remote_url",
    "remote_model", "system_prompt", "settings", "pinned",
)
_STAT_KEYS = ("prompt_tokens", "generated_tokens", "reused_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s")
DOCUMENT_MODES = ("whole", "retrieved")  # engine/documents' Placement.mode
KIND_WORDS = {"pdf": "PDF", "docx": "Word", "html": "HTML", "csv": "CSV", "markdown": "Markdown",
              "text": "text", "source": "source code"}  # engine/documents' Document.kind


class ChatFileError(StoreError):
    """An import file that is not a valid Tramontane chat export; says which field."""


# --------------------------------------------------------------------------- JSON


def chat_to_json(store: Store, chat_id: int) -> dict[str, Any]:
    chat = store.get_chat(chat_id)
    readings = _DocumentReadings(store, chat)
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "chat": {key: getattr(chat, key) for key in _CHAT_KEYS},
        "messages": [
            {
                "role": m.role,
                "text": m.text,
                "state": m.state,
                "finish_reason": m.finish_reason,
                "created_at": m.created_at,
                "stats": {key: getattr(m, key) for key in _STAT_KEYS},
                "images": [
                    {
                        "name": img.name,
                        "sha256": img.sha256,
                        "ext": img.ext,
                        "text_offset": img.text_offset,
                        "position": position,
                        "data_base64": base64.b64encode(store.image_bytes(img.sha256, img.ext)).decode("ascii"),
                    }
                    for position, img in enumerate(m.attachments) if not img.is_document
                ],
                **({"documents": [{**readings.json(m, d), "position": position}
                                  for position, d in enumerate(m.attachments) if d.is_document]}
                   if m.documents else {}),
                **({"versions": [_version_json(v) for v in store.reply_versions(m.id)]}
                   if m.versions > 1 else {}),
                **({"tool": m.tool} if m.tool else {}),  # tool calls, or a tool call's card
                **_reasoning_json(m.reasoning, m.reasoning_s, m.reasoning_open),
            }
            for m in chat.messages
        ],
    }


class _DocumentReadings:
    """How a chat's replies read each attached document: its kind, and the whole text that went
    into the prompt or the sources of the excerpts its later replies were given."""

    def __init__(self, store: Store, chat: Chat):
        self.store = store
        self.vision = bool(chat.projector_path)  # scanned pages went as images (document_block's flag)
        self.cited: dict[int, list[dict]] = {}  # message id -> sources of later replies naming its documents
        later: list[dict] = []
        for m in reversed(chat.messages):
            if m.role == "assistant":
                later = [s for s in (m.tool or {}).get("sources", ()) if isinstance(s, dict)] + later
            elif m.documents:
                self.cited[m.id] = later
        self._read: dict[str, Any] = {}

    def read(self, attached: StoredImage) -> Any:
        """The document as engine/documents reads it, or the DocumentError sentence."""
        from ...engine.documents.document import DocumentError
        from ...engine.documents.extract import extract

        if attached.sha256 not in self._read:
            try:
                self._read[attached.sha256] = extract(self.store.image_bytes(attached.sha256, attached.ext),
                                                      attached.name)
            except DocumentError as exc:
                self._read[attached.sha256] = str(exc)
        return self._read[attached.sha256]

    def sources(self, message: Message, attached: StoredImage) -> list[dict]:
        found: list[dict] = []
        for source in self.cited.get(message.id, ()):
            if source.get("file") == attached.name and source not in found:
                found.append(source)
        return found

    def mode(self, message: Message, attached: StoredImage) -> str:
        return "retrieved" if self.sources(message, attached) else "whole"

    def words(self, message: Message, attached: StoredImage) -> str:
        """'PDF, 300 pages, searched (too long to read whole): Sources: report.pdf p. 12'."""
        from ...engine.documents.block import Source, sources_line

        document = self.read(attached)
        if isinstance(document, str):
            return document
        what = [KIND_WORDS.get(document.kind, document.kind)]
        if document.paged:
            pages = document.total_pages or len(document.pages)
            what.append(f"{pages} page{'s' * (pages != 1)}")
        if self.mode(message, attached) == "whole":
            return ", ".join(what + ["read whole"])
        found = [s for s in map(Source.from_json, self.sources(message, attached)) if s is not None]
        return ", ".join(what + ["searched (too long to read whole)"]) + f": {sources_line(found)}"

    def json(self, message: Message, attached: StoredImage) -> dict[str, Any]:
        from ...engine.documents.block import document_block

        document = self.read(attached)
        entry = {
            "name": attached.name, "sha256": attached.sha256, "ext": attached.ext,
            "text_offset": attached.text_offset,
            "data_base64": base64.b64encode(self.store.image_bytes(attached.sha256, attached.ext)).decode("ascii"),
        }
        if isinstance(document, str):  # unreadable now (it was read when attached): say why
            return {**entry, "error": document}
        mode = self.mode(message, attached)
        entry.update(kind=document.kind, mode=mode)
        if document.paged:
            entry["pages"] = document.total_pages or len(document.pages)
        if mode == "whole":
            entry["text"] = document_block(document, self.vision)
        else:
            entry["sources"] = self.sources(message, attached)
        return entry


def _version_json(version: dict[str, Any]) -> dict[str, Any]:
    """One version of a regenerated reply (the shown one is also the message itself)."""
    return {"text": version["text"], "finish_reason": version["finish_reason"], "shown": bool(version["shown"]),
            "created_at": version["created_at"], "stats": {key: version[key] for key in _STAT_KEYS},
            **_reasoning_json(version["reasoning"], version["reasoning_s"], bool(version["reasoning_open"]))}


def _reasoning_json(text: str, seconds: float | None, cut: bool) -> dict[str, Any]:
    """A reply's thought (schema v6), only where it has one: older exports read the same."""
    return {"reasoning": {"text": text, "seconds": seconds, "cut": cut}} if text else {}


def _reasoning_fields(doc: "_Reader", raw: dict, at: str) -> dict[str, Any]:
    """The `reasoning` object of a message or version -> restore_chat's reasoning fields."""
    if raw.get("reasoning") is None:
        return {}
    thought = doc.object(raw, f"{at}.reasoning")
    seconds = thought.get("seconds")
    doc.require(seconds is None or _is_number(seconds) and seconds >= 0, f"{at}.reasoning.seconds",
                f"expected a number of seconds, got {seconds!r}")
    return {"reasoning": doc.string(thought, f"{at}.reasoning.text"), "reasoning_s": seconds,
            "reasoning_open": doc.boolean(thought, f"{at}.reasoning.cut", default=False)}


def export_json(store: Store, chat_id: int, path: str | Path) -> Path:
    path = Path(path)
    text = json.dumps(chat_to_json(store, chat_id), ensure_ascii=False, indent=1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StoreError(f"{path}: cannot write export: {exc.strerror or exc}") from exc
    return path


def import_json(store: Store, path: str | Path) -> int:
    """Read a chat exported by export_json into a new chat; returns its id."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ChatFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChatFileError(f"{path}: not JSON: {exc}") from exc
    except RecursionError:
        raise ChatFileError(f"{path}: not a chat export: JSON nested too deeply") from None
    return chat_from_json(store, data, source=str(path))


def _stats(doc: "_Reader", raw: dict, at: str) -> GenerationStats:
    """The `stats` object of a message (or of a version of a reply), checked field by field."""
    raw_stats = doc.object(raw, f"{at}.stats", default={})
    stats = GenerationStats()
    for key in _STAT_KEYS:
        value = raw_stats.get(key)
        if key.endswith("_tokens"):
            doc.require(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0 or value is None,
                f"{at}.stats.{key}", f"expected a count, got {value!r}",
            )
            setattr(stats, key, value or 0)
        else:
            doc.require(
                value is None or _is_number(value), f"{at}.stats.{key}", f"expected a number, got {value!r}"
            )
            setattr(stats, key, value)
    return stats


def chat_from_json(store: Store, data: Any, source: str = "chat JSON") -> int:
    """Validate a chat_to_json document and store it as a new chat (one transaction)."""
    doc = _Reader(source)
    doc.require(isinstance(data, dict), "", "expected a JSON object")
    doc.require(data.get("format") == FORMAT, "format", f"expected {FORMAT!r}, got {data.get('format')!r}")
    doc.require(
        data.get("version") == FORMAT_VERSION, "version",
        f"version {data.get('version')!r} is not supported (this Tramontane reads {FORMAT_VERSION})",
    )
    chat = doc.object(data, "chat")
    fields: dict[str, Any] = {
        "title": doc.string(chat, "chat.title"),
        "created_at": doc.number(chat, "chat.created_at"),
        "updated_at": doc.number(chat, "chat.updated_at"),
        "system_prompt": doc.string(chat, "chat.system_prompt", default=""),
        "settings": doc.object(chat, "chat.settings", default={}),
        "pinned": doc.boolean(chat, "chat.pinned", default=False),
    }
    for key in ("model_path", "projector_path", "remote_url", "remote_model"):
        fields[key] = doc.string(chat, f"chat.{key}", default=None, nullable=True)

    messages = []
    for at, raw in doc.objects(data, "messages"):
        role = doc.string(raw, f"{at}.role")
        doc.require(role in ROLES, f"{at}.role", f"{role!r} is not one of {', '.join(ROLES)}")
        state = doc.string(raw, f"{at}.state", default="complete")
        doc.require(state in STATES, f"{at}.state", f"{state!r} is not one of {', '.join(STATES)}")
        text = doc.string(raw, f"{at}.text", default="")
        stats = _stats(doc, raw, at)
        attached = []  # (where, its entry, the part, its text offset)
        for where, raw_image in doc.objects(raw, f"{at}.images"):
            blob, offset = _attached_file(doc, raw_image, where, text, "image")
            name = doc.string(raw_image, f"{where}.name", default="image")
            attached.append((where, raw_image, ImagePart(blob, name), offset))
        for where, raw_document in doc.objects(raw, f"{at}.documents"):
            blob, offset = _attached_file(doc, raw_document, where, text, "document")
            name = doc.string(raw_document, f"{where}.name")
            doc.require(bool(name.strip()), f"{where}.name", "empty name")
            mode = raw_document.get("mode")
            doc.require(mode is None or mode in DOCUMENT_MODES, f"{where}.mode",
                        f"{mode!r} is not one of {', '.join(DOCUMENT_MODES)}")
            attached.append((where, raw_document, DocumentPart(blob, name), offset))
        images = [(part, offset) for _, _, part, offset in _in_message_order(doc, attached)]
        versions = []
        for where, raw_version in doc.objects(raw, f"{at}.versions"):
            version_stats = _stats(doc, raw_version, where)
            versions.append({
                "text": doc.string(raw_version, f"{where}.text"),
                "finish_reason": doc.string(raw_version, f"{where}.finish_reason", default=None, nullable=True),
                "shown": doc.boolean(raw_version, f"{where}.shown", default=False),
                "created_at": doc.number(raw_version, f"{where}.created_at", default=fields["created_at"]),
                **{key: getattr(version_stats, key) for key in _STAT_KEYS},
                **_reasoning_fields(doc, raw_version, where),
            })
        messages.append({
            "role": role,
            "text": text,
            "versions": versions,
            "state": state,
            "finish_reason": doc.string(raw, f"{at}.finish_reason", default=None, nullable=True),
            "created_at": doc.number(raw, f"{at}.created_at", default=fields["created_at"]),
            "stats": stats,
            "images": images,
            "tool": None if raw.get("tool") is None else doc.object(raw, f"{at}.tool"),
            **_reasoning_fields(doc, raw, at),
        })
    return store.restore_chat(fields, messages)


def _attached_file(doc: "_Reader", raw: dict, where: str, text: str, kind: str) -> tuple[bytes, int]:
    """An image's or document's bytes (base64, checked against its sha256) and text offset."""
    encoded = doc.string(raw, f"{where}.data_base64")
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ChatFileError(f"{doc.source}: {where}.data_base64: not base64: {exc}") from exc
    doc.require(len(blob) > 0, f"{where}.data_base64", f"empty {kind}")
    sha = raw.get("sha256")
    doc.require(
        sha is None or sha == hashlib.sha256(blob).hexdigest(), f"{where}.sha256",
        f"does not match the {kind} data (file damaged?)",
    )
    offset = raw.get("text_offset", 0)
    doc.require(
        isinstance(offset, int) and not isinstance(offset, bool) and 0 <= offset <= len(text),
        f"{where}.text_offset", f"expected 0..{len(text)}, got {offset!r}",
    )
    return blob, offset


def _in_message_order(doc: "_Reader", attached: list[tuple[str, dict, Any, int]]) -> list[tuple[str, dict, Any, int]]:
    """A message's images and documents in the order the store kept them (rows.Message.
    attachments): by their `position`, which every entry has, or none (an export written before
    positions: by offset, images before documents at one offset, as those exports were read)."""
    placed = [entry for entry in attached if "position" in entry[1]]
    if not placed:
        return sorted(attached, key=lambda entry: (entry[3], isinstance(entry[2], DocumentPart)))
    positions = []
    for where, raw, _, _ in attached:
        doc.require("position" in raw, f"{where}.position", "missing (the message's other attachments have one)")
        position = raw["position"]
        doc.require(isinstance(position, int) and not isinstance(position, bool)
                    and 0 <= position < len(attached) and position not in positions,
                    f"{where}.position", f"expected one of 0..{len(attached) - 1} not taken by another "
                    f"attachment of the message, got {position!r}")
        positions.append(position)
    return [entry for _, entry in sorted(zip(positions, attached), key=lambda pair: pair[0])]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Reader:
    """Field checks that name the file and the field in their error."""

    _MISSING = object()

    def __init__(self, source: str):
        self.source = source

    def require(self, ok: bool, field: str, problem: str) -> None:
        if not ok:
            where = f"{self.source}: {field}: " if field else f"{self.source}: "
            raise ChatFileError(where + problem)

    def _get(self, obj: dict, path: str, default: Any) -> Any:
        value = obj.get(path.rsplit(".", 1)[-1], self._MISSING)
        if value is self._MISSING:
            self.require(default is not self._MISSING, path, "missing")
            return default
        return value

    def string(self, obj: dict, path: str, default: Any = _MISSING, nullable: bool = False) -> Any:
        value = self._get(obj, path, default)
        if value is None and (nullable or default is None):
            return None
        self.require(isinstance(value, str), path, f"expected text, got {type(value).__name__}")
        return value

    def number(self, obj: dict, path: str, default: Any = _MISSING) -> float:
        value = self._get(obj, path, default)
        self.require(_is_number(value), path, f"expected a number, got {value!r}")
        return float(value)

    def boolean(self, obj: dict, path: str, default: Any = _MISSING) -> bool:
        value = self._get(obj, path, default)
        self.require(isinstance(value, bool), path, f"expected true or false, got {value!r}")
        return value

    def object(self, obj: dict, path: str, default: Any = _MISSING) -> dict:
        value = self._get(obj, path, default)
        self.require(isinstance(value, dict), path, f"expected an object, got {type(value).__name__}")
        return value

    def objects(self, obj: dict, path: str) -> Iterator[tuple[str, dict]]:
        """(field, object) for each element of the list at `path` (none when it is absent)."""
        items = self._get(obj, path, [])
        self.require(isinstance(items, list), path, "expected a list")
        for i, item in enumerate(items):
            where = f"{path}[{i}]"
            self.require(isinstance(item, dict), where, "expected an object")
            yield where, item


# --------------------------------------------------------------------------- Markdown


def export_markdown(store: Store, chat_id: int, path: str | Path) -> Path:
    """Write the chat as Markdown; its images go to `<name>_images/` beside the file, its
    documents to `<name>_documents/`."""
    path = Path(path)
    chat = store.get_chat(chat_id)
    image_dir = path.with_name(f"{path.stem}_images")
    document_dir = path.with_name(f"{path.stem}_documents")
    readings = _DocumentReadings(store, chat)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for m in chat.messages:
            for img, folder in [(i, image_dir) for i in m.images] + [(d, document_dir) for d in m.documents]:
                folder.mkdir(parents=True, exist_ok=True)
                target = folder / _file_name(img)
                if not target.exists():
                    target.write_bytes(store.image_bytes(img.sha256, img.ext))
        text = chat_to_markdown(chat, image_dir.name, document_dir.name,
                                {(m.id, d.sha256): readings.words(m, d) for m in chat.messages for d in m.documents})
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StoreError(f"{exc.filename or path}: cannot write export: {exc.strerror or exc}") from exc
    return path


def _file_name(attached: StoredImage) -> str:
    """An attachment's file in the export's folder: its content's hash, its own suffix."""
    suffix = attached.ext[len(DOCUMENT_EXT_PREFIX):] if attached.is_document else attached.ext
    return f"{attached.sha256}.{suffix}"


def chat_to_markdown(chat: Chat, image_folder: str, document_folder: str = "",
                     document_words: dict[tuple[int, str], str] | None = None) -> str:
    """`document_words`: by (message id, sha256), how the replies read each document
    (_DocumentReadings.words); without it a document is listed by its name alone."""
    lines = [f"# {' '.join(chat.title.split()) or 'Chat'}", ""]
    if chat.remote_url:
        lines.append(f"- Server: {chat.remote_url}" + (f", model `{chat.remote_model}`" if chat.remote_model else ""))
    if chat.model_path:
        lines.append(f"- Model: `{os.path.basename(chat.model_path)}`")
    if chat.projector_path:
        lines.append(f"- Vision projector: `{os.path.basename(chat.projector_path)}`")
    lines.append(f"- Created: {_iso(chat.created_at)}, last change: {_iso(chat.updated_at)}")
    lines.append("")
    if chat.system_prompt:
        lines += ["## System prompt", ""]
        lines += [f"> {line}" if line else ">" for line in chat.system_prompt.splitlines()]
        lines.append("")
    for m in chat.messages:
        if m.role == "tool" and m.tool:
            lines += _tool_card_markdown(m.tool, m.text)
            continue
        lines += [f"## {m.role.capitalize()}", ""]
        if m.role == "assistant" and m.reasoning:
            lines += _thought_markdown(m)
        pos = 0
        for img in m.images:  # images at their place in the text, as the model saw them
            offset = min(max(img.text_offset, pos), len(m.text))
            if m.text[pos:offset].strip():
                lines += [m.text[pos:offset].strip(), ""]
            alt = img.name.replace("[", "(").replace("]", ")")
            lines += [f"![{alt}]({quote(image_folder)}/{img.sha256}.{img.ext})", ""]
            pos = offset
        if m.text[pos:].strip():  # whole texts keep their indentation (code blocks)
            tail = m.text[pos:]
            lines += [tail.strip() if m.images else tail.strip("\n"), ""]
        if m.documents:  # listed after the text: the prompt's form of them is not the message's
            for d in m.documents:
                name = d.name.replace("[", "(").replace("]", ")")
                words = (document_words or {}).get((m.id, d.sha256), "")
                lines.append(f"- Document: [{name}]({quote(document_folder)}/{_file_name(d)})"
                             + (f" — {words}" if words else ""))
            lines.append("")
        for call in (m.tool or {}).get("calls", ()) if m.role == "assistant" else ():
            lines += [f"*Called `{call.get('name', '?')}`*", ""]
        note = _reply_note(m)
        if note:
            lines += [f"*{note}*", ""]
    return "\n".join(lines)


def _thought_markdown(m: Any) -> list[str]:
    """A reply's thought, folded above its answer as the window shows it (HTML <details>, which
    Markdown readers fold; the thought quoted, so it reads apart from the answer)."""
    title = thought_title(m.reasoning_s, m.reasoning_open)
    quoted = [f"> {line}" if line else ">" for line in m.reasoning.strip("\n").splitlines()]
    return [f"<details><summary>{title}</summary>", "", *quoted, "", "</details>", ""]


def _tool_card_markdown(card: dict, result: str) -> list[str]:
    """A tool call's card: the tool, its arguments, the user's answer, the result and time."""
    fence = "````"
    lines = [f"## Tool: {card.get('name', '?')}", "", "Arguments:", "", fence + "json",
             str(card.get("arguments", "{}")), fence, ""]
    status = str(card.get("status", ""))
    elapsed = card.get("elapsed_s")
    lines += [f"*{status}" + (f" · {elapsed:.2f} s" if isinstance(elapsed, (int, float)) else "") + "*", ""]
    if card.get("error"):
        lines += [f"Error: {card['error']}", ""]
    lines += ["Result:", "", fence, result, fence, ""]
    if card.get("note"):
        lines += [f"*{card['note']}*", ""]
    return lines


def _reply_note(m: Any) -> str:
    notes = []
    if m.state == "interrupted":
        notes.append("reply interrupted")
    elif m.finish_reason and m.finish_reason not in ("stop", "stop_string"):
        notes.append(f"finished: {m.finish_reason}")
    if getattr(m, "versions", 1) > 1:
        notes.append(f"version {m.version + 1} of {m.versions} (all are in the JSON export)")
    if m.generated_tokens:
        notes.append(f"{m.generated_tokens} tokens")
    if m.decode_tok_s:
        notes.append(f"{m.decode_tok_s:.1f} tok/s")
    return " · ".join(notes)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
