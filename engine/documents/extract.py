"""Text out of an attached document, bounded: PDF pages (PDFium) and plain-text files.

Every extraction is capped in bytes read, pages and time (the budget is checked between pages),
and can be cancelled by the caller through a `threading.Event`; bad input ends as one
`DocumentError` sentence naming the file. Running it off the UI thread is the caller's business.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from .document import Document, DocumentError, Limits, Page, check_running

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".log"}


def extract_pdf(data: bytes, name: str, limits: Limits = Limits(), cancel: threading.Event | None = None) -> Document:
    """Each page's text with its number; a page with no text but images is marked as a scan."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    if len(data) > limits.max_bytes:
        raise DocumentError(f"{name}: the file is {len(data) / 2**20:.1f} MiB, more than the {limits.max_bytes / 2**20:.0f} MiB a document may be.")
    started = time.monotonic()
    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        if pdfium_c.FPDF_GetLastError() == pdfium_c.FPDF_ERR_PASSWORD or "password" in str(exc).lower():
            raise DocumentError(f"{name}: the PDF is encrypted with a password, so its text cannot be read.") from exc
        raise DocumentError(f"{name}: the file is not a readable PDF ({exc}).") from exc
    try:
        count = len(pdf)
        if count > limits.max_pages:
            raise DocumentError(f"{name}: the PDF has {count} pages, more than the {limits.max_pages} a document may have.")
        pages = []
        for index in range(count):
            check_running(name, started, limits, cancel)
            page = pdf[index]
            try:
                textpage = page.get_textpage()
                try:
                    text = textpage.get_text_range().replace("\r\n", "\n").replace("\r", "\n")
                finally:
                    textpage.close()
                has_images = any(True for _ in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE], max_depth=2))
            finally:
                page.close()
            pages.append(Page(index + 1, text, has_text_layer=bool(text.strip()) or not has_images))
        return Document(name, "pdf", pages)
    finally:
        pdf.close()


def extract_text(data: bytes, name: str, limits: Limits = Limits()) -> Document:
    """A plain-text file: UTF-8 (BOM allowed), else refused as binary."""
    if len(data) > limits.max_bytes:
        raise DocumentError(f"{name}: the file is {len(data) / 2**20:.1f} MiB, more than the {limits.max_bytes / 2**20:.0f} MiB a document may be.")
    sample = data[:8192]
    if b"\x00" in sample:
        raise DocumentError(f"{name}: the file holds binary data, not text, whatever its name says.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{name}: the file is not UTF-8 text (byte {exc.start} cannot be read).") from exc
    return Document(name, "text", [Page(1, text.replace("\r\n", "\n"))])


def extract(data: bytes, name: str, limits: Limits = Limits(), cancel: threading.Event | None = None) -> Document:
    """A document by its content (PDF magic) or its name's suffix."""
    suffix = Path(name).suffix.lower()
    if data.startswith(b"%PDF-") or suffix == ".pdf":
        return extract_pdf(data, name, limits, cancel)
    if suffix in TEXT_SUFFIXES or not suffix:
        return extract_text(data, name, limits)
    raise DocumentError(f"{name}: files of type {suffix} cannot be read as documents yet.")
