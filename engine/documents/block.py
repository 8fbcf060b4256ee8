"""The one rule for what a document puts into a prompt, for the window, the server and the CLI.

A whole document is `document_block`: its name, then its text with a marker before each page
(a source file fenced with its language). The text depends on the document alone, never on the
turn, so the same bytes open the prompt on every turn and the KV prefix cache reuses them. A
retrieved document brings `excerpts_block` (the best chunks, numbered, each with file and page)
and `sources` (the list shown under the reply)."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Callable

from .document import Document
from .scans import MAX_SCANS

FENCE_LANGUAGES = {"C++": "cpp", "C#": "csharp", "Objective-C": "objectivec", "JSON Lines": "jsonl",
                   "Protocol Buffers": "protobuf", "Shell": "sh"}


@dataclass(frozen=True)
class Source:
    file: str
    page: int | None  # None: a document without pages (Word, HTML, text)
    heading: str = ""

    @classmethod
    def from_json(cls, raw) -> "Source | None":
        """A source as a reply's stored JSON holds it ({file, page, heading}); None if unreadable."""
        if not isinstance(raw, dict) or not isinstance(raw.get("file"), str):
            return None
        page = raw.get("page")
        heading = raw.get("heading")
        return cls(raw["file"], page if isinstance(page, int) and not isinstance(page, bool) else None,
                   heading if isinstance(heading, str) else "")

    @property
    def label(self) -> str:
        if self.page is not None:
            return f"{self.file}, page {self.page}"
        return f"{self.file}, {self.heading}" if self.heading else self.file


def _attribute(value: str) -> str:
    return re.sub(r"[\x00-\x1f\"<>]", "_", value)


def _fenced(text: str, language: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    tag = FENCE_LANGUAGES.get(language, language.lower().replace(" ", ""))
    return f"{fence}{tag}\n{text.rstrip(chr(10))}\n{fence}"


def _page_text(document: Document, index: int, vision: bool) -> str:
    page = document.pages[index]
    if page.has_text_layer:
        return page.text.strip("\n")
    if vision and document.scanned_pages.index(page.number) < MAX_SCANS:
        return "[a scanned page: its image is attached]"
    return "[a scanned page without a text layer: not read]"


def document_block(document: Document, vision: bool = False) -> str:
    """The whole document as the prompt carries it; `vision`: its scanned pages go as images."""
    attributes = f'name="{_attribute(document.name)}"'
    if document.kind == "source" and document.language:
        body = _fenced(document.pages[0].text if document.pages else "", document.language)
        return f'<document {attributes} language="{_attribute(document.language)}">\n{body}\n</document>'
    if document.paged:
        pages = str(len(document.pages))
        if document.total_pages is not None:
            pages += f" of {document.total_pages}"
        attributes += f' pages="{pages}"'
        parts = [f"--- page {page.number} ---\n{_page_text(document, i, vision)}" for i, page in enumerate(document.pages)]
        body = "\n".join(parts)
    else:
        body = document.text.strip("\n")
    return f"<document {attributes}>\n{body}\n</document>"


def retrieved_note(document: Document) -> str:
    """What the message that attached a retrieved document says of it, in place of its text (the
    same bytes every turn; its excerpts come with each question)."""
    pages = f' pages="{len(document.pages)}"' if document.paged else ""
    return (f'<document name="{_attribute(document.name)}"{pages} mode="retrieved">\n'
            "Too long to include whole: the passages of it that bear on the question are given as excerpts.\n"
            "</document>")


def _source_of(hit) -> Source:
    return Source(hit.file, hit.page, hit.heading if hit.page is None else "")


def excerpts_block(hits) -> str:
    """Retrieved chunks (anything with file, page, heading, text), each headed by its number in
    `sources` (two chunks of one page share it) and its label."""
    if not hits:
        return ""
    numbers = {source: n for n, source in enumerate(sources(hits), 1)}
    parts = [f"[{numbers[_source_of(h)]}] {_source_of(h).label}\n{h.text.strip()}" for h in hits]
    return "<excerpts>\n" + "\n\n".join(parts) + "\n</excerpts>"


def sources(hits) -> list[Source]:
    """The sources under a reply: each (file, page) once, in the order of the hits."""
    out: list[Source] = []
    for hit in hits:
        source = _source_of(hit)
        if source not in out:
            out.append(source)
    return out


def sources_line(found: list[Source], link: Callable[[Source], str] | None = None) -> str:
    """The line under a reply: 'Sources: report.pdf p. 12, p. 40; notes.md, Setup' (each file
    once, its pages or headings in the order the search ranked them); '' for none. With `link`
    the line is rich text: its words HTML-escaped, each page a link to `link(source)`."""
    words = html.escape if link is not None else str

    def place(source: Source) -> str:
        if source.page is None:
            return words(source.heading)
        page = f"p. {source.page}"
        return f'<a href="{html.escape(link(source))}">{page}</a>' if link is not None else page

    by_file: dict[str, list[Source]] = {}
    for source in found:
        by_file.setdefault(source.file, []).append(source)
    shown = []
    for file, cited in by_file.items():
        placed = [s for s in cited if s.page is not None or s.heading]
        places = [place(s) for s in placed]
        paged = bool(placed) and placed[0].page is not None
        shown.append(f"{words(file)} {', '.join(places)}" if paged else ", ".join([words(file), *places]))
    return "Sources: " + "; ".join(shown) if shown else ""
