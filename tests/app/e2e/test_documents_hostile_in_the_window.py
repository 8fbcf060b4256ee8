"""Word files, scanned pages and hostile documents in the real window (issue 37's Done-when: the
library tests read them, these drop them on the window as a user does). A DOCX reaches the
prompt; a scanned page is read by the vision tower when the model has one and named in one
sentence when it has not; an encrypted PDF, a DOCX zip bomb and a 2,000-page PDF, each dropped
into a chat that already holds a message and an attached document, say their one sentence (or
the chip says what was read), in bounded time and memory, and the chat goes on: the earlier
message, the other attachment and the typed words stay, and the next message is answered.
Files are made here by fpdf2 and python-docx (support.documents)."""
from __future__ import annotations

import time
import tracemalloc

import pytest

pytest.importorskip("pytestqt")
pytest.importorskip("fpdf")
pytest.importorskip("docx")

from support.app_window import PromptRecorder, close_window, drop_files, make_window, send, wait_read  # noqa: E402
from support.documents import docx_bomb, docx_bytes, scanned_pdf, text_pdf  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")
PLANTED = "The lighthouse keeper's cat is named Sardine."
TYPED = "keep this text"


@pytest.fixture
def window(qtbot, tmp_path):
    """The tiny model without its vision tower: documents need none."""
    w = make_window(qtbot, tmp_path / "data", mmproj=False)
    yield w
    close_window(w)


def drop(qtbot, window, path, data: bytes, timeout_ms: int = 30000) -> float:
    """`data` written to `path` and dropped on the composer; the seconds until it was read."""
    path.write_bytes(data)
    started = time.monotonic()
    drop_files(window.composer, [path])
    wait_read(qtbot, window, timeout_ms)
    return time.monotonic() - started


def chat_in_progress(qtbot, window, tmp_path) -> PromptRecorder:
    """A chat with one question answered, notes.md attached to the next and words typed: what a
    hostile file dropped now must leave as it was."""
    recorder = PromptRecorder(window.worker.engine)
    send(qtbot, window, "First question")
    drop(qtbot, window, tmp_path / "notes.md", f"# Notes\n\n{PLANTED}\n".encode())
    window.composer.edit.setPlainText(TYPED)
    return recorder


def assert_the_chat_goes_on(qtbot, window, recorder: PromptRecorder) -> None:
    """The window is up, the other attachment and the typed words are still in the composer,
    the earlier message is still in the chat, and sending answers with notes.md in the prompt."""
    composer = window.composer
    assert window.isVisible()
    assert [c.part.name for c in composer.document_chips] == ["notes.md"]
    assert composer.edit.toPlainText() == TYPED
    chat_id = window.session.current_chat_id
    assert [m.text for m in window.store.get_chat(chat_id).messages][:1] == ["First question"]
    assert [w.message.text for w in window.view.widgets][:1] == ["First question"]
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        composer.submit()
    assert PLANTED in recorder.text() and TYPED in recorder.text()
    sent = window.store.get_chat(chat_id).messages
    assert [m.text for m in sent][0::2] == ["First question", TYPED]
    assert [d.name for d in sent[2].documents] == ["notes.md"]


def test_a_word_file_reaches_the_prompt(qtbot, window, tmp_path):
    recorder = PromptRecorder(window.worker.engine)
    drop(qtbot, window, tmp_path / "report.docx", docx_bytes())
    [chip] = window.composer.document_chips
    assert chip.label.text().startswith("report.docx · ") and chip.label.text().endswith(" tokens")
    assert "page" not in chip.label.text()  # a Word file has no pages to count
    send(qtbot, window, "Who keeps the light?")
    prompt = recorder.text()
    for line in ("# Harbour report", "- Ada Vance keeps the light.", "| Ada | Keeper | Night |", "After the tables."):
        assert line in prompt
    assert prompt.index("After the tables.") < prompt.index("Who keeps the light?")
    assert window.composer.message.text() == "report.docx: read whole"
    stored = window.store.get_chat(window.session.current_chat_id).messages[0]
    assert [d.name for d in stored.documents] == ["report.docx"]


def test_a_scanned_page_is_read_by_the_vision_tower(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path / "data", mmproj=True)
    try:
        recorder = PromptRecorder(w.worker.engine)
        drop(qtbot, w, tmp_path / "letter.pdf", scanned_pdf(1, text_page=True))
        assert w.composer.document_chips[0].label.text().startswith("letter.pdf · 2 pages · ")
        send(qtbot, w, "What does the letter say?")
        prompt = recorder.prompts[-1]
        # The scan went to the tower as the page's image, in the document's place; the typed page as text.
        assert [span.image.name for span in prompt.image_spans] == ["letter.pdf, page 1"]
        text = recorder.text()
        assert "[a scanned page: its image is attached]" in text and "typed page" in text
        assert w.composer.message.text() == "letter.pdf: read whole"  # no sentence about the scan
        stored = w.store.get_chat(w.session.current_chat_id).messages[0]
        assert [d.name for d in stored.documents] == ["letter.pdf"] and not stored.images  # the file, not its page
    finally:
        close_window(w)


def test_a_scanned_page_without_a_vision_tower_is_named_in_one_sentence(qtbot, window, tmp_path):
    recorder = PromptRecorder(window.worker.engine)
    drop(qtbot, window, tmp_path / "scan.pdf", scanned_pdf(1, text_page=True))
    send(qtbot, window, "What does it say?")
    assert window.composer.message.text().split("\n") == [
        "scan.pdf: read whole",
        "scan.pdf: page 1 is a scan without a text layer, and this model has no vision tower to read them."]
    assert not recorder.prompts[-1].image_spans
    assert "[a scanned page without a text layer: not read]" in recorder.text() and "typed page" in recorder.text()
    assert window.isVisible()


def test_an_encrypted_pdf_says_so_and_the_chat_goes_on(qtbot, window, tmp_path):
    recorder = chat_in_progress(qtbot, window, tmp_path)
    seconds = drop(qtbot, window, tmp_path / "secret.pdf", text_pdf(["hidden"], password="pw"))
    assert window.composer.message.text() == "secret.pdf: the PDF is encrypted with a password, so its text cannot be read."
    assert seconds < 10.0
    assert_the_chat_goes_on(qtbot, window, recorder)


def test_a_docx_zip_bomb_is_refused_unopened_and_the_chat_goes_on(qtbot, window, tmp_path):
    recorder = chat_in_progress(qtbot, window, tmp_path)
    bomb = docx_bomb(64 * 2**20)
    assert len(bomb) < 2**20
    tracemalloc.start()
    try:
        seconds = drop(qtbot, window, tmp_path / "bomb.docx", bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert window.composer.message.text().startswith(
        "bomb.docx: its part word/media/image1.png unpacks to ") and "as a zip bomb does" in window.composer.message.text()
    assert seconds < 10.0 and peak < 16 * 2**20  # the 64 MiB were never inflated
    assert_the_chat_goes_on(qtbot, window, recorder)


def test_a_2000_page_pdf_is_read_to_the_page_cap_and_the_chat_goes_on(qtbot, window, tmp_path):
    recorder = chat_in_progress(qtbot, window, tmp_path)
    seconds = drop(qtbot, window, tmp_path / "big.pdf", text_pdf([f"page {n}" for n in range(1, 2001)]), 120000)
    assert seconds < 90.0  # 1000 pages read on two shared cores
    chips = window.composer.document_chips
    assert [c.part.name for c in chips] == ["notes.md", "big.pdf"]
    assert chips[1].label.text().startswith("big.pdf · 2000 pages · ")
    read = window.composer.documents[1].document
    assert len(read.pages) == 1000 and read.total_pages == 2000  # the page cap, hit
    cap = "big.pdf: only its first 1000 of 2000 pages were read (a document may have at most 1000)."
    assert cap in chips[1].label.toolTip()
    chips[1].remove_button.click()  # the user takes it off again; notes.md and the words stay
    assert_the_chat_goes_on(qtbot, window, recorder)


def test_a_2000_page_pdf_sent_says_what_was_read(qtbot, window, tmp_path):
    """Sent, the page cap is said beside the mode, and the reply is written."""
    recorder = PromptRecorder(window.worker.engine)
    pages = [f"page {n}" for n in range(1, 2001)]
    pages[499] = f"page 500. {PLANTED}"
    drop(qtbot, window, tmp_path / "big.pdf", text_pdf(pages), 120000)
    send(qtbot, window, "What is the cat of the lighthouse keeper named?")
    said = window.composer.message.text().split("\n")
    assert said[0] == "big.pdf: searched (too long to read whole)"
    assert "big.pdf: only its first 1000 of 2000 pages were read (a document may have at most 1000)." in said
    assert "Sardine" in recorder.text()  # the page that holds it was retrieved
    assert window.isVisible()
