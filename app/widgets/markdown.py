"""Markdown for chat messages: Qt's own CommonMark/GFM reader (QTextDocument.setMarkdown),
a "Copy code" link above every fenced code block, a tinted background on code, and syntax
highlighting by pygments (a dependency; a small keyword/string/comment highlighter
if a build lacks it).

Model output is never trusted as HTML: setMarkdown does not run scripts or load remote
resources, and links only open through the message view's own handler.
"""
from __future__ import annotations


import functools
import re
from dataclasses import dataclass

from PySide6.QtCore import QSize, QUrl
from PySide6.QtGui import (QColor, QFont, QFontMetrics, QSyntaxHighlighter, QTextCharFormat, QTextCursor,
                           QTextDocument, QTextFormat, QTextFrameFormat, QTextImageFormat, QTextTable)

try:  # optional: much better lexers
    import pygments.lexers
    import pygments.token as ptoken
    from pygments.util import ClassNotFound
except ImportError:  # pragma: no cover - exercised on installs without pygments
    pygments = None

COPY_SCHEME = "copy-code"
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")


@dataclass
class CodeBlock:
    language: str
    code: str
    closed: bool  # False while a reply is still streaming inside the block


def code_blocks(markdown: str) -> list[CodeBlock]:
    """The fenced code blocks of `markdown`, in order (an unclosed last fence runs to the end)."""
    blocks, _ = _scan(markdown)
    return blocks


def with_copy_links(markdown: str) -> str:
    """`markdown` with a "Copy code" link line before every fenced code block; the link's
    URL is copy-code:<index into code_blocks()>."""
    _, out = _scan(markdown, link=True)
    return out


def _scan(markdown: str, link: bool = False) -> tuple[list[CodeBlock], str]:
    blocks: list[CodeBlock] = []
    out: list[str] = []
    fence: str | None = None
    lines: list[str] = []
    lang = ""
    for line in markdown.split("\n"):
        if fence is None:
            m = _FENCE.match(line)
            if link and not m:
                line = _image_to_link(line)
            if m:
                fence, lang, lines = m.group(2), m.group(3), []
                if link:
                    # The block's language as a label, then the copy link (its icon is put in
                    # by render_markdown). A blank line first: its own paragraph after text.
                    label = f"`{lang}`\u2003" if _LANGUAGE_NAME.fullmatch(lang) else ""
                    out.extend(["", f"{label}[Copy]({COPY_SCHEME}:{len(blocks)})", ""])
            out.append(line)
            continue
        stripped = line.strip()
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence) and len(line) - len(line.lstrip()) < 4:
            blocks.append(CodeBlock(lang, "\n".join(lines), True))
            fence = None
        else:
            lines.append(line)
        out.append(line)
    if fence is not None:
        blocks.append(CodeBlock(lang, "\n".join(lines), False))
    return blocks, "\n".join(out)


_IMAGE = re.compile(r"!(?=\[)")
_LANGUAGE_NAME = re.compile(r"[\w+#.-]{1,30}")


def _image_to_link(line: str) -> str:
    """`![alt](url)` -> `[alt](url)` outside inline code: Qt's image handler would read a
    local file (or show a tracking pixel) named by model output; a link does nothing until
    clicked, and only http(s) links open."""
    parts = line.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside `code` spans
        parts[i] = _IMAGE.sub("", parts[i])
    return "`".join(parts)


# --------------------------------------------------------------------------- highlighting

# (light, dark) colours per kind of token; readable on the code background of each scheme.
_COLOURS = {
    "keyword": ("#8e24aa", "#c792ea"),
    "string": ("#2e7d32", "#a5d6a7"),
    "comment": ("#757575", "#8a8f98"),
    "number": ("#d84315", "#f78c6c"),
    "function": ("#1565c0", "#82aaff"),
    "builtin": ("#00838f", "#89ddff"),
}
CODE_BACKGROUND = ("#f3f4f6", "#2b2f36")


def _kind_of(token) -> str | None:
    if pygments is None:
        return None
    T = ptoken
    if token in T.Comment:
        return "comment"
    if token in T.String:
        return "string"
    if token in T.Keyword or token in T.Operator.Word:
        return "keyword"
    if token in T.Number:
        return "number"
    if token in T.Name.Function or token in T.Name.Class:
        return "function"
    if token in T.Name.Builtin or token in T.Name.Decorator:
        return "builtin"
    return None


_SIMPLE_RULES = [
    ("comment", re.compile(r"(#|//).*$")),
    ("string", re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")),
    ("number", re.compile(r"\b\d+(?:\.\d+)?\b")),
    ("keyword", re.compile(
        r"\b(?:def|class|return|if|elif|else|for|while|in|import|from|as|with|try|except|finally|"
        r"raise|lambda|yield|async|await|fn|let|mut|const|var|function|struct|enum|impl|pub|use|"
        r"match|switch|case|break|continue|new|null|None|True|False|true|false|self|this|int|"
        r"float|void|char|auto|static|public|private|package|func|type|interface)\b")),
]


_CODE_FENCE = QTextFormat.Property.BlockCodeFence  # looked up once: PySide enum access is slow
_CODE_LANGUAGE = QTextFormat.Property.BlockCodeLanguage


def _code_language(block) -> str | None:
    """The fence language of a code block ('' for none), or None if `block` is not code."""
    fmt = block.blockFormat()
    if not fmt.hasProperty(_CODE_FENCE) and not fmt.hasProperty(_CODE_LANGUAGE):
        return None
    return str(fmt.property(_CODE_LANGUAGE) or "")


@functools.lru_cache(maxsize=64)
def _lexer(lang: str):
    """One lexer per language, made once: making one costs milliseconds (its rules compile),
    and a long chat highlights hundreds of blocks."""
    try:
        lexer = pygments.lexers.get_lexer_by_name(lang)
    except ClassNotFound:
        return None
    lexer.stripnl = False
    lexer.ensurenl = False
    return lexer


def warm_up() -> None:
    """Make the commonest lexer before the window shows (its first use costs tens of ms)."""
    if pygments is not None:
        _lexer("python")


class CodeHighlighter(QSyntaxHighlighter):
    """Colours the code blocks of a markdown document. With pygments each code block is
    lexed whole (so multi-line strings and comments come out right), then cut per line."""

    def __init__(self, document: QTextDocument, dark: bool = False):
        super().__init__(document)
        self.formats = {}
        for kind, colours in _COLOURS.items():
            fmt = QTextCharFormat()
            fmt.setForeground(QColor(colours[1 if dark else 0]))
            if kind == "keyword":
                fmt.setFontWeight(QFont.Weight.DemiBold)
            if kind == "comment":
                fmt.setFontItalic(True)
            self.formats[kind] = fmt
        self._runs: dict[int, tuple[str, list[list[tuple[int, int, str]]]]] = {}
        self._first_of: dict[int, int] = {}  # block number -> first block of its code block

    def forget(self) -> None:
        """The document is refilled: lexed code blocks are stale."""
        self._runs.clear()
        self._first_of.clear()

    def highlightBlock(self, text: str) -> None:  # noqa: N802 - Qt override
        block = self.currentBlock()
        lang = _code_language(block)
        if lang is None:
            return
        spans = None
        if pygments is not None:
            spans = self._pygments_spans(block, lang)
        if spans is None:
            spans = self._simple_spans(text)
        for start, length, kind in spans:
            self.setFormat(start, length, self.formats[kind])

    def _simple_spans(self, text: str) -> list[tuple[int, int, str]]:
        taken = [False] * len(text)
        spans = []
        for kind, rule in _SIMPLE_RULES:
            for m in rule.finditer(text):
                if any(taken[m.start():m.end()]):
                    continue
                taken[m.start():m.end()] = [True] * (m.end() - m.start())
                spans.append((m.start(), m.end() - m.start(), kind))
        return spans

    def _pygments_spans(self, block, lang: str) -> list[tuple[int, int, str]] | None:
        number = block.blockNumber()
        if number in self._first_of:  # a later line of a code block lexed whole already
            first_number = self._first_of[number]
            runs = self._runs[first_number][1]
            index = number - first_number
            return runs[index] if index < len(runs) else []
        first = block
        while first.previous().isValid() and _code_language(first.previous()) == lang:
            first = first.previous()
        lines, b = [], first
        while b.isValid() and _code_language(b) == lang:
            lines.append(b.text())
            b = b.next()
        source = "\n".join(lines)
        cached = self._runs.get(first.blockNumber())
        if cached is None or cached[0] != source:
            per_line = self._lex(source, lang, len(lines))
            if per_line is None:
                return None
            cached = (source, per_line)
            self._runs[first.blockNumber()] = cached
            self._first_of.update((first.blockNumber() + i, first.blockNumber()) for i in range(len(lines)))
        index = block.blockNumber() - first.blockNumber()
        return cached[1][index] if index < len(cached[1]) else []

    @staticmethod
    def _lex(source: str, lang: str, n_lines: int) -> list[list[tuple[int, int, str]]] | None:
        if not lang:  # guessing tries every lexer: too slow to redo while a reply streams
            return None
        lexer = _lexer(lang)
        if lexer is None:
            return None
        per_line: list[list[tuple[int, int, str]]] = [[] for _ in range(n_lines)]
        line, col = 0, 0
        for token, value in lexer.get_tokens(source):
            kind = _kind_of(token)
            for i, piece in enumerate(value.split("\n")):
                if i:
                    line, col = line + 1, 0
                if kind and piece and line < n_lines:
                    per_line[line].append((col, len(piece), kind))
                col += len(piece)
        return per_line


# (light, dark): links and "Copy code" lines readable on each scheme's message background. Qt
# bakes the application palette's link colour in at import, dark blue even on a dark scheme.
LINK_COLOURS = ("#1565c0", "#82aaff")


def _colour_links(cursor: QTextCursor, block, colour: QColor) -> list[int]:
    """Give the links of `block` `colour`; the positions of its copy links."""
    copies = []
    it = block.begin()
    while not it.atEnd():
        fragment = it.fragment()
        if fragment.isValid() and fragment.charFormat().isAnchor():
            fmt = QTextCharFormat()
            fmt.setForeground(colour)
            cursor.setPosition(fragment.position())
            cursor.setPosition(fragment.position() + fragment.length(), QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)
            if fragment.charFormat().anchorHref().startswith(f"{COPY_SCHEME}:"):
                copies.append(fragment.position())
        it += 1
    return copies


def _add_copy_icons(document: QTextDocument, cursor: QTextCursor, positions: list[int], colour: QColor) -> None:
    """A copy icon before each copy link: an image resource of the document (it loads no
    others, see chat_view.SafeDocument), in the link's colour, sharp at 2x."""
    from .icons import icon

    name = f"tramontane-icon:copy-{colour.name()}"
    added = document.__dict__.setdefault("_tramontane_icons", set())
    if name not in added:
        added.add(name)
        size = QFontMetrics(document.defaultFont()).height()
        document.addResource(QTextDocument.ResourceType.ImageResource, QUrl(name),
                             icon("copy", colour).pixmap(QSize(size, size), 2.0).toImage())
    image = QTextImageFormat()
    image.setName(name)
    image.setVerticalAlignment(QTextCharFormat.VerticalAlignment.AlignMiddle)
    for position in reversed(positions):  # from the end: earlier positions stay valid
        cursor.setPosition(position)
        cursor.insertImage(image)
        cursor.insertText(" ", QTextCharFormat())


TABLE_COLOURS = {False: ("#d5d9df", "#f1f3f6"), True: ("#3a3f47", "#262a30")}  # (lines, header row)


def _style_tables(document: QTextDocument, dark: bool) -> None:
    """Tables as chat apps draw them: single thin lines (collapsed borders), padded cells, a
    tinted header row; Qt's default is spaced double borders, like old HTML."""
    lines, header = (QColor(c) for c in TABLE_COLOURS[dark])
    for frame in document.rootFrame().childFrames():
        if not isinstance(frame, QTextTable):
            continue
        fmt = frame.format()
        fmt.setBorderCollapse(True)
        fmt.setBorder(1)
        fmt.setBorderBrush(lines)
        fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        fmt.setCellSpacing(0)
        fmt.setCellPadding(6)
        frame.setFormat(fmt)
        for column in range(frame.columns()):
            cell = frame.cellAt(0, column)
            cell_format = cell.format()
            cell_format.setBackground(header)
            cell.setFormat(cell_format)


def render_markdown(document: QTextDocument, markdown: str, dark: bool = False) -> None:
    """Fill `document` with `markdown` (plus copy links), tint its code blocks and make sure
    a CodeHighlighter of the right colour scheme is attached."""
    highlighter = getattr(document, "_tramontane_highlighter", None)
    if highlighter is not None and highlighter.dark != dark:
        highlighter.setDocument(None)
        highlighter = None
    if highlighter is not None:
        highlighter.forget()
    # No raw HTML: model output is text, not markup that could pull in resources.
    features = (QTextDocument.MarkdownFeature.MarkdownDialectGitHub
                | QTextDocument.MarkdownFeature.MarkdownNoHTML)
    document.setMarkdown(with_copy_links(markdown), features)
    background = QColor(CODE_BACKGROUND[1 if dark else 0])
    link = QColor(LINK_COLOURS[1 if dark else 0])
    cursor = QTextCursor(document)
    block = document.begin()
    copies = []
    while block.isValid():
        copies += _colour_links(cursor, block, link)
        if _code_language(block) is not None:
            fmt = block.blockFormat()
            fmt.setBackground(background)
            fmt.setLeftMargin(6)
            # Qt keeps code lines unbroken; a message has no horizontal scroll bar, so a long
            # line would be cut off at the edge. Wrapped, all of it can be read.
            fmt.setNonBreakableLines(False)
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
        block = block.next()
    _add_copy_icons(document, cursor, copies, link)
    _style_tables(document, dark)
    if highlighter is None:
        highlighter = CodeHighlighter(document, dark)
        highlighter.dark = dark
        document._tramontane_highlighter = highlighter  # keep a Python reference
        highlighter.rehighlight()  # now, not at the next event loop turn: heights are final
