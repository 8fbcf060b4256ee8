"""Scanned PDF pages as images for the vision tower: rendered by PDFium to RGB at the size the
tower reads without resizing (sides a multiple of patch x merge, the longest within its
image_size), at most MAX_SCANS a document; without a vision tower, one sentence instead. Any
page, at a size asked, for the window (`render_page`: the page a reply's source names)."""
from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass

from PIL import Image

from ..api import ImagePart
from ..mistral3.config import VisionConfig
from .document import Document, DocumentError, Limits, check_running, page_list
from .extract import open_pdf

MAX_SCANS = 16  # page images one document brings into a message


@dataclass(frozen=True)
class PageImage:
    number: int
    image: Image.Image  # RGB

    def image_part(self, document_name: str) -> ImagePart:
        out = io.BytesIO()
        self.image.save(out, format="PNG")
        return ImagePart(out.getvalue(), f"{document_name}, page {self.number}")


def scan_size(width: float, height: float, vision: VisionConfig) -> tuple[int, int]:
    """(width, height) in pixels for a page of `width` x `height` points: the page's shape, the
    longest side at most image_size, both sides whole tiles (so the tower's resize is none)."""
    tile = vision.patch_size * vision.merge
    side = vision.image_size // tile * tile
    scale = side / max(width, height)
    return max(tile, int(width * scale) // tile * tile), max(tile, int(height * scale) // tile * tile)


def scan_note(document: Document, vision: VisionConfig | None) -> str | None:
    """What the window says about a document's scanned pages, or None when it has none or all
    of them are read as images."""
    scans = document.scanned_pages
    if not scans:
        return None
    pages = f"page {scans[0]} is a scan" if len(scans) == 1 else f"pages {page_list(scans)} are scans"
    if vision is None:
        return f"{document.name}: {pages} without a text layer, and this model has no vision tower to read them."
    if len(scans) > MAX_SCANS:
        return f"{document.name}: {pages} without a text layer; only the first {MAX_SCANS} are read as images."
    return None


def render_scans(data: bytes, document: Document, vision: VisionConfig | None, limits: Limits = Limits(),
                 cancel: threading.Event | None = None) -> list[PageImage]:
    """The first MAX_SCANS scanned pages of a PDF's `document` as images the tower reads."""
    if vision is None:
        raise DocumentError(scan_note(document, None) or f"{document.name}: this model has no vision tower to read pages.")
    numbers = document.scanned_pages[:MAX_SCANS]
    if not numbers:
        return []
    started = time.monotonic()
    pdf = open_pdf(data, document.name)
    try:
        images = []
        for number in numbers:
            check_running(document.name, started, limits, cancel)
            images.append(PageImage(number, _rendered(pdf, number, lambda w, h: scan_size(w, h, vision))))
        return images
    finally:
        pdf.close()


def render_page(data: bytes, name: str, number: int, longest: int) -> tuple[PageImage, int]:
    """Page `number` of a PDF as RGB, its longest side `longest` pixels (a page the window
    shows: one a reply's source names), and how many pages the PDF has."""
    pdf = open_pdf(data, name)
    try:
        count = len(pdf)
        if not 1 <= number <= count:
            raise DocumentError(f"{name}: the PDF has no page {number} (it has {count}).")

        def size(width: float, height: float) -> tuple[int, int]:
            scale = longest / max(width, height)
            return max(1, round(width * scale)), max(1, round(height * scale))
        return PageImage(number, _rendered(pdf, number, size)), count
    finally:
        pdf.close()


def _rendered(pdf, number: int, size) -> Image.Image:
    """Page `number` of an open PdfDocument rendered by PDFium to RGB at `size(width, height)`
    pixels for its size in points."""
    page = pdf[number - 1]
    try:
        width, height = page.get_size()
        target = size(width, height)
        bitmap = page.render(scale=min(target[0] / width, target[1] / height))
        image = bitmap.to_pil().convert("RGB")
        bitmap.close()
    finally:
        page.close()
    if image.size != target:  # PDFium rounds the scaled size; a pixel or two of stretch
        image = image.resize(target, Image.Resampling.LANCZOS)
    return image
