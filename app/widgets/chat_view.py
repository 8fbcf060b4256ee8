"""The conversation: one widget per message (Markdown body, image thumbnails that open full
size, a status line with the reply's numbers, and Copy / Edit / Regenerate / Branch buttons),
in a scroll area that follows a streaming reply.

A streaming reply is re-rendered at most every `RENDER_INTERVAL_MS`, however fast the pieces
arrive, so the UI thread never spends its time re-parsing Markdown on every token.
"""
from __future__ import annotations


import time
from pathlib import Path
from types import SimpleNamespace

import shiboken6

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (QCursor, QDesktopServices, QGuiApplication, QIcon, QImageReader, QKeySequence, QPixmap, QTextCursor,
                           QTextDocument)
from PySide6.QtWidgets import (QApplication, QDialog, QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar,
                               QPushButton, QScrollArea, QSizePolicy, QTextBrowser, QToolButton, QToolTip, QVBoxLayout,
                               QWidget)

from ...engine.api import GenerationStats
from ..jobs import Jobs
from .icons import icon
from .markdown import COPY_SCHEME, code_blocks, render_markdown
from .reasoning_block import ReasoningBlock
from .speculation_status import speculation_note

RENDER_INTERVAL_MS = 50
PAGE_SIDE = 1600  # px: the longest side of a document page shown (DocumentPageViewer)
SOURCE_SCHEME = "tramontane-source"  # the sources line's links: tramontane-source:<index>
THUMB_SIZE = 96
COLUMN_WIDTH = 760  # the conversation's text column, centred (lines stay readable at 1600 px)
MIN_THUMB_SIDE = 6  # px: a thumbnail thinner than this is shown as the image's name and size
EDITOR_MAX_LINES = 14  # the inline editor grows with its text up to this, then scrolls
COPIED_MS = 1500  # how long "Copied" shows on the copy button
# A long chat is shown newest first: the last SYNC_TAIL messages at once, the older ones a few
# at a time between events (each turn at most BACKLOG_SLICE_S), so the UI never stalls.
SYNC_ALL = 16
SYNC_TAIL = 2
BACKLOG_SLICE_S = 0.012
ACTION_ICON = QSize(18, 18)


CONTEXT_FULL_ADVICE = "context full: branch from an earlier message or start a new chat to go on"
RAISE_CONTEXT = ", or raise the context length in Settings"


def context_used(stats, size: int = 0) -> int:
    """The tokens a conversation holds after a reply: its prompt and the reply (at most the
    context `size` when known: the last token of a reply that filled it is not kept). The
    same number whether read from live stats or from the stored message, so a reopened chat
    says what the live one said."""
    used = (stats.prompt_tokens or 0) + (stats.generated_tokens or 0)
    return min(used, size) if size > 0 else used


def status_text(message, live: GenerationStats | None = None, context: tuple[int, bool] = (0, True)) -> str:
    """'12.3 tok/s · TTFT 0.21 s · context 345 / 4096 · 120 reused' for a finished reply.
    `context`: the loaded model's context size (0 unknown) and whether Settings can raise it."""
    parts = []
    reason = getattr(message, "finish_reason", None)
    state = getattr(message, "state", "complete")
    if state == "interrupted":
        parts.append("interrupted (the app closed while it was written)")
    elif reason == "cancelled":
        parts.append("stopped")
    elif reason == "context_full":
        parts.append(CONTEXT_FULL_ADVICE + (RAISE_CONTEXT if context[1] else ""))
    elif reason == "length":
        parts.append("max tokens reached")
    elif reason == "error":
        parts.append("failed")
    decode = live.decode_tok_s if live else message.decode_tok_s
    ttft = live.ttft_s if live else message.ttft_s
    if decode:
        parts.append(f"{decode:.1f} tok/s")
    spec = speculation_note(live) if live else ""  # the live reply's own counts: the store keeps no drafts
    if spec:
        parts.append(spec)
    if ttft:
        parts.append(f"TTFT {ttft:.2f} s")
    if live and live.context_size:
        parts.append(f"context {context_used(live, live.context_size)} / {live.context_size}")
    elif message.prompt_tokens:
        size = f" / {context[0]}" if context[0] else ""  # the loaded model's context
        parts.append(f"context {context_used(message, context[0])}{size}")
    reused = live.reused_tokens if live else message.reused_tokens
    if message.prompt_tokens or (live and live.prompt_tokens):
        parts.append(f"{reused} reused from cache")
    return " · ".join(parts)


class ImageViewer(QDialog):
    """An attached image, fitted to the window (never enlarged); "Actual size" (or a
    double-click) shows it at 100 %, scrollable, and back. Closed with Esc."""

    def __init__(self, path: str | Path, title: str = "", parent: QWidget | None = None,
                 pixmap: QPixmap | None = None):
        super().__init__(parent)
        self.setWindowTitle(title or Path(path).name)
        self.label = QLabel()
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.pixmap = pixmap if pixmap is not None else QPixmap(str(path))
        self.fit = True
        if self.pixmap.isNull():
            self.label.setText(f"{Path(path).name}: cannot show this image")
        self.label.setAccessibleName(f"Image {title}")
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.label)
        self.scroll.setWidgetResizable(True)
        self.size_button = QPushButton("Actual size")
        self.size_button.setToolTip("Show the image at 100 % (double-click the image does the same)")
        self.size_button.clicked.connect(self.toggle_fit)
        self.size_button.setEnabled(not self.pixmap.isNull())
        self.zoom_label = QLabel()
        self.bar = bar = QHBoxLayout()
        bar.setContentsMargins(8, 4, 8, 4)
        bar.addWidget(self.zoom_label)
        bar.addStretch(1)
        bar.addWidget(self.size_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(bar)
        layout.addWidget(self.scroll)
        screen = QGuiApplication.primaryScreen()
        limit = screen.availableSize() * 0.9 if screen else QSize(1200, 900)
        size = self.pixmap.size() if not self.pixmap.isNull() else QSize(300, 100)
        self.resize(min(size.width() + 24, limit.width()), min(size.height() + 60, limit.height()))
        self._show_pixmap()

    def set_pixmap(self, pixmap: QPixmap) -> None:
        """Show `pixmap` instead (a page rendered meanwhile), as fitted as the last one was."""
        self.pixmap = pixmap
        self.size_button.setEnabled(not pixmap.isNull())
        self.label.setText("")
        self._show_pixmap()

    def toggle_fit(self) -> None:
        self.fit = not self.fit
        self.size_button.setText("Actual size" if self.fit else "Fit to window")
        self._show_pixmap()

    def _show_pixmap(self) -> None:
        if self.pixmap.isNull():
            return
        room = self.scroll.viewport().size()
        shown = self.pixmap
        if self.fit and (self.pixmap.width() > room.width() or self.pixmap.height() > room.height()):
            shown = self.pixmap.scaled(room, Qt.AspectRatioMode.KeepAspectRatio,
                                       Qt.TransformationMode.SmoothTransformation)
        self.label.setPixmap(shown)
        self.zoom_label.setText(f"{self.pixmap.width()}×{self.pixmap.height()} · "
                                f"{round(100 * shown.width() / max(1, self.pixmap.width()))} %")

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self.fit:
            self._show_pixmap()

    def mouseDoubleClickEvent(self, event) -> None:  # noqa: N802
        self.toggle_fit()


class DocumentPageViewer(ImageViewer):
    """A page of a PDF the chat holds (the one a reply's source names), rendered by PDFium off
    the UI thread; Previous / Next turn the pages, "Open file" opens the whole document in the
    system's viewer (as the message's document button does)."""

    def __init__(self, path: str | Path, name: str, page: int, parent: QWidget | None = None):
        super().__init__(path, name, parent, pixmap=QPixmap())
        self.path, self.name = str(path), name
        self.page, self.pages = page, None  # the page asked for; the PDF's count once one is rendered
        self.jobs = Jobs(self)
        self.page_label = QLabel()
        self.previous_button = QPushButton("Previous page")
        self.previous_button.clicked.connect(lambda: self.show_page(self.page - 1))
        self.next_button = QPushButton("Next page")
        self.next_button.clicked.connect(lambda: self.show_page(self.page + 1))
        self.open_button = QPushButton("Open file")
        self.open_button.setToolTip(f"Open {name} in the system's viewer")
        self.open_button.clicked.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(self.path)))
        for at, widget in enumerate((self.page_label, self.previous_button, self.next_button)):
            self.bar.insertWidget(at, widget)
        self.bar.addWidget(self.open_button)
        screen = QGuiApplication.primaryScreen()
        limit = screen.availableSize() * 0.9 if screen else QSize(900, 1100)
        self.resize(min(900, limit.width()), min(1100, limit.height()))
        self.show_page(page)

    def show_page(self, number: int) -> None:
        self.page = number
        self.setWindowTitle(f"{self.name} — page {number}")
        self.page_label.setText(f"Page {number}" + (f" of {self.pages}" if self.pages else ""))
        self.previous_button.setEnabled(number > 1)
        self.next_button.setEnabled(self.pages is None or number < self.pages)
        self.pixmap = QPixmap()
        self.label.setPixmap(QPixmap())
        self.label.setText(f"{self.name}: page {number}…")
        path, name = self.path, self.name
        self.jobs.run(lambda: page_png(path, name, number), lambda done: self._rendered(number, done), self._failed)

    def _rendered(self, number: int, done: tuple[bytes, int]) -> None:
        if number != self.page:
            return  # another page was asked for meanwhile
        png, self.pages = done
        pixmap = QPixmap()
        pixmap.loadFromData(png, "PNG")
        self.page_label.setText(f"Page {number} of {self.pages}")
        self.next_button.setEnabled(number < self.pages)
        self.set_pixmap(pixmap)

    def _failed(self, error: str) -> None:
        self.label.setText(error)


def reply_source_list(message) -> list:
    """The engine/documents Sources of a reply that was given document excerpts (stored with it)."""
    from ...engine.documents.block import Source

    raw = (getattr(message, "tool", None) or {}).get("sources") if message.role == "assistant" else None
    return [s for s in map(Source.from_json, raw if isinstance(raw, list) else []) if s is not None]


def reply_sources(message) -> str:
    """'Sources: report.pdf p. 12, p. 40' for a reply that was given document excerpts."""
    from ...engine.documents.block import sources_line

    return sources_line(reply_source_list(message))


def page_png(path: str | Path, name: str, number: int) -> tuple[bytes, int]:
    """Page `number` of the stored PDF at `path` as PNG bytes (PAGE_SIDE pixels on its longest
    side), and the PDF's page count; a DocumentError naming `name` when it cannot be shown."""
    from ...engine.documents.document import DocumentError
    from ...engine.documents.scans import render_page

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DocumentError(f"{name}: the chat's copy of the document cannot be read ({exc.strerror or exc}).") from exc
    page, count = render_page(data, name, number, PAGE_SIDE)
    return page.image_part(name).data, count


def button_text(text: str) -> str:
    """A file's name as a button shows it: Qt takes '&' as a shortcut marker (it would underline
    the next letter and hide itself), so each one is doubled."""
    return text.replace("&", "&&")


def thumbnail(path: str | Path, size: int = THUMB_SIZE) -> QPixmap:
    """A small pixmap of an image file, decoded at reduced size where the format allows."""
    reader = QImageReader(str(path))
    reader.setAutoTransform(True)
    full = reader.size()
    if full.isValid() and (full.width() > size or full.height() > size):
        reader.setScaledSize(full.scaled(size, size, Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    return QPixmap.fromImage(image) if not image.isNull() else QPixmap()


class SafeDocument(QTextDocument):
    """A document that loads no resources: model output must not make the app read local
    files or reach the network (`![](file:///...)` shows as a missing image)."""

    def loadResource(self, kind: int, url: QUrl):  # noqa: N802 - Qt override
        return None


def share_font(widget: QWidget, font) -> None:
    """Give `widget` and everything in it `font`. Qt's own inheritance stops at every widget a
    style sheet rule matches (the window styles the conversation, the messages, the message
    box), so a zoom has to be handed down explicitly."""
    widget.setFont(font)
    for child in widget.findChildren(QWidget):
        child.setFont(font)


class MarkdownView(QTextBrowser):
    """Read-only Markdown that is as tall as its text (the scroll area scrolls, not it)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setDocument(SafeDocument(self))
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QTextBrowser { background: transparent; }")
        self.anchorClicked.connect(self._open_link)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.markdown = ""
        self.copied_block = -1  # the last code block copied (tests)

    def set_markdown(self, text: str, dark: bool) -> None:
        self.markdown = text
        render_markdown(self.document(), text, dark)
        self._fit()

    def _open_link(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            blocks = code_blocks(self.markdown)
            index = int(url.path() or -1) if url.path().isdigit() else -1
            if 0 <= index < len(blocks):
                QGuiApplication.clipboard().setText(blocks[index].code)
                QToolTip.showText(QCursor.pos(), "Copied", self)  # it worked, where the click was
                self.copied_block = index
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)  # the user clicked it; nothing opens by itself

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit()

    def _fit(self, *_args) -> None:
        self.document().setTextWidth(self.viewport().width())
        height = int(self.document().size().height()) + 4
        if height != self.height():
            self.setFixedHeight(height)


class MessageWidget(QFrame):
    """One message. Buttons are shown only where they make sense for its role and place."""

    editSubmitted = Signal(int, str)  # message id, new text
    regenerateRequested = Signal(int)  # message id of the assistant reply
    branchRequested = Signal(int)  # message id to branch after
    versionRequested = Signal(int, int)  # message id, which version of the reply to show
    imageOpened = Signal(str, str)  # path, name
    sourceOpened = Signal(str, int)  # a source's file name and page (a link of the sources line)

    def __init__(self, message, *, dark: bool, can_regenerate: bool, busy: bool, can_reply: bool = True,
                 context: tuple[int, bool] = (0, True), live: GenerationStats | None = None, error: str = "",
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.context = context
        self.dark = dark
        self.error = error
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(message.role, message.role)
        self.role_label = QLabel(who)
        self.role_label.setObjectName("roleLabel")
        self.body = MarkdownView(self)
        self.body.setAccessibleName(f"{who} message")
        self.status = QLabel()
        self.status.setObjectName("statusLine")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label = QLabel()
        self.error_label.setObjectName("errorLine")
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 14, 8)
        layout.setSpacing(4)
        layout.addLayout(self._header(message))
        self.thumbs = []
        if message.images:
            layout.addLayout(self._image_row(message.images))
        self.document_buttons = []
        if getattr(message, "documents", None):  # issue 37: what was attached, opened by a click
            layout.addLayout(self._document_row(message.documents))
        self.thought = ReasoningBlock(self)  # a reasoning model's thought, above the answer (issue 36)
        layout.addWidget(self.thought)
        if getattr(message, "reasoning", ""):
            self.thought.set_thought(message.reasoning, seconds=message.reasoning_s, cut=message.reasoning_open,
                                     thinking=message.state == "streaming" and not message.text)
        layout.addWidget(self.body)
        # issue 37: the excerpts a reply read, each page a link that opens the document there
        from ...engine.documents.block import sources_line

        self.sources = reply_source_list(message)
        self.sources_text = reply_sources(message)  # the line in plain words
        self.sources_label = QLabel(sources_line(self.sources, link=lambda s: f"{SOURCE_SCHEME}:{self.sources.index(s)}"))
        self.sources_label.setObjectName("sourcesLine")
        self.sources_label.setTextFormat(Qt.TextFormat.RichText)
        self.sources_label.setWordWrap(True)
        self.sources_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                                   | Qt.TextInteractionFlag.LinksAccessibleByMouse
                                                   | Qt.TextInteractionFlag.LinksAccessibleByKeyboard)
        self.sources_label.setToolTip("Click a page to open the document there")
        self.sources_label.linkActivated.connect(self._source_clicked)
        self.sources_label.setVisible(bool(self.sources_text))
        layout.addWidget(self.sources_label)
        self.editor: QPlainTextEdit | None = None
        self.edit_box = QWidget()
        layout.addWidget(self.edit_box)
        self.edit_box.hide()
        layout.addWidget(self.error_label)
        self.prompt_bar: QProgressBar | None = None  # made when a reply's prompt reading is shown
        layout.addWidget(self.status)
        self.has_live = live is not None
        self.live = live
        self.set_text(message.text)
        self.set_stats(live)
        self.set_error(error)
        self.set_busy(busy, can_regenerate, can_reply)

    def _source_clicked(self, href: str) -> None:
        scheme, _, index = href.partition(":")
        if scheme == SOURCE_SCHEME and index.isdigit() and int(index) < len(self.sources):
            source = self.sources[int(index)]
            if source.page is not None:
                self.sourceOpened.emit(source.file, source.page)

    def _header(self, message) -> QHBoxLayout:
        """The role, the reply's version switch, and the actions this role and place allow."""
        header = QHBoxLayout()
        header.setSpacing(2)
        header.addWidget(self.role_label)
        self.versions_label = None
        self.version_buttons: dict[str, QToolButton] = {}
        if getattr(message, "versions", 1) > 1:
            self._add_version_switch(header)
        header.addStretch(1)
        self.buttons: dict[str, QToolButton] = {}
        self.hovered = False
        self._copied = QTimer(self)
        self._copied.setSingleShot(True)
        self._copied.setInterval(COPIED_MS)
        self._copied.timeout.connect(self._copy_done)
        self._add_button(header, "copy", "Copy", "Copy this message's text", self._copy)
        if message.role == "user":
            self._add_button(header, "edit", "Edit", "Edit this message and send it again",
                             self._start_edit)
        if message.role == "assistant":
            self._add_button(header, "regenerate", "Regenerate", "Write this reply again",
                             lambda: self.regenerateRequested.emit(self.message.id))
        self._add_button(header, "branch", "Branch", "Start a new chat that copies the "
                         "conversation up to this message",
                         lambda: self.branchRequested.emit(self.message.id), enabled=message.state != "streaming")
        return header

    def _image_row(self, images) -> QHBoxLayout:
        """One thumbnail button per picture (kept in self.thumbs); a click opens it at full size."""
        row = QHBoxLayout()
        for image in images:
            button = QToolButton()
            pixmap = thumbnail(image.path)
            if pixmap.isNull() or min(pixmap.width(), pixmap.height()) < MIN_THUMB_SIDE:
                # A thin strip's thumbnail is a line: an invisible button. Say what it is.
                reader = QImageReader(str(image.path))
                full = reader.size()
                button.setText(button_text(f"{image.name} ({full.width()}×{full.height()})" if full.isValid()
                                           else image.name))
                button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
            else:
                button.setIcon(QIcon(pixmap))
                button.setIconSize(pixmap.size())
            button.setToolTip(f"{image.name} — click to open at full size")
            button.setAccessibleName(f"Image {image.name}")
            button.setAutoRaise(True)
            button.clicked.connect(lambda _=False, p=str(image.path), n=image.name:
                                   self.imageOpened.emit(p, n))
            row.addWidget(button)
            self.thumbs.append(button)
        row.addStretch(1)
        return row

    def _document_row(self, documents) -> QHBoxLayout:
        """One button per attached document (kept in self.document_buttons); a click opens the file."""
        row = QHBoxLayout()
        for document in documents:
            button = QToolButton()
            button.setText(button_text(f"📄 {document.name}"))
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
            button.setToolTip(f"{document.name} — click to open it")
            button.setAccessibleName(f"Document {document.name}")
            button.setAutoRaise(True)
            button.clicked.connect(lambda _=False, p=str(document.path):
                                   QDesktopServices.openUrl(QUrl.fromLocalFile(p)))
            row.addWidget(button)
            self.document_buttons.append(button)
        row.addStretch(1)
        return row

    def set_busy(self, busy: bool, can_regenerate: bool, can_reply: bool = True) -> None:
        """Edit/Regenerate are off while a reply is written, and without a model to write one;
        Regenerate only on the last reply."""
        self._can_regenerate = can_regenerate
        self.busy = busy
        for key, tip in (("edit", "Edit this message and send it again"), ("regenerate", "Write this reply again")):
            if key in self.buttons:
                self.buttons[key].setToolTip(tip if can_reply else f"{tip} (load a model first)")
        busy = busy or not can_reply
        if "edit" in self.buttons:
            self.buttons["edit"].setEnabled(not busy)
        if "regenerate" in self.buttons:
            button = self.buttons["regenerate"]
            button.setVisible(can_regenerate and not self.buttons["copy"].isHidden())
            # Not on this reply: no place kept either.
            policy = button.sizePolicy()
            policy.setRetainSizeWhenHidden(can_regenerate)
            button.setSizePolicy(policy)
            button.setEnabled(not busy)

    def shows(self, message, live, error: str, dark: bool) -> bool:
        """Whether this widget already shows `message` exactly as it is now."""
        mine = self.message
        return (mine.id == message.id and mine.state == message.state and mine.text == message.text
                and getattr(mine, "reasoning", "") == getattr(message, "reasoning", "")
                and getattr(mine, "versions", 1) == getattr(message, "versions", 1)
                and getattr(mine, "version", 0) == getattr(message, "version", 0)
                and mine.finish_reason == message.finish_reason and self.error == error
                and self.sources_text == reply_sources(message)  # saved just after the text
                and self.has_live == (live is not None) and self.dark == dark and self.editor is None)

    def _add_button(self, layout, key: str, text: str, tip: str, slot, enabled: bool = True) -> None:
        """An icon action; shown while the pointer is over the message or the keyboard focus
        is in it (see `show_actions`), its place kept meanwhile so nothing jumps."""
        button = QToolButton()
        button.setText(text)
        button.setIcon(icon(key))
        button.setIconSize(ACTION_ICON)
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        button.setToolTip(tip)
        button.setAccessibleName(text)
        button.setAutoRaise(True)
        button.setEnabled(enabled)
        button.clicked.connect(slot)
        policy = button.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        button.setSizePolicy(policy)
        button.hide()
        layout.addWidget(button)
        self.buttons[key] = button

    def _add_version_switch(self, header) -> None:
        """‹ 2/3 ›: the replies a regenerate kept, one click apart."""
        n, shown = self.message.versions, self.message.version
        for name, step in (("previous", -1), ("next", +1)):
            button = QToolButton()
            button.setIcon(icon(name))
            button.setIconSize(QSize(14, 14))
            button.setAutoRaise(True)
            button.setText("Previous version" if step < 0 else "Next version")
            button.setAccessibleName(button.text())
            button.setToolTip(button.text())
            button.setEnabled(0 <= shown + step < n and self.message.state != "streaming")
            button.clicked.connect(lambda _=False, i=shown + step: self.versionRequested.emit(self.message.id, i))
            header.addWidget(button)
            self.version_buttons[name] = button
            if step < 0:
                self.versions_label = QLabel(f"{shown + 1}/{n}")
                self.versions_label.setObjectName("statusLine")
                self.versions_label.setAccessibleName(f"Version {shown + 1} of {n}")
                header.addWidget(self.versions_label)

    def show_actions(self, shown: bool) -> None:
        for key, button in self.buttons.items():
            if key == "regenerate" and not self._can_regenerate:
                continue
            button.setVisible(shown)

    def enterEvent(self, event) -> None:  # noqa: N802
        self.hovered = True
        self.show_actions(True)
        super().enterEvent(event)

    def leaveEvent(self, event) -> None:  # noqa: N802
        self.hovered = False
        self.show_actions(self.isAncestorOf(QApplication.focusWidget()) if QApplication.focusWidget() else False)
        super().leaveEvent(event)

    def set_text(self, text: str) -> None:
        self.text = text
        if self.message.role == "user":
            # What the user typed is shown as typed, not interpreted as Markdown.
            self.body.markdown = text
            self.body.setPlainText(text)
            self.body._fit()
        elif not text and self.message.state == "streaming":
            self.body.set_markdown("*…*", self.dark)
            self.body.setVisible(not self.thought.thinking)  # the thought shows the model is at work
        else:
            self.body.set_markdown(text, self.dark)
            self.body.setVisible(bool(text) or not self.thought.text)  # a reply that only thought: its block
            if text:
                self.thought.answer_started()
        if text and self.prompt_bar is not None:  # the first words: the prompt was read
            self.prompt_bar.hide()
            if self.status.text().startswith("Reading "):
                self.status.setText("writing…")

    def set_thought(self, text: str) -> None:
        """The streaming reply's thought so far (a reasoning model's, before its answer)."""
        self.thought.set_thought(text, thinking=not self.text)
        if not self.text:
            self.body.hide()
        if text and self.prompt_bar is not None:  # the first thought: the prompt was read
            self.prompt_bar.hide()
            if self.status.text().startswith("Reading "):
                self.status.setText("thinking…")

    def set_images_reading(self, done: int, total: int) -> None:
        """A reply being written, before its prompt is read: the vision tower has encoded `done`
        of the new turn's `total` images (a bar and 'Encoding image 2 of 3…'; the prompt's
        progress follows)."""
        if self.text:
            return
        self._prompt_bar()
        self.prompt_bar.setRange(0, max(total, 1))
        self.prompt_bar.setValue(min(done, total))
        self.prompt_bar.setVisible(True)
        self.status.setText(f"Encoding image {min(done + 1, total)} of {total}…" if total > 1
                            else "Encoding the image…")
        self.status.setVisible(True)

    def _prompt_bar(self) -> None:
        if self.prompt_bar is None:
            bar = QProgressBar()
            bar.setObjectName("promptProgress")
            bar.setTextVisible(False)
            bar.setFixedHeight(6)
            bar.setAccessibleName("Prompt read")
            layout = self.layout()
            layout.insertWidget(layout.indexOf(self.status), bar)
            self.prompt_bar = bar

    def set_prompt_progress(self, read: int, total: int) -> None:
        """A reply being written, before its first words: how much of the prompt the model has
        read (a bar, and 'Reading the prompt… 340 / 1,000 tokens' in the status line)."""
        self._prompt_bar()
        reading = 0 <= read < total and not self.text
        self.prompt_bar.setRange(0, max(total, 1))
        self.prompt_bar.setValue(min(read, total))
        self.prompt_bar.setVisible(reading)
        self.status.setText(f"Reading the prompt… {read:,} / {total:,} tokens" if reading else "writing…")
        self.status.setVisible(True)

    def set_stats(self, live: GenerationStats | None) -> None:
        self.live = live
        if self.message.role != "assistant" or self.message.state == "streaming":
            self.status.setText("writing…" if self.message.state == "streaming" else "")
        else:
            self.status.setText(status_text(self.message, live, self.context))
        self.status.setVisible(bool(self.status.text()))

    def set_error(self, text: str) -> None:
        self.error = text
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        button = self.buttons["copy"]  # says it worked, for a moment
        button.setIcon(icon("check"))
        button.setText("Copied")
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self._copied.start()

    def _copy_done(self) -> None:
        button = self.buttons["copy"]
        button.setIcon(icon("copy"))
        button.setText("Copy")
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)

    # -- edit and resend ------------------------------------------------------------------------
    def _start_edit(self) -> None:
        if self.editor is not None:
            self.editor.setFocus()
            return
        self.editor = QPlainTextEdit(self.text)
        self.editor.setAccessibleName("Edit message")
        self.editor.setTabChangesFocus(True)
        send = QPushButton("Save && resend")
        send.setToolTip("Send this as a new version of the message and get a new reply; the old "
                        "version and what followed it stay one click away (‹ 1/2 ›) (Ctrl+Enter)")
        send.setShortcut(QKeySequence("Ctrl+Return"))
        cancel = QPushButton("Cancel")
        cancel.setShortcut(QKeySequence("Escape"))
        send.clicked.connect(self._submit_edit)
        cancel.clicked.connect(self._cancel_edit)
        box = QVBoxLayout(self.edit_box)
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(self.editor)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(cancel)
        row.addWidget(send)
        box.addLayout(row)
        self.edit_send = send
        share_font(self.edit_box, self.font())
        width = self.body.width()
        self.body.hide()
        self.edit_box.show()
        self._fit_editor(width)
        self.editor.moveCursor(QTextCursor.MoveOperation.End)
        self.editor.verticalScrollBar().setValue(0)  # it opens at the message's start
        self.editor.setFocus()

    def _fit_editor(self, width: int) -> None:
        """As tall as the text (up to EDITOR_MAX_LINES lines): it opens unscrolled."""
        editor = self.editor
        doc = editor.document().clone()  # measured at the message's width, wrapped
        doc.setDocumentMargin(editor.document().documentMargin())
        doc.setDefaultFont(editor.font())
        doc.setTextWidth(max(100, width - 2 * editor.frameWidth() - 4))
        line = editor.fontMetrics().lineSpacing()
        lines = max(2, doc.size().height() / line)
        height = int(min(lines, EDITOR_MAX_LINES) * line + 2 * doc.documentMargin() + 2 * editor.frameWidth() + 4)
        editor.setFixedHeight(height)

    def _submit_edit(self) -> None:
        if self.editor is None:
            return
        text = self.editor.toPlainText()
        if not text.strip() and not self.message.images:
            return
        self.editSubmitted.emit(self.message.id, text)

    def _cancel_edit(self) -> None:
        if self.editor is None:
            return
        self.edit_box.hide()
        self.body.show()
        # Drop the edit widgets so a later edit starts fresh from the current text.
        QWidget().setLayout(self.edit_box.layout())
        self.editor = None


class ChatView(QScrollArea):
    """The messages of one chat, newest at the bottom."""

    editSubmitted = Signal(int, str)
    regenerateRequested = Signal(int)
    branchRequested = Signal(int)
    versionRequested = Signal(int, int)
    toolDecided = Signal(int, str)  # a tool card's message id, the user's answer (app/tools.py)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.tool_waiting = lambda _message_id: False  # the window's ToolBroker.waiting
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAccessibleName("Conversation")
        self.inner = QWidget()
        self.inner.setObjectName("conversation")
        # The messages go in a column of readable width, centred in whatever room there is.
        column = QWidget()
        column.setMaximumWidth(COLUMN_WIDTH + 2 * 16)
        self.column = QVBoxLayout(column)
        self.column.setContentsMargins(16, 16, 16, 16)
        self.column.setSpacing(14)
        self.column.addStretch(1)
        centre = QHBoxLayout(self.inner)
        centre.setContentsMargins(0, 0, 0, 0)
        centre.addStretch(1)
        centre.addWidget(column, 100)
        centre.addStretch(1)
        self.setWidget(self.inner)
        QApplication.instance().focusChanged.connect(self._focus_moved)
        self.dark = False
        self.can_reply = True  # a model is there to write replies (else Edit/Regenerate are off)
        self.context = (0, True)  # the loaded model's context size, and whether Settings can raise it
        self.widgets: list[MessageWidget] = []
        self.messages: list = []  # the chat's messages shown (a source's document is found among them)
        self.open_thoughts: set[int] = set()  # replies whose thought the user opened: open when shown again
        self.notice = QLabel()
        self.notice.setObjectName("errorLine")
        self.notice.setWordWrap(True)
        self.notice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.notice.hide()
        self.column.addWidget(self.notice)
        self.queued: MessageWidget | None = None  # a message sent while the model loads
        self.streaming: MessageWidget | None = None
        self._pending_text: str | None = None
        self._pending_thought: str | None = None
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_pending)
        self._follow = True
        self._first = 0  # index in the shown chat of widgets[0] (older ones are in the backlog)
        self._backlog: list = []  # older messages still to build, oldest first
        self._backlog_args: dict = {}
        self._backlog_timer = QTimer(self)
        self._backlog_timer.setSingleShot(True)
        self._backlog_timer.setInterval(0)
        self._backlog_timer.timeout.connect(self._build_backlog)
        self._last_max = 0
        self._grew_top = False
        self._trash: list[MessageWidget] = []  # taken off the page, destroyed between events
        self._when_empty: list = []  # called once the trash is gone (see `after_trash`)
        self.verticalScrollBar().rangeChanged.connect(self._keep_at_bottom)
        self.verticalScrollBar().valueChanged.connect(self._note_position)

    def clear(self) -> None:
        self._backlog_timer.stop()
        self._backlog, self._first = [], 0
        self._render_timer.stop()
        self._pending_text = self._pending_thought = None
        self.streaming = None
        for w in self.widgets:
            self._discard(w)
        self.widgets = []
        self.drop_queued()
        self.show_notice("")

    def _discard(self, w: MessageWidget) -> None:
        """Take a message off the page now (never show a stale one); it is destroyed a few
        at a time between events (destroying a long chat's widgets at once would stall)."""
        self.column.removeWidget(w)
        w.hide()
        self._trash.append(w)
        if not self._backlog_timer.isActive():
            self._backlog_timer.start()

    def after_trash(self, callback) -> None:
        """Call `callback` once the discarded messages are destroyed (now if there are none):
        a restyle of the window is cheap only when they are gone."""
        if self._trash:
            self._when_empty.append(callback)
            self._backlog_timer.start()
        else:
            callback()

    def show_messages(self, messages, *, live: dict, errors: dict, busy: bool,
                      streaming_id: int | None = None) -> None:
        """Show stored `messages`; `live` maps message id -> GenerationStats of replies made in
        this run, `errors` message id -> error text. Widgets that already show a message as
        it is are kept, so a new turn only builds the new messages."""
        self._render_timer.stop()
        self._backlog_timer.stop()
        self._pending_text = self._pending_thought = None
        self.streaming = None
        self.drop_queued()
        self.messages = list(messages)
        last_assistant = next((m.id for m in reversed(messages) if m.role == "assistant"), None)
        # widgets[k] shows messages[first + k]; older ones may still be in the backlog.
        first = self._first
        if first and (first >= len(messages) or not self.widgets
                      or messages[first].id != self.widgets[0].message.id):
            first = 0  # another chat, or the start moved: build anew
        keep = 0
        while (keep < len(self.widgets) and first + keep < len(messages)
               and messages[first + keep].id != streaming_id
               and self.widgets[keep].shows(messages[first + keep], live.get(messages[first + keep].id),
                                            errors.get(messages[first + keep].id, ""), self.dark)):
            keep += 1
        if first and not keep:
            first = 0
        for w in self.widgets[keep:]:
            self._discard(w)
        del self.widgets[keep:]
        for w in self.widgets:
            w.set_busy(busy, w.message.id == last_assistant, self.can_reply)
        if not keep and len(messages) > SYNC_ALL:
            first = len(messages) - SYNC_TAIL  # a long chat: its end now, the rest in turns
        args = dict(live=live, errors=errors, busy=busy, last_assistant=last_assistant, can_reply=self.can_reply,
                    context=self.context)
        for m in messages[first + keep:]:
            w = self._add(m, **self._message_args(m, args))
            if m.id == streaming_id:
                self.streaming = w
        self._first, self._backlog, self._backlog_args = first, list(messages[:first]), args
        if self._backlog or self._trash:
            self._backlog_timer.start()
        self._follow = True

    @staticmethod
    def _message_args(m, args: dict) -> dict:
        return dict(can_regenerate=m.id == args["last_assistant"], busy=args["busy"], can_reply=args["can_reply"],
                    context=args["context"],
                    live=args["live"].get(m.id), error=args["errors"].get(m.id, ""))

    def set_context(self, size: int, can_grow: bool) -> None:
        """The loaded model's context (for the replies' numbers and advice)."""
        if (size, can_grow) == self.context:
            return
        self.context = (size, can_grow)
        self._backlog_args["context"] = self.context
        for w in self.widgets:
            w.context = self.context
            w.set_stats(w.live)

    def set_can_reply(self, can_reply: bool) -> None:
        """Whether a model is there to write replies (Edit and Regenerate need one)."""
        if can_reply == self.can_reply:
            return
        self.can_reply = can_reply
        self._backlog_args["can_reply"] = can_reply
        for w in self.widgets:
            w.set_busy(w.busy, w._can_regenerate, can_reply)

    def long_chat_shown(self) -> bool:
        """More messages than are drawn at once: changes to all of them go in slices."""
        return len(self.widgets) + len(self._backlog) > SYNC_ALL

    @property
    def building(self) -> bool:
        """Older messages of a long chat are still being added."""
        return bool(self._backlog)

    def _build_backlog(self) -> None:
        """Add the next older messages above the shown ones, for at most BACKLOG_SLICE_S."""
        deadline = time.perf_counter() + BACKLOG_SLICE_S
        while self._trash and time.perf_counter() < deadline:
            shiboken6.delete(self._trash.pop())
        if not self._trash:
            callbacks, self._when_empty = self._when_empty, []
            for callback in callbacks:
                callback()
        while self._backlog and time.perf_counter() < deadline:
            m = self._backlog.pop()
            self._add(m, at_top=True, **self._message_args(m, self._backlog_args))
            self._first -= 1
            self._grew_top = True
        if self._backlog or self._trash:
            self._backlog_timer.start()

    def changeEvent(self, event) -> None:  # noqa: N802
        if event.type() == QEvent.Type.FontChange:  # a zoom: hand it to every message
            share_font(self.inner, self.font())
        super().changeEvent(event)

    def _add(self, message, at_top: bool = False, **kwargs) -> MessageWidget:
        if message.role == "tool":  # a tool call's card (app/widgets/tool_card.py)
            from .tool_card import ToolCard

            w = ToolCard(message, waiting=self.tool_waiting, dark=self.dark)
            w.decided.connect(self.toolDecided)
        else:
            w = MessageWidget(message, dark=self.dark, **kwargs)
            w.editSubmitted.connect(self.editSubmitted)
            w.regenerateRequested.connect(self.regenerateRequested)
            w.branchRequested.connect(self.branchRequested)
            w.versionRequested.connect(self.versionRequested)
            w.imageOpened.connect(self._open_image)
            w.sourceOpened.connect(lambda file, page, mid=message.id: self.open_source(mid, file, page))
            if message.id in self.open_thoughts:
                w.thought.user_chose = True
                w.thought.set_expanded(True)
            w.thought.chosen.connect(lambda on, mid=message.id: self._thought_chosen(mid, on))
            # a reply that only called tools: its cards below say it all
            if message.role == "assistant" and (getattr(message, "tool", None) or {}).get("calls") and not message.text.strip():
                w.hide()
        share_font(w, self.font())
        if at_top:  # an older message of a long chat (see _build_backlog)
            self.column.insertWidget(0, w)
            self.widgets.insert(0, w)
        else:
            self.column.insertWidget(self.column.count() - 2, w)  # before the notice and stretch
            self.widgets.append(w)
        return w

    def _thought_chosen(self, message_id: int, on: bool) -> None:
        (self.open_thoughts.add if on else self.open_thoughts.discard)(message_id)

    def set_streaming_note(self, text: str) -> None:
        """The status line of the reply being written ('writing… 12.3 tok/s')."""
        if self.streaming is not None:
            self.streaming.status.setText(text)
            self.streaming.status.setVisible(bool(text))

    def show_images_reading(self, done: int, total: int) -> None:
        """The reply being written waits for its images to be encoded (before the prompt)."""
        if self.streaming is not None:
            self.streaming.set_images_reading(done, total)

    def show_prompt_progress(self, read: int, total: int) -> None:
        """How much of its prompt the reply being written has read (before its first piece)."""
        if self.streaming is not None:
            self.streaming.set_prompt_progress(read, total)

    def stream_text(self, text: str) -> None:
        """The streaming reply's whole text so far (rendered at most every 50 ms)."""
        self._pending_text = text
        if not self._render_timer.isActive():
            self._render_timer.start()

    def stream_thought(self, text: str) -> None:
        """The streaming reply's thought so far (rendered with its text, at most every 50 ms)."""
        self._pending_thought = text
        if not self._render_timer.isActive():
            self._render_timer.start()

    def flush(self) -> None:
        self._render_timer.stop()
        self._render_pending()

    def _render_pending(self) -> None:
        if self.streaming is not None:
            if self._pending_thought is not None:  # the thought first: the answer's words fold it
                self.streaming.set_thought(self._pending_thought)
            if self._pending_text is not None:
                self.streaming.set_text(self._pending_text)
        self._pending_text = self._pending_thought = None

    def show_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))

    def show_queued(self, text: str, images: int, note: str) -> None:
        """A message sent before the model is ready: shown at once, with what it waits for
        (`note`); the saved message takes its place when the reply starts."""
        if self.queued is None:
            shown = text + (f"\n\n({images} image{'s' * (images != 1)} attached)" if images else "")
            message = SimpleNamespace(id=-1, role="user", text=shown, state="complete", finish_reason=None,
                                      images=[], versions=1, version=0, prompt_tokens=0)
            self.queued = MessageWidget(message, dark=self.dark, can_regenerate=False, busy=True)
            share_font(self.queued, self.font())
            self.column.insertWidget(self.column.count() - 2, self.queued)
        self.queued.status.setText(note)
        self.queued.status.setVisible(bool(note))

    def drop_queued(self) -> None:
        if self.queued is not None:
            self.column.removeWidget(self.queued)
            self.queued.hide()
            self._trash.append(self.queued)
            self.queued = None
            if not self._backlog_timer.isActive():
                self._backlog_timer.start()

    def open_source(self, reply_id: int, file: str, page: int) -> None:
        """A reply's source clicked: the PDF it names (the latest one of that name attached
        before the reply) opened at `page`."""
        document = None
        for message in self.messages:
            if message.id == reply_id:
                break
            document = next((d for d in getattr(message, "documents", None) or () if d.name == file), document)
        if document is None:
            self.show_notice(f"{file}: this chat no longer holds the document, so its page cannot be shown.")
            return
        viewer = DocumentPageViewer(document.path, document.name, page, self)
        viewer.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        viewer.show()
        self.last_viewer = viewer

    def _open_image(self, path: str, name: str) -> None:
        viewer = ImageViewer(path, name, self)
        viewer.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        viewer.show()
        self.last_viewer = viewer

    def _focus_moved(self, _old, new) -> None:
        """The actions of the message holding the keyboard focus are shown (Tab reaches them)."""
        for w in self.widgets:
            w.show_actions(w.hovered or (new is not None and w.isAncestorOf(new)))

    def _note_position(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 24

    def _keep_at_bottom(self, _lo: int, hi: int) -> None:
        bar = self.verticalScrollBar()
        if self._follow:
            bar.setValue(hi)
        elif self._grew_top:
            # Older messages grew the page above what is being read: keep it in place.
            bar.setValue(bar.value() + hi - self._last_max)
        self._grew_top = bool(self._backlog)
        self._last_max = hi
