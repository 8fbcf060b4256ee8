"""A reply's sources open the document at their page, and a branch keeps its documents, on the
real window (issue 37). A 40-page PDF (fpdf2) is too long for the tiny model's context, so a
question retrieves its excerpts; the page the planted fact is on is listed under the reply, and
clicking it shows that page of the chat's copy of the PDF, rendered (compared here with PDFium's
own rendering of it), with the next page a click away and the whole file opened in the system's
viewer on request. A chat whose message carries a document, branched at its reply, still has
that document: read whole it is in the branch's next prompt; searched, the branch builds its own
index at its first question and retrieves from it."""
from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("pytestqt")
pytest.importorskip("fpdf")
pdfium = pytest.importorskip("pypdfium2")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402

from support.app_window import PromptRecorder, close_window, drop_files, make_window, send, wait_read  # noqa: E402
from support.documents import text_pdf  # noqa: E402
from tramontane.app.widgets import chat_view  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")
PAGES, FACT_PAGE = 40, 23
FACT = "The harbour master's parrot is called Marmalade."
QUESTION = "What is the harbour master's parrot called?"
SYLLABLES = ["ka", "ro", "mi", "tel", "an", "su", "dor", "vi", "len", "pa", "qua", "ris", "to", "bel", "nu"]


def long_pdf() -> bytes:
    """PAGES pages of made-up words, FACT on page FACT_PAGE."""
    rng = random.Random(37)
    pages = [" ".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(120)) + "."
             for _ in range(PAGES)]
    pages[FACT_PAGE - 1] = f"{FACT} {pages[FACT_PAGE - 1]}"  # first: the small context cuts excerpts short
    return text_pdf(pages, font_size=10, line=5)


@pytest.fixture
def window(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path / "data", mmproj=False)  # the tiny model: a 512-token context
    yield w
    close_window(w)


def reply_widget(qtbot, window, reply_id: int, sources: bool = True):
    """The finished reply's widget (the view redraws the reply once it is saved, with its
    sources when it has some)."""
    def finished():
        shown = [w for w in window.view.widgets if w.message.id == reply_id]
        done = shown and shown[0].message.state != "streaming" and (shown[0].sources_label.isVisible() or not sources)
        return shown[0] if done else None
    qtbot.waitUntil(lambda: finished() is not None, timeout=5000)
    return finished()


def rgb(image: QImage) -> np.ndarray:
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    rows = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.bytesPerLine())
    return rows[:, :image.width() * 3].reshape(image.height(), image.width(), 3).astype(np.int16)


def pdfium_page(data: bytes, number: int, width: int, height: int) -> np.ndarray:
    """PDFium's own rendering of page `number` at width x height (not the app's code)."""
    page = pdfium.PdfDocument(data)[number - 1]
    w, h = page.get_size()
    image = page.render(scale=min(width / w, height / h)).to_pil().convert("RGB").resize((width, height))
    return np.asarray(image).astype(np.int16)


def click_link(qtbot, label, href: str) -> None:
    """Tab from link to link inside the label, as the keyboard does, and press Enter on `href`."""
    activated = []
    label.linkActivated.connect(activated.append)
    label.setFocus()
    for _ in range(label.text().count("<a ")):
        qtbot.keyClick(label, Qt.Key.Key_Tab)
        qtbot.keyClick(label, Qt.Key.Key_Return)
        if activated and activated[-1] == href:
            return
    raise AssertionError(f"no link {href} in {label.text()!r} (pressed: {activated})")


def test_a_source_opens_the_document_at_its_page(qtbot, window, tmp_path, monkeypatch):
    data = long_pdf()
    name = "harbour <draft> & co.pdf"  # a name the rich-text line must escape
    path = tmp_path / name
    path.write_bytes(data)
    drop_files(window.composer, [path])
    wait_read(qtbot, window)
    reply_id = send(qtbot, window, QUESTION)
    w = reply_widget(qtbot, window, reply_id)
    cited = [(s.file, s.page) for s in w.sources]
    assert (name, FACT_PAGE) in cited, cited
    assert w.sources_text.startswith(f"Sources: {name} p. ")
    assert "harbour &lt;draft&gt; &amp; co.pdf <a href=" in w.sources_label.text()

    opened = []
    monkeypatch.setattr(chat_view, "QDesktopServices", type("Desktop", (), {"openUrl": staticmethod(opened.append)}))
    click_link(qtbot, w.sources_label, f"{chat_view.SOURCE_SCHEME}:{cited.index((name, FACT_PAGE))}")
    viewer = window.view.last_viewer
    assert isinstance(viewer, chat_view.DocumentPageViewer) and viewer.isVisible()
    qtbot.waitUntil(lambda: not viewer.pixmap.isNull(), timeout=10000)  # rendered off the UI thread
    assert viewer.windowTitle() == f"{name} — page {FACT_PAGE}"
    assert viewer.page_label.text() == f"Page {FACT_PAGE} of {PAGES}"
    shown = rgb(viewer.pixmap.toImage())
    height, width = shown.shape[:2]
    assert max(width, height) == chat_view.PAGE_SIDE
    assert np.abs(shown - pdfium_page(data, FACT_PAGE, width, height)).mean() < 2.0  # that page
    assert np.abs(shown - pdfium_page(data, FACT_PAGE - 1, width, height)).mean() > 2 * np.abs(
        shown - pdfium_page(data, FACT_PAGE, width, height)).mean() + 0.5  # not its neighbour

    viewer.next_button.click()
    qtbot.waitUntil(lambda: not viewer.pixmap.isNull(), timeout=10000)
    assert viewer.windowTitle() == f"{name} — page {FACT_PAGE + 1}"
    assert np.abs(rgb(viewer.pixmap.toImage()) - pdfium_page(data, FACT_PAGE + 1, width, height)).mean() < 2.0
    viewer.open_button.click()
    stored = window.store.get_chat(window.session.current_chat_id).messages[0].documents[0]
    assert [u.toLocalFile() for u in opened] == [str(stored.path)]  # the chat's copy, whole
    assert window.isVisible()


def branch_at(qtbot, window, reply_id: int) -> int:
    """Press the reply's Branch button; the branch's chat id, opened."""
    original = window.session.current_chat_id
    w = reply_widget(qtbot, window, reply_id, sources=False)
    w.show_actions(True)  # the pointer over the message shows its buttons
    w.buttons["branch"].click()
    qtbot.waitUntil(lambda: window.session.current_chat_id not in (None, original), timeout=5000)
    branch = window.session.current_chat_id
    assert window.store.get_chat_info(branch).title.startswith("Branch: ")
    return branch


def test_a_branch_keeps_a_document_read_whole(qtbot, window, tmp_path):
    recorder = PromptRecorder(window.worker.engine)
    notes = tmp_path / "notes.md"
    notes.write_text(f"# Harbour\n\n{FACT}\n")
    drop_files(window.composer, [notes])
    wait_read(qtbot, window)
    reply_id = send(qtbot, window, QUESTION)
    branch = branch_at(qtbot, window, reply_id)
    placed = []
    window.worker.documentsPlaced.connect(lambda _rid, prompt: placed.append(prompt))
    send(qtbot, window, "And who feeds it?")
    prompt = recorder.text()
    assert prompt.count(FACT) == 1 and prompt.index(FACT) < prompt.index(QUESTION) < prompt.index("And who feeds it?")
    assert [p.mode for p in placed[-1].placements.values()] == ["whole"]
    messages = window.store.get_chat(branch).messages
    assert [d.name for d in messages[0].documents] == ["notes.md"] and len(messages) == 4


def test_a_branch_keeps_a_searched_document_and_builds_its_own_index(qtbot, window, tmp_path):
    recorder = PromptRecorder(window.worker.engine)
    path = tmp_path / "report.pdf"
    path.write_bytes(long_pdf())
    drop_files(window.composer, [path])
    wait_read(qtbot, window)
    reply_id = send(qtbot, window, "Which boats are in the harbour?")
    original = window.session.current_chat_id
    assert window.worker.document_index_path(str(original)).is_file()
    branch = branch_at(qtbot, window, reply_id)
    index = window.worker.document_index_path(str(branch))
    assert not index.exists()  # an index is a cache: the branch builds its own at its first question
    placed = []
    window.worker.documentsPlaced.connect(lambda _rid, prompt: placed.append(prompt))
    reply_id = send(qtbot, window, QUESTION)
    assert [p.mode for p in placed[-1].placements.values()] == ["retrieved"]
    assert FACT in " ".join(recorder.text().split())  # the page that holds it, retrieved in the branch
    assert index.is_file()
    assert ("report.pdf", FACT_PAGE) in [(s.file, s.page) for s in reply_widget(qtbot, window, reply_id).sources]
