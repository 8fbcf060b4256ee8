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


@dataclass(frozen=True)
class Document:
    name: str
    kind: str  # "pdf", "text"
    pages: list[Page] = field(default_factory=list)

    @property
    def scanned_pages(self) -> list[int]:
        return [p.number for p in self.pages if not p.has_text_layer]


def check_running(name: str, started: float, limits: Limits, cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise DocumentError(f"{name}: reading the document was cancelled.")
    if time.monotonic() - started > limits.time_budget_s:
        raise DocumentError(f"{name}: reading the document took longer than {limits.time_budget_s:g} s, so it was stopped.")
