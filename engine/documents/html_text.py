"""A web page's text (the standard library's `html.parser`): headings as Markdown headings,
list items as `- `, table rows as `| a | b |`, preformatted text kept; no scripts, styles or
other content a reader does not see. Fed in slices, so time and cancel are checked as it goes."""
from __future__ import annotations

import codecs
import re
import threading
import time
from html.parser import HTMLParser

from .document import Document, DocumentError, Limits, Page, check_running, check_size, decode_text

HIDDEN = {"script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "head"}
BLOCKS = {"p", "div", "section", "article", "header", "footer", "nav", "aside", "main", "blockquote",
          "ul", "ol", "dl", "dt", "dd", "table", "thead", "tbody", "tfoot", "figure", "figcaption",
          "form", "address", "details", "summary", "br", "hr", "caption", "body", "html", "title"}
HEADINGS = {f"h{n}": n for n in range(1, 7)}
META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
FEED_CHARS = 1 << 20


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self._pieces: list[str] = []
        self._prefix = ""
        self._hidden = 0  # depth inside elements whose text nobody sees
        self._pre = 0
        self._cells = -1  # cells begun in the open table row (-1: no row open)
        self._title_seen = False
        self._head_title = False

    def handle_starttag(self, tag, attrs):
        if tag == "title" and not self._title_seen:
            self._head_title = True  # the page's name, though inside <head>
        if tag in HIDDEN:
            self._hidden += 1
            return
        if tag == "tr":
            self._flush()
            self._cells = 0
        elif tag in ("td", "th") and self._cells >= 0:
            self._pieces.append(" | " if self._cells else "| ")
            self._cells += 1
        elif self._cells > 0:
            self._pieces.append(" ")  # a block inside a cell stays on the row's line
        elif tag in HEADINGS:
            self._flush()
            self._prefix = "#" * HEADINGS[tag] + " "
        elif tag == "li":
            self._flush()
            self._prefix = "- "
        elif tag == "pre":
            self._flush()
            self._pre += 1
        elif tag in BLOCKS:
            self._flush()

    def handle_endtag(self, tag):
        if tag == "title" and self._head_title:
            self._head_title, self._title_seen = False, True
            text = " ".join("".join(self._pieces).split())
            self._pieces = []
            if text:
                self.lines.append("# " + text)
            return
        if tag in HIDDEN:
            self._hidden = max(0, self._hidden - 1)
            return
        if tag == "tr":
            if self._cells > 0:
                self._pieces.append(" |")
            self._cells = -1
            self._flush()
        elif self._cells > 0:
            return
        elif tag == "pre":
            self._flush()
            self._pre = max(0, self._pre - 1)
        elif tag in HEADINGS or tag == "li" or tag in BLOCKS:
            self._flush()

    def handle_data(self, data):
        if self._hidden and not self._head_title:
            return
        self._pieces.append(data)

    def _flush(self) -> None:
        raw = "".join(self._pieces)
        self._pieces = []
        if self._pre:
            text = raw.strip("\n")
            if text.strip():
                self.lines.append(text)
        else:
            text = " ".join(raw.split())
            if text and text != "|":
                self.lines.append(self._prefix + text)
        self._prefix = ""

    def text(self) -> str:
        self._flush()
        return "\n".join(self.lines)


def html_encoding(data: bytes) -> str:
    """The codec a page says it is written in (a BOM, then <meta charset>), else UTF-8."""
    if data.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    match = META_CHARSET.search(data[:4096])
    if match:
        try:
            return codecs.lookup(match.group(1).decode("ascii")).name
        except (LookupError, UnicodeDecodeError):
            pass
    return "utf-8-sig"


def extract_html(data: bytes, name: str, limits: Limits = Limits(), cancel: threading.Event | None = None) -> Document:
    check_size(data, name, limits)
    started = time.monotonic()
    source = decode_text(data, name, html_encoding(data))
    parser = _TextParser()
    try:
        for start in range(0, len(source), FEED_CHARS):
            check_running(name, started, limits, cancel)
            parser.feed(source[start:start + FEED_CHARS])
        parser.close()
    except DocumentError:
        raise
    except Exception as exc:  # html.parser is lenient; this is only for what it still refuses
        raise DocumentError(f"{name}: the web page could not be read ({exc}).") from exc
    return Document(name, "html", [Page(1, parser.text())])
