"""The message composer: multi-line text (Enter sends, Shift+Enter starts a new line) and
images and documents attached by drag-and-drop, paste or the file button, each shown as a chip
(a thumbnail, or the document's name and pages) with a remove button.

A document (PDF, Word, HTML, CSV, text, Markdown, source: anything not an image by its name) is
read off the UI thread exactly as the engine will read it (engine/documents/extract.py): a file
that does not read (a corrupt PDF, a binary renamed .txt) is taken off again with its one
sentence, and a send waits for the reading as it waits for an image's decoding.

Every attachment is checked before it is accepted, reading only the file header: not an
image, an empty file, a file too big, or more pixels than the engine will decode all give a
message that names the file and says what is wrong, and nothing is attached. Then it is
decoded exactly as the engine will decode it (small images at once, larger ones off the UI
thread): a file whose header reads but whose pixels do not (truncated, corrupt) is refused or
taken off again with its error, so it never becomes part of a conversation (where every later
turn would fail on it). A send asked for while a check runs waits for it.
"""
from __future__ import annotations


import io
import warnings
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, QSize, Qt, Signal
from PySide6.QtGui import QImage, QImageReader, QPixmap
from PySide6.QtWidgets import (QFileDialog, QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QSizePolicy,
                               QToolButton, QVBoxLayout, QWidget)

from ...engine.api import DocumentPart, EngineError, ImagePart
from ..jobs import Jobs
from .icons import icon

MIN_THUMB_SIDE = 6  # px: a thumbnail thinner than this shows the size instead
MAX_IMAGE_BYTES = 50 << 20
DECODE_NOW_PIXELS = 1 << 20  # decoding this many pixels takes a few ms: done on attaching
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp)"
DOCUMENT_FILTER = ("Documents (*.pdf *.docx *.txt *.md *.html *.htm *.csv *.tsv *.json *.py *.js *.ts "
                   "*.c *.cpp *.h *.java *.go *.rs *.rb *.sh *.xml *.yaml *.yml *.toml)")
ALL_FILES_FILTER = "All files (*)"
THUMB = 56


class AttachmentError(ValueError):
    """An image the composer refuses; the message names the file and the reason."""


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the image header, without decoding pixels; None if unknown."""
    buffer = QBuffer()
    buffer.setData(QByteArray(data))
    buffer.open(QIODevice.OpenModeFlag.ReadOnly)
    reader = QImageReader(buffer)
    reader.setDecideFormatFromContent(True)
    size = reader.size() if reader.canRead() else None
    if size is not None and size.isValid():
        return size.width(), size.height()
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as img:  # lazy: parses the header only
                return img.size
    except Image.DecompressionBombError:
        return (1 << 30, 1 << 30)  # more pixels than anything we accept
    except Exception:  # noqa: BLE001 - Pillow raises many types on non-images
        return None


def check_image(data: bytes, name: str) -> tuple[int, int]:
    """(width, height) of image bytes, or AttachmentError. Reads the header only, so a
    decompression bomb costs nothing."""
    # The engine (torch) is imported after the window shows; by the first attachment the
    # worker has it, so this costs a lookup.
    from ...engine.mistral3.image import MAX_IMAGE_PIXELS

    if not data:
        raise AttachmentError(f"{name}: the file is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise AttachmentError(f"{name}: {len(data) / 1e6:.0f} MB is too big "
                              f"(images up to {MAX_IMAGE_BYTES >> 20} MB)")
    size = image_size(data)
    if size is None:
        raise AttachmentError(f"{name}: not an image (PNG, JPEG, WebP, GIF or BMP)")
    w, h = size
    if w < 1 or h < 1:
        raise AttachmentError(f"{name}: the image has no pixels ({w}×{h})")
    if w * h > MAX_IMAGE_PIXELS:
        shown = f"{w}×{h} pixels" if w < (1 << 30) else "the image"
        raise AttachmentError(
            f"{name}: {shown} is too large (at most {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels); "
            "shrink it first")
    return w, h


class PromptEdit(QPlainTextEdit):
    """Enter sends; Shift+Enter (or Ctrl+Enter in an IME) inserts a new line. Dropped or pasted
    images go to the composer instead of into the text."""

    submitted = Signal()
    imagesOffered = Signal(object)  # QMimeData

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setTabChangesFocus(True)
        self.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.setAccessibleName("Message")
        self.setObjectName("prompt")
        self.min_lines, self.max_lines = 2, 8
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self._fit_height()

    def _fit_height(self, *_args) -> None:
        """Grow with the text from 2 to 8 lines, then scroll."""
        line = self.fontMetrics().lineSpacing()
        lines = max(self.min_lines, min(self.max_lines, int(self.document().size().height())))
        margins = self.contentsMargins()
        frame = int(self.document().documentMargin() * 2) + margins.top() + margins.bottom()
        self.setFixedHeight(lines * line + frame)

    def changeEvent(self, event) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() == event.Type.FontChange:
            self._fit_height()

    def keyPressEvent(self, event) -> None:  # noqa: N802
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
                event.modifiers() & (Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.AltModifier)):
            self.submitted.emit()
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802
        return source.hasImage() or source.hasUrls() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802
        if source.hasImage() or (source.hasUrls() and any(u.isLocalFile() for u in source.urls())):
            self.imagesOffered.emit(source)
            return
        super().insertFromMimeData(source)

    def dragEnterEvent(self, event) -> None:  # noqa: N802
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()
        else:
            super().dragEnterEvent(event)

    def dragMoveEvent(self, event) -> None:  # noqa: N802
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()
        else:
            super().dragMoveEvent(event)

    def dropEvent(self, event) -> None:  # noqa: N802
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            self.imagesOffered.emit(event.mimeData())
            event.acceptProposedAction()
        else:
            super().dropEvent(event)


def image_tokens_of(size: tuple[int, int], geometry: tuple[int, int, int] | None) -> int | None:
    """The prompt tokens an image of `size` (width, height) takes with a vision tower of
    `geometry` (image_size, patch_size, merge): image.image_token_count. None without a tower."""
    if geometry is None:
        return None
    from ...engine.mistral3.image import image_token_count

    return image_token_count(size, *geometry)


class AttachmentChip(QFrame):
    removed = Signal(object)  # self

    def __init__(self, image: ImagePart, size: tuple[int, int], parent: QWidget | None = None):
        super().__init__(parent)
        self.image = image
        self.size_wh = size
        self.tokens: int | None = None  # what it takes of the context (set_tokens)
        self.setObjectName("attachment")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        picture = QLabel()
        picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        picture.setMinimumSize(THUMB // 2, THUMB // 2)  # a thin strip still makes a chip one can see
        pixmap = QPixmap()
        if min(size) * THUMB >= MIN_THUMB_SIDE * max(size) and pixmap.loadFromData(image.data):
            pixmap = pixmap.scaled(THUMB, THUMB, Qt.AspectRatioMode.KeepAspectRatio,
                                   Qt.TransformationMode.SmoothTransformation)
            picture.setPixmap(pixmap)
        else:  # undecodable here, or so thin its thumbnail would be a line: its size in words
            picture.setText(f"{size[0]}×{size[1]}")
            picture.setObjectName("statusLine")
        self.picture = picture
        picture.setToolTip(f"{image.name} ({size[0]}×{size[1]})")
        self.cost = QLabel()  # "1,540 tokens": the image's share of the context
        self.cost.setObjectName("statusLine")
        self.cost.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.cost.hide()
        self.remove_button = QToolButton()
        self.remove_button.setIcon(icon("close"))
        self.remove_button.setText("✕")
        self.remove_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        self.remove_button.setToolTip(f"Remove {image.name}")
        self.remove_button.setAccessibleName(f"Remove {image.name}")
        self.remove_button.setAutoRaise(True)
        self.remove_button.clicked.connect(lambda: self.removed.emit(self))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        column = QVBoxLayout()
        column.setSpacing(0)
        column.addWidget(picture)
        column.addWidget(self.cost)
        layout.addLayout(column)
        layout.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignTop)

    def set_tokens(self, tokens: int | None) -> None:
        """Show what the image costs in prompt tokens (None: not known, e.g. on a server)."""
        self.tokens = tokens
        self.cost.setVisible(tokens is not None)
        words = f"{tokens:,} tokens" if tokens is not None else ""
        self.cost.setText(words)
        w, h = self.size_wh
        self.picture.setToolTip(f"{self.image.name} ({w}×{h})" + (f": {words} of the context" if words else ""))


def is_image_name(name: str) -> bool:
    """Whether a file is attached as an image (by its name); any other file is a document."""
    return Path(name).suffix.lower() in IMAGE_SUFFIXES


def read_document(part: DocumentPart) -> DocumentPart:
    """The part with its text read, as the engine reads it (off the UI thread: a job)."""
    from ...engine.documents.prompt import read_document as engine_read

    return engine_read(part)


def document_tokens(part: DocumentPart, count_text) -> int | None:
    """The tokens a read document takes whole (its prompt block, engine/documents/block.py),
    by `count_text` (text -> tokens, the engine's); None without one. Run on the job pool."""
    if count_text is None or part.document is None:
        return None
    from ...engine.documents.block import document_block

    return count_text(document_block(part.document))


def document_modes(parts: list[DocumentPart], tokens: list[int | None], room: int | None) -> list[str | None]:
    """Whole or retrieved, by the engine's rule (retrieval.place_documents) for the room the
    context has left; None where it is not known (no room, or a document not counted yet)."""
    if room is None or not parts or any(t is None or p.document is None for p, t in zip(parts, tokens)):
        return [None] * len(parts)
    from ...engine.documents.block import document_block
    from ...engine.documents.retrieval import Budget, place_documents

    counted = {document_block(p.document): t for p, t in zip(parts, tokens)}  # counted once, off the UI thread
    return [pl.mode for pl in place_documents([p.document for p in parts], counted.__getitem__, Budget(room, 0, 0))]


def document_words(part: DocumentPart, tokens: int | None = None, mode: str | None = None) -> str:
    """'report.pdf · 12 pages · 8,120 tokens', 'notes.md · retrieval (5 excerpts)' (pages only
    where the file has them, the tokens a whole document takes, or how many excerpts a question
    brings in when it is too long for the context)."""
    from ...engine.documents.prompt import EXCERPTS

    document = part.document
    if document is None:
        return f"{part.name} · reading…"
    words = [part.name]
    if document.paged:
        pages = document.total_pages or len(document.pages)
        words.append(f"{pages} page{'s' * (pages != 1)}")
    if mode == "retrieved":
        words.append(f"retrieval ({EXCERPTS} excerpts)")
    elif tokens is not None:
        words.append(f"{tokens:,} tokens")
    return " · ".join(words)


class DocumentChip(QFrame):
    """An attached document: its name and pages, and a remove button."""

    removed = Signal(object)  # self

    def __init__(self, part: DocumentPart, parent: QWidget | None = None):
        super().__init__(parent)
        self.part = part
        self.tokens: int | None = None  # what it takes whole (set_part)
        self.mode: str | None = None  # "whole" / "retrieved" for the room left (set_mode)
        self.setObjectName("attachment")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.label = QLabel()
        self.label.setObjectName("documentChip")
        self.remove_button = QToolButton()
        self.remove_button.setIcon(icon("close"))
        self.remove_button.setText("✕")
        self.remove_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        self.remove_button.setToolTip(f"Remove {part.name}")
        self.remove_button.setAccessibleName(f"Remove {part.name}")
        self.remove_button.setAutoRaise(True)
        self.remove_button.clicked.connect(lambda: self.removed.emit(self))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 2, 2)
        layout.addWidget(self.label)
        layout.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignTop)
        self.set_part(part)

    def set_part(self, part: DocumentPart, tokens: int | None = None) -> None:
        """The part once read (its `document` set) and its tokens whole: the chip says its pages."""
        self.part = part
        self.tokens = tokens
        self._show()

    def set_mode(self, mode: str | None) -> None:
        self.mode = mode
        self._show()

    def _show(self) -> None:
        part = self.part
        self.label.setText(document_words(part, self.tokens, self.mode))
        notes = getattr(part.document, "notes", ()) or ()
        self.label.setToolTip("\n".join([part.name, *notes]))


class Composer(QFrame):
    """Text + attachments + Send / Stop / Regenerate. Emits `sendRequested(text, attachments)`:
    the images, then the documents (each read already: its `document` set)."""

    sendRequested = Signal(str, object)  # text, list[ImagePart | DocumentPart]
    stopRequested = Signal()
    regenerateRequested = Signal()
    folderUsed = Signal(str)  # the folder images were attached from (file dialogs start there)
    modelFileOffered = Signal(str)  # a .gguf dropped or chosen: the window offers to load it

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("composer")
        self.setAcceptDrops(True)
        self.images: list[ImagePart] = []
        self.chips: list[AttachmentChip] = []
        self.documents: list[DocumentPart] = []
        self.document_chips: list[DocumentChip] = []
        self.vision_enabled = True
        self.vision_hint = ""
        self.start_folder = ""  # where the attach dialog opens ('' the system's choice)
        self.jobs = Jobs(self)
        self.checking: set[str] = set()  # sha256 of attached images still being decoded, documents being read
        self.send_when_checked = False
        self.image_geometry: tuple[int, int, int] | None = None  # the loaded tower's (set_image_geometry)
        self.context_room: int | None = None  # tokens the open chat leaves in the context
        self.count_text = None  # text -> tokens, the engine's (set_token_counter): documents' cost

        self.edit = PromptEdit()
        self.edit.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.edit.submitted.connect(self.submit)
        self.edit.imagesOffered.connect(self.add_mime)
        self.attach_button = self._icon_button("attach", "Attach files")
        self.attach_button.clicked.connect(self.choose_files)
        self.send_button = self._icon_button("send", "Send", "Send the message (Enter)", "#ffffff")
        self.send_button.setObjectName("sendButton")
        self.send_button.clicked.connect(self.submit)
        self.stop_button = self._icon_button("stop", "Stop", "Stop the reply now (Esc); what was "
                                             "written is kept", "#ffffff")
        self.stop_button.setObjectName("sendButton")
        self.stop_button.clicked.connect(self.stopRequested)
        self.regenerate_button = self._icon_button("regenerate", "Regenerate",
                                                   "Write the last reply again (Ctrl+R)")
        self.regenerate_button.clicked.connect(self.regenerateRequested)
        self.message = QLabel()
        self.message.setObjectName("composerMessage")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message.hide()
        self.chip_row = QHBoxLayout()
        self.chip_row.setContentsMargins(0, 0, 0, 0)
        self.chip_row.addStretch(1)
        # What the images take together and what the context has left: a large photo took
        # ~2,350 of 4,096 tokens and nothing said so when it was attached.
        self.images_cost = QLabel()
        self.images_cost.setObjectName("statusLine")
        self.images_cost.setWordWrap(True)
        self.images_cost.hide()
        self.chip_row.addWidget(self.images_cost, 0, Qt.AlignmentFlag.AlignBottom)
        self.chip_box = QWidget()
        self.chip_box.setLayout(self.chip_row)
        self.chip_box.hide()

        # One rounded box, as in the chat apps people know: the images on top, then the
        # attach button, the text, Regenerate and Send (Stop in its place while a reply runs).
        self.box = QFrame()
        self.box.setObjectName("composerBox")
        row = QHBoxLayout()
        row.setSpacing(4)
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.edit, 1)
        row.addWidget(self.regenerate_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignBottom)
        inside = QVBoxLayout(self.box)
        inside.setContentsMargins(8, 6, 8, 6)
        inside.setSpacing(4)
        inside.addWidget(self.chip_box)
        inside.addLayout(row)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 4, 16, 12)
        layout.addWidget(self.message)
        layout.addWidget(self.box)
        self.set_busy(False)
        self.set_vision(True)

    def changeEvent(self, event) -> None:  # noqa: N802
        # A zoom set on the composer: the window's style sheet matches the message box, which
        # stops Qt's font inheritance there, so hand the font down.
        if event.type() == event.Type.FontChange:
            self.edit.setFont(self.font())
        if event.type() in (event.Type.PaletteChange, event.Type.ApplicationPaletteChange):
            for button, name in ((self.attach_button, "attach"), (self.regenerate_button, "regenerate")):
                button.setIcon(icon(name))  # drawn in the text colour of the new scheme
        super().changeEvent(event)

    # -- state from the window ------------------------------------------------------------------
    @staticmethod
    def _icon_button(name: str, text: str, tip: str = "", colour: str | None = None) -> QToolButton:
        button = QToolButton()
        button.setIcon(icon(name, colour))
        button.setIconSize(QSize(20, 20))
        button.setText(text)
        button.setAccessibleName(text)
        button.setToolTip(tip or text)
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        button.setAutoRaise(True)
        return button

    def set_busy(self, busy: bool, can_regenerate: bool = False) -> None:
        self.busy = busy
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self.send_button.setVisible(not busy)  # one place: Send, or Stop while a reply runs
        self.stop_button.setVisible(busy)
        self.regenerate_button.setEnabled(not busy and can_regenerate)

    def set_vision(self, enabled: bool, hint: str = "") -> None:
        self.vision_enabled = enabled
        self.vision_hint = hint
        # documents need no vision tower: the button stays, only what it offers changes
        self.attach_button.setToolTip("Attach images or documents (or drop / paste them here)" if enabled
                                      else "Attach documents (or drop / paste them here)" + (f". {hint}" if hint else ""))
        self.attach_button.setIcon(icon("attach"))  # the palette may have changed

    def set_image_geometry(self, geometry: tuple[int, int, int] | None) -> None:
        """The loaded vision tower's (image_size, patch_size, merge), for the chips' token cost."""
        if geometry != self.image_geometry:
            self.image_geometry = geometry
            for chip in self.chips:
                chip.set_tokens(image_tokens_of(chip.size_wh, geometry))
            self._show_images_cost()

    def set_context_room(self, tokens: int | None) -> None:
        """What the open chat leaves of the context (None: no local model's context to count)."""
        if tokens != self.context_room:
            self.context_room = tokens
            self._show_images_cost()

    def set_token_counter(self, count_text) -> None:
        """The engine's text -> tokens (engine/documents/prompt.token_counter over its
        count_tokens; None: none loaded), run on the job pool when a document is read."""
        self.count_text = count_text

    def _show_images_cost(self) -> None:
        """What the images and the whole documents take together, and what the context has
        left (one rule for both: the total against the room)."""
        costs = [c.tokens for c in self.chips if c.tokens is not None]
        room = self.context_room
        image_room = None if room is None else room - sum(costs)  # the documents get what the images leave
        modes = document_modes([c.part for c in self.document_chips], [c.tokens for c in self.document_chips],
                               image_room)
        for chip, mode in zip(self.document_chips, modes):
            chip.set_mode(mode)
        whole = [c.tokens for c, mode in zip(self.document_chips, modes) if c.tokens is not None and mode != "retrieved"]
        self.images_cost.setVisible(bool(costs or whole))
        if not costs and not whole:
            return
        total = sum(costs) + sum(whole)
        parts = []
        if costs:
            parts.append(f"{len(costs)} image{'s' * (len(costs) != 1)}: {sum(costs):,} tokens")
        if whole:
            parts.append(f"{len(whole)} document{'s' * (len(whole) != 1)}: {sum(whole):,} tokens")
        words = "; ".join(parts)
        if room is not None:
            words += (f" of the {room:,} the context has left" if total <= room else
                      f", more than the {room:,} the context has left")
        self.images_cost.setText(words)
        self.images_cost.setObjectName("errorLine" if room is not None and total > room else "statusLine")
        self.images_cost.style().unpolish(self.images_cost)
        self.images_cost.style().polish(self.images_cost)

    def show_message(self, text: str, error: bool = True) -> None:
        """A line above the composer: what went wrong (the theme's error colour), or a note on what
        was done (`error` False: the muted colour, e.g. how a reply's documents were read)."""
        self.message.setProperty("error", error)
        self.message.setObjectName("composerMessage" if error else "composerNote")
        self.message.style().unpolish(self.message)
        self.message.style().polish(self.message)
        self.message.setText(text)
        self.message.setVisible(bool(text))

    # -- attachments ----------------------------------------------------------------------------
    def add_image(self, image: ImagePart) -> bool:
        """Attach an image after checking it; False (and a message) when refused."""
        if not self.vision_enabled:
            self.show_message(self.vision_hint or "This model cannot read images.")
            return False
        try:
            size = check_image(image.data, image.name)
        except AttachmentError as exc:
            self.show_message(str(exc))
            return False
        if any(im.sha256 == image.sha256 for im in self.images):
            self.show_message(f"{image.name}: already attached", error=False)
            return False
        if size[0] * size[1] <= DECODE_NOW_PIXELS:
            from ...engine.mistral3.image import decode_image

            try:
                decode_image(image.data, image.name)
            except EngineError as exc:
                self.show_message(str(exc))
                return False
        chip = AttachmentChip(image, size)
        chip.set_tokens(image_tokens_of(size, self.image_geometry))
        chip.removed.connect(self.remove_chip)
        self.chip_row.insertWidget(len(self.chips), chip)  # before the documents, the stretch and the cost line
        self.chips.append(chip)
        self.images.append(image)
        self.chip_box.show()
        self._show_images_cost()
        if size[0] * size[1] > DECODE_NOW_PIXELS:
            self._decode_in_background(image)
        return True

    def _decode_in_background(self, image: ImagePart) -> None:
        from ...engine.mistral3.image import decode_image

        key = image.sha256
        self.checking.add(key)
        self.jobs.run(lambda: decode_image(image.data, image.name) and None,
                      lambda _result: self._decoded(key, None), lambda error: self._decoded(key, error))

    def _decoded(self, key: str, error: str | None) -> None:
        if error is not None:
            for chip in [c for c in self.chips if c.image.sha256 == key]:
                self.remove_chip(chip)
            self.show_message(error)
        self._checked(key, error)

    def _checked(self, key: str, error: str | None) -> None:
        """An image decoded or a document read: a send that waited for it goes now."""
        self.checking.discard(key)
        if error is not None:
            self.send_when_checked = False  # the user meant to send it with this attachment
        elif self.send_when_checked and not self.checking:
            self.send_when_checked = False
            self.submit()

    def add_attachment(self, part: ImagePart | DocumentPart) -> bool:
        """Attach an image or a document (a message handed back to the composer)."""
        return self.add_document(part) if isinstance(part, DocumentPart) else self.add_image(part)

    def add_document(self, part: DocumentPart) -> bool:
        """Attach a document; it is read on the job pool (its chip says so meanwhile) and taken
        off again with its one sentence if it does not read. False when refused at once."""
        if not part.data:
            self.show_message(f"{part.name}: the file is empty")
            return False
        if any(d.sha256 == part.sha256 for d in self.documents):
            self.show_message(f"{part.name}: already attached", error=False)
            return False
        chip = DocumentChip(part)
        chip.removed.connect(self.remove_document_chip)
        count_text = self.count_text
        self.chip_row.insertWidget(len(self.chips) + len(self.document_chips), chip)
        self.document_chips.append(chip)
        self.documents.append(part)
        self.chip_box.show()
        key = part.sha256
        self.checking.add(key)

        def read_and_count() -> tuple[DocumentPart, int | None]:
            read = read_document(part)
            return read, document_tokens(read, count_text)

        self.jobs.run(read_and_count, lambda done: self._document_read(key, done, None),
                      lambda error: self._document_read(key, None, error))
        return True

    def _document_read(self, key: str, done: tuple[DocumentPart, int | None] | None, error: str | None) -> None:
        for index, chip in enumerate(self.document_chips):
            if chip.part.sha256 == key and done is not None:
                chip.set_part(*done)
                self.documents[index] = done[0]
        self._show_images_cost()
        if error is not None:
            for chip in [c for c in self.document_chips if c.part.sha256 == key]:
                self.remove_document_chip(chip)
            self.show_message(error)
        self._checked(key, error)

    def remove_document_chip(self, chip: DocumentChip) -> None:
        index = self.document_chips.index(chip)
        self.document_chips.pop(index)
        self.documents.pop(index)
        self.chip_row.removeWidget(chip)
        chip.deleteLater()
        self.chip_box.setVisible(bool(self.chips or self.document_chips))
        self._show_images_cost()

    def add_files(self, paths: list[str]) -> int:
        """Attach image and document files; returns how many were accepted. Errors are shown, joined."""
        errors, added = [], 0
        models = [path for path in paths if Path(path).suffix.lower() == ".gguf" and Path(path).is_file()]
        for path in paths:
            p = Path(path)
            if path in models:
                continue  # a model, not an image: offered as the model (modelFileOffered)
            image_file = is_image_name(p.name)
            try:
                if p.is_dir():
                    raise AttachmentError(f"{p.name}: is a folder, not a file")
                limit, kind = (MAX_IMAGE_BYTES, "images") if image_file else (document_max_bytes(), "documents")
                if p.stat().st_size > limit:
                    raise AttachmentError(f"{p.name}: {p.stat().st_size / 1e6:.0f} MB is too big "
                                          f"({kind} up to {limit >> 20} MB)")
                data = p.read_bytes()
            except AttachmentError as exc:
                errors.append(str(exc))
                continue
            except OSError as exc:
                errors.append(f"{p.name}: cannot read: {exc.strerror or exc}")
                continue
            if self.add_image(ImagePart(data, p.name)) if image_file else self.add_document(DocumentPart(data, p.name)):
                added += 1
            elif self.message.isVisible():
                errors.append(self.message.text())
        if errors:
            self.show_message("\n".join(errors))
        elif added:
            self.show_message("")
        if models:
            self.modelFileOffered.emit(models[0])  # one model at a time
        return added

    def add_mime(self, mime: QMimeData) -> int:
        if mime.hasUrls() and any(u.isLocalFile() for u in mime.urls()):
            return self.add_files([u.toLocalFile() for u in mime.urls() if u.isLocalFile()])
        if mime.hasImage():
            image = QImage(mime.imageData())
            if image.isNull():
                self.show_message("The pasted data is not an image")
                return 0
            ba = QByteArray()
            buf = QBuffer(ba)
            buf.open(QIODevice.OpenModeFlag.WriteOnly)
            image.save(buf, "PNG")
            added = int(self.add_image(ImagePart(bytes(ba.data()), "pasted.png")))
            if added:
                self.show_message("")
            return added
        self.show_message("Only files and images can be attached")
        return 0

    def remove_chip(self, chip: AttachmentChip) -> None:
        index = self.chips.index(chip)
        self.chips.pop(index)
        self.images.pop(index)
        self.chip_row.removeWidget(chip)
        chip.deleteLater()
        self.chip_box.setVisible(bool(self.chips or self.document_chips))
        self._show_images_cost()

    def clear_images(self) -> None:
        """Take every attachment off: images and documents."""
        for chip in list(self.chips):
            self.remove_chip(chip)
        for chip in list(self.document_chips):
            self.remove_document_chip(chip)

    def choose_files(self) -> None:
        patterns = lambda f: f[f.index("(") + 1:-1]  # noqa: E731 - "*.png *.jpg ..."
        both = f"Images and documents ({patterns(IMAGE_FILTER)} {patterns(DOCUMENT_FILTER)})"
        filters = [both, DOCUMENT_FILTER, IMAGE_FILTER] if self.vision_enabled else [DOCUMENT_FILTER]
        filters.append(ALL_FILES_FILTER)
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files", self.start_folder, ";;".join(filters))
        if paths:
            self.start_folder = str(Path(paths[0]).parent)  # the next dialog starts there
            self.folderUsed.emit(self.start_folder)
            self.add_files(paths)

    # -- drag and drop on the whole composer ----------------------------------------------------
    def dragEnterEvent(self, event) -> None:  # noqa: N802
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:  # noqa: N802
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        self.add_mime(event.mimeData())
        event.acceptProposedAction()

    # -- sending --------------------------------------------------------------------------------
    def submit(self) -> None:
        if self.busy:
            return
        text = self.edit.toPlainText()
        if not text.strip() and not self.images and not self.documents:
            return
        if self.checking:
            self.send_when_checked = True
            return
        self.sendRequested.emit(text, [*self.images, *self.documents])

    def accepted(self) -> None:
        """The window took the message: empty the composer."""
        self.edit.clear()
        self.clear_images()
        self.show_message("")


def document_max_bytes() -> int:
    """The largest document read (engine/documents' limit), checked before the file is read."""
    from ...engine.documents.document import MAX_BYTES

    return MAX_BYTES


__all__ = ["AttachmentError", "Composer", "DocumentChip", "PromptEdit", "check_image", "is_image_name",
           "IMAGE_FILTER", "DOCUMENT_FILTER"]
