"""OpenAI's `file` content part (`{"type": "file", "file": {"file_data": "data:application/pdf;
base64,...", "filename": "..."}}`) read into a `Document` through the same extraction as an
attachment in the window; a part that is malformed is one `DocumentError` sentence."""
from __future__ import annotations

import base64
import binascii
import re
import threading
from collections.abc import Mapping
from pathlib import Path

from .document import Document, DocumentError, Limits
from .extract import extract

DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+=[^;,]*)*;base64,", re.IGNORECASE)
SUFFIX_OF_MIME = {
    "application/pdf": ".pdf", "text/plain": ".txt", "text/markdown": ".md", "text/html": ".html",
    "text/csv": ".csv", "text/tab-separated-values": ".tsv",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
}


def document_from_file_part(part: Mapping, limits: Limits = Limits(), cancel: threading.Event | None = None) -> Document:
    """The document a `file` content part carries, read by `extract`."""
    name, data = file_part_bytes(part, limits)
    return extract(data, name, limits, cancel)


def file_part_bytes(part: Mapping, limits: Limits = Limits()) -> tuple[str, bytes]:
    """The (name, bytes) of a `file` content part, not yet read. The name is `filename` (default
    "document"), given the data URL's type as a suffix when it has none; the bytes are capped
    before they are decoded. `file_id` (files uploaded beforehand) is refused: nothing here
    stores uploads."""
    file = part.get("file") if isinstance(part, Mapping) else None
    if not isinstance(file, Mapping):
        raise DocumentError('a "file" content part needs a "file" object with "file_data".')
    name = file.get("filename") or "document"
    if not isinstance(name, str):
        raise DocumentError('a "file" content part\'s "filename" must be a string.')
    name = Path(name.replace("\\", "/")).name or "document"  # a name, never a path
    data = file.get("file_data")
    if data is None:
        if file.get("file_id") is not None:
            raise DocumentError(f"{name}: files uploaded by id (file_id) are not kept by this server; send the file's bytes as file_data.")
        raise DocumentError(f'{name}: the "file" content part has no "file_data".')
    if not isinstance(data, str):
        raise DocumentError(f'{name}: "file_data" must be a string (a base64 data URL).')
    match = DATA_URL.match(data)
    payload = data[match.end():] if match else data  # bare base64 too, as some clients send
    mime = (match.group("mime") or "").lower() if match else ""
    if not Path(name).suffix and mime in SUFFIX_OF_MIME:
        name += SUFFIX_OF_MIME[mime]
    if len(payload) // 4 * 3 > limits.max_bytes + 2:
        raise DocumentError(f"{name}: the file is about {len(payload) * 3 / 4 / 2**20:.1f} MiB, more than the {limits.max_bytes / 2**20:.0f} MiB a document may be.")
    try:
        raw = base64.b64decode(re.sub(r"\s+", "", payload), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DocumentError(f'{name}: "file_data" is not valid base64 ({exc}).') from exc
    return name, raw
