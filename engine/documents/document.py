"""What every document kind shares: `Document` and its `Page`s, the `Limits` of a read, and
`DocumentError`, the one sentence naming the file and what is wrong."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..api import EngineError

MAX_BYTES = 64 * 1024 * 1024
MAX_PAGES = 1000
TIME_BUDGET_S = 60.0
# What a Word file may unpack to (all its parts: python-docx holds every part in memory), and
# the largest compression ratio a part over RATIO_FLOOR bytes may have: Word's XML packs about
# 5-20x, a zip bomb 1000x.
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
MAX_RATIO = 100
RATIO_FLOOR = 1024 * 1024
MAX_ROWS = 20_000  # CSV rows read; the rest is cut and said so


class DocumentError(EngineError):
    """A document that cannot be read: one sentence naming the file and what is wrong."""


@dataclass(frozen=True)
class Page:
    number: int  # 1-based, as a reader names it
    text: str
    has_text_layer: bool = True  # False: a scan, only an image of the page (render it for vision)


@dataclass(frozen=True)
class Limits:
    max_bytes: int = MAX_BYTES
    max_pages: int = MAX_PAGES
    time_budget_s: float = TIME_BUDGET_S
    max_unpacked_bytes: int = MAX_UNPACKED_BYTES
    max_ratio: float = MAX_RATIO
    max_rows: int = MAX_ROWS


@dataclass(frozen=True)
class Document:
    """A document's text. Headings are Markdown lines (`# `, `## `...) in every kind, so the
    chunker and the model see one form. Only a PDF has real pages; the other kinds are page 1."""

    name: str
    kind: str  # "pdf", "docx", "html", "csv", "markdown", "text", "source"
    pages: list[Page] = field(default_factory=list)
    language: str | None = None  # a source file: the language its name says
    total_pages: int | None = None  # a PDF cut at Limits.max_pages: the pages the file has
    notes: tuple[str, ...] = ()  # what was cut or left out, one sentence each, for the window

    @property
    def paged(self) -> bool:
        return self.kind == "pdf"

    @property
    def scanned_pages(self) -> list[int]:
        return [p.number for p in self.pages if not p.has_text_layer]

    @property
    def text(self) -> str:
        return "\n\n".join(p.text for p in self.pages)


def check_running(name: str, started: float, limits: Limits, cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise DocumentError(f"{name}: reading the document was cancelled.")
    if time.monotonic() - started > limits.time_budget_s:
        raise DocumentError(f"{name}: reading the document took longer than {limits.time_budget_s:g} s, so it was stopped.")


def check_size(data: bytes, name: str, limits: Limits) -> None:
    if len(data) > limits.max_bytes:
        raise DocumentError(f"{name}: the file is {len(data) / 2**20:.1f} MiB, more than the {limits.max_bytes / 2**20:.0f} MiB a document may be.")


def decode_text(data: bytes, name: str, encoding: str = "utf-8-sig") -> str:
    """Text file bytes as str: a NUL in the first 8 KiB is binary; otherwise `encoding`
    (UTF-8 with an optional BOM unless the file declared another) or a sentence saying where
    it failed."""
    if b"\x00" in data[:8192]:
        raise DocumentError(f"{name}: the file holds binary data, not text, whatever its name says.")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        what = "UTF-8" if encoding.startswith("utf-8") else encoding
        raise DocumentError(f"{name}: the file is not {what} text (byte {exc.start} cannot be read).") from exc


def page_list(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3 and 7': page numbers as a sentence names them."""
    runs: list[str] = []
    start = prev = None
    for n in numbers + [None]:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + " and " + runs[-1]
