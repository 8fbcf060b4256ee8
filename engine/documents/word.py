"""A Word file's text (python-docx): paragraphs in order, headings as Markdown headings, list
items as `- `, tables as `| a | b |` rows; the zip checked before python-docx opens it.

The check reads the zip's directory first: too many parts, more unpacked bytes than
`Limits.max_unpacked_bytes` in all, or a part packed more than `Limits.max_ratio` times (a zip
bomb) is refused before anything is inflated. python-docx then reads a copy we make: the XML
parts inflated in slices up to the size the directory declares (zipfile would inflate a whole
part at once, so a directory that lies would not bound it), the media parts left empty (text
needs none of them), all stored uncompressed.
"""
from __future__ import annotations

import io
import re
import threading
import time
import zipfile

from .document import RATIO_FLOOR, Document, DocumentError, Limits, Page, check_running, check_size

MAX_PARTS = 10_000
SLICE = 1 << 20
XML_PARTS = (".xml", ".rels")
HEADING_STYLE = re.compile(r"heading (\d)$")
# Other Office Open XML and OpenDocument zips, by a part only they have.
OTHER_ZIPS = (("xl/workbook.xml", "an Excel workbook"), ("ppt/presentation.xml", "a PowerPoint presentation"),
              ("mimetype", "an OpenDocument file"))


def check_word_zip(parts: list[zipfile.ZipInfo], name: str, limits: Limits) -> None:
    """Refuse a zip that is not a Word document, or would unpack too far, from its directory."""
    if len(parts) > MAX_PARTS:
        raise DocumentError(f"{name}: the file's zip archive has {len(parts)} parts, more than the {MAX_PARTS} a Word document may have.")
    names = {part.filename for part in parts}
    if "word/document.xml" not in names:
        what = next((what for marker, what in OTHER_ZIPS if marker in names), "a zip archive")
        raise DocumentError(f"{name}: the file is {what}, not a Word document.")
    unpacked = sum(part.file_size for part in parts)
    if unpacked > limits.max_unpacked_bytes:
        raise DocumentError(
            f"{name}: the Word document would unpack to {unpacked / 2**20:.0f} MiB, more than the "
            f"{limits.max_unpacked_bytes / 2**20:.0f} MiB a document may, so it was not opened.")
    for part in parts:
        if part.file_size > RATIO_FLOOR and part.file_size > limits.max_ratio * max(part.compress_size, 1):
            raise DocumentError(
                f"{name}: its part {part.filename} unpacks to {part.file_size / max(part.compress_size, 1):.0f} times "
                f"its packed size, as a zip bomb does, so the document was not opened.")


def bounded_copy(data: bytes, name: str, limits: Limits) -> bytes:
    """The Word zip again, stored: XML parts read in slices up to their declared size (a CRC
    that fails is a damaged file), every other part empty."""
    out = io.BytesIO()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as copy:
            parts = archive.infolist()
            check_word_zip(parts, name, limits)
            for part in parts:
                if part.is_dir():
                    continue
                body = b""
                if part.filename.lower().endswith(XML_PARTS):
                    with archive.open(part) as stream:
                        body = b"".join(iter(lambda: stream.read(SLICE), b""))
                copy.writestr(part.filename, body)
    except DocumentError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, RuntimeError, NotImplementedError) as exc:
        raise DocumentError(f"{name}: the file is not a readable Word document (its zip archive is damaged: {exc}).") from exc
    return out.getvalue()


def extract_docx(data: bytes, name: str, limits: Limits = Limits(), cancel: threading.Event | None = None) -> Document:
    import docx
    from docx.table import Table

    check_size(data, name, limits)
    started = time.monotonic()
    copy = bounded_copy(data, name, limits)
    try:
        document = docx.Document(io.BytesIO(copy))
        blocks = []
        for block in document.iter_inner_content():
            check_running(name, started, limits, cancel)
            text = _table_text(block) if isinstance(block, Table) else _paragraph_text(block)
            if text:
                blocks.append(text)
    except DocumentError:
        raise
    except Exception as exc:  # python-docx and lxml raise many kinds on a damaged part
        raise DocumentError(f"{name}: the file is not a readable Word document ({type(exc).__name__}: {exc}).") from exc
    return Document(name, "docx", [Page(1, "\n\n".join(blocks))])


def _paragraph_text(paragraph) -> str:
    text = paragraph.text.strip()
    if not text:
        return ""
    style = (paragraph.style.name if paragraph.style is not None else "").strip().lower()
    heading = HEADING_STYLE.match(style)
    if heading:
        return "#" * max(1, min(int(heading.group(1)), 6)) + " " + text
    if style == "title":
        return "# " + text
    if style.startswith("list"):
        return "- " + text
    return text


def _table_text(table) -> str:
    """One `| a | b |` line a row; a merged cell once (python-docx repeats it per grid column)."""
    lines = []
    for row in table.rows:
        cells, previous = [], None
        for cell in row.cells:
            if cell._tc is previous:
                continue
            previous = cell._tc
            cells.append(" ".join(cell.text.split()).replace("|", "\\|"))
        if any(cells):
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
