"""Documents in the real window (issue 37): a PDF that fpdf2 writes, dropped on the composer, is
read off the UI thread into a chip (name, pages), and its text reaches the prompt ids the engine
decodes from; the message is stored with it (a content-addressed file, as images are), comes back
after a restart, and goes with its chat, its retrieval index too. Hostile files (a program renamed
.txt, a corrupt PDF) say their one sentence and nothing else in the composer is lost."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")
pytest.importorskip("fpdf")

from tramontane.app.store import Store  # noqa: E402
from tramontane.engine.api import DocumentPart  # noqa: E402

from support.app_window import PromptRecorder, close_window, drop_files, make_window, png_bytes, send, wait_read  # noqa: E402
from support.documents import text_pdf  # noqa: E402

PLANTED = "The lighthouse keeper's cat is named Sardine."


@pytest.fixture
def window(qtbot, tmp_path, isolated):
    w = make_window(qtbot, tmp_path / "data", mmproj=False)  # documents need no vision tower
    yield w
    close_window(w)


def test_a_dropped_pdf_reaches_the_prompt_and_is_stored_with_its_chat(qtbot, window, tmp_path):
    data = text_pdf(["Chapter one: the coast road.", f"Chapter two. {PLANTED}"])
    path = tmp_path / "report.pdf"
    path.write_bytes(data)
    recorder = PromptRecorder(window.worker.engine)
    placed = []
    window.worker.documentsPlaced.connect(lambda _rid, prompt: placed.append(prompt))

    drop_files(window.composer, [path])
    wait_read(qtbot, window)
    [chip] = window.composer.document_chips
    from tramontane.engine.documents.block import document_block
    from tramontane.engine.documents.prompt import token_counter

    tokens = token_counter(window.worker.engine.count_tokens)(document_block(window.composer.documents[0].document))
    assert chip.label.text() == f"report.pdf · 2 pages · {tokens:,} tokens"  # the loaded model's count
    assert window.composer.documents[0].document is not None  # read on the job pool

    send(qtbot, window, "What is the cat called?")
    assert not window.composer.document_chips  # sent: the composer is empty again
    prompt_text = recorder.text()
    assert PLANTED in prompt_text and "What is the cat called?" in prompt_text
    assert prompt_text.index(PLANTED) < prompt_text.index("What is the cat called?")
    sha = DocumentPart(data, "report.pdf").sha256
    assert placed and placed[-1].mode_of(sha) == "whole"
    assert window.composer.message.text() == "report.pdf: read whole"  # the mode, said in the window

    chat_id = window.session.current_chat_id
    stored = window.store.get_chat(chat_id).messages[0]
    assert [d.name for d in stored.documents] == ["report.pdf"] and not stored.images
    assert stored.documents[0].path.read_bytes() == data
    assert stored.documents[0].path.stat().st_mode & 0o077 == 0  # the user's alone

    from PySide6.QtWidgets import QToolButton
    shown = [b.text() for b in window.view.findChildren(QToolButton) if b.accessibleName() == "Document report.pdf"]
    assert shown == ["📄 report.pdf"]  # the sent message says what it carried

    # A second question: the document is in the prompt once, where it was attached.
    send(qtbot, window, "And the road?")
    assert recorder.text().count(PLANTED) == 1

    # After a restart the chat comes back with its document, in the engine's form.
    data_dir = window.store.data_dir
    file = stored.documents[0].path
    close_window(window)
    store = Store(data_dir)
    try:
        message = store.get_chat(chat_id).messages[0]
        [part] = store.to_chat_message(message).documents
        assert (part.data, part.name) == (data, "report.pdf")
        store.delete_chat(chat_id)
        assert not file.exists()  # deleting the chat deleted its document
    finally:
        store.close()


def test_hostile_files_say_their_sentence_and_the_rest_stays(qtbot, window, tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# Plan\n\nBuy rope.\n")
    program = tmp_path / "readme.txt"
    program.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(200))
    corrupt = tmp_path / "broken.pdf"
    corrupt.write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >>\ntruncated")
    composer = window.composer
    composer.edit.setPlainText("keep this text")
    assert composer.add_files([str(notes)]) == 1
    wait_read(qtbot, window)

    composer.add_files([str(program)])
    wait_read(qtbot, window)
    assert "readme.txt" in composer.message.text() and "program (ELF)" in composer.message.text()
    composer.add_files([str(corrupt)])
    wait_read(qtbot, window)
    assert "broken.pdf" in composer.message.text()
    assert [c.part.name for c in composer.document_chips] == ["notes.md"]
    assert composer.edit.toPlainText() == "keep this text" and window.isVisible()


def test_a_document_removed_before_sending_is_not_sent(qtbot, window, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(PLANTED)
    recorder = PromptRecorder(window.worker.engine)
    window.composer.add_files([str(notes)])
    wait_read(qtbot, window)
    window.composer.document_chips[0].remove_button.click()
    assert not window.composer.documents and not window.composer.chip_box.isVisible()
    send(qtbot, window, "hello")
    assert PLANTED not in recorder.text()
    assert not window.store.get_chat(window.session.current_chat_id).messages[0].documents


def test_an_image_and_a_document_go_together(qtbot, tmp_path, isolated):
    w = make_window(qtbot, tmp_path / "data", mmproj=True)
    try:
        image, notes = tmp_path / "photo.png", tmp_path / "notes.md"
        image.write_bytes(png_bytes(24, 16))
        notes.write_text(f"# Notes\n\n{PLANTED}\n")
        recorder = PromptRecorder(w.worker.engine)
        assert w.composer.add_files([str(image), str(notes)]) == 2
        wait_read(qtbot, w)
        send(qtbot, w, "Describe both.")
        assert PLANTED in recorder.text()
        stored = w.store.get_chat(w.session.current_chat_id).messages[0]
        assert [i.name for i in stored.images] == ["photo.png"] and [d.name for d in stored.documents] == ["notes.md"]

        # The chat's retrieval index (made on its first document, 0600) and files go with the chat.
        chat_id = w.session.current_chat_id
        index = w.worker.document_index_path(str(chat_id))
        assert index.is_file() and index.stat().st_mode & 0o077 == 0
        files = [stored.images[0].path, stored.documents[0].path]
        assert w.session.delete_chat(chat_id)
        qtbot.waitUntil(lambda: not index.exists(), timeout=10000)
        assert not any(f.exists() for f in files)
    finally:
        close_window(w)


def test_a_message_that_cannot_be_saved_gives_its_document_back(qtbot, window, tmp_path, monkeypatch):
    from tramontane.app.store import StoreError

    notes = tmp_path / "notes.md"
    notes.write_text(f"# Notes\n\n{PLANTED}\n")
    window.composer.add_files([str(notes)])
    wait_read(qtbot, window)

    def full_disk(*_args, **_kwargs):
        raise StoreError("the disk is full")
    monkeypatch.setattr(window.store, "add_message", full_disk)
    window.composer.edit.setPlainText("keep me")
    with qtbot.waitSignal(window.worker.failed, timeout=30000):
        window.composer.submit()
    qtbot.waitUntil(lambda: bool(window.composer.document_chips), timeout=10000)
    wait_read(qtbot, window)
    assert [d.name for d in window.composer.documents] == ["notes.md"]
    assert window.composer.edit.toPlainText() == "keep me"


def test_a_stored_document_that_no_longer_reads_fails_the_reply_in_one_sentence(qtbot, window):
    """A chat imported or made elsewhere may hold a file the composer would have refused: the
    reply fails with the reader's sentence, and the chat and its messages stay."""
    from support.app_window import open_stored_chat

    bad = DocumentPart(b"\x7fELF\x02\x01\x01" + bytes(64), "tool.txt")
    chat_id = open_stored_chat(window, "old", "What does it do?", "No idea.", [bad])
    failures = []
    window.worker.failed.connect(lambda _rid, words: failures.append(words))
    window.composer.edit.setPlainText("Try again")
    with qtbot.waitSignal(window.worker.failed, timeout=30000):
        window.composer.submit()
    qtbot.waitUntil(lambda: bool(failures) and window.session.pending is None, timeout=5000)
    assert failures[-1].startswith("tool.txt: the file is a program (ELF)")
    messages = window.store.get_chat(chat_id).messages
    assert [m.text for m in messages][:3] == ["What does it do?", "No idea.", "Try again"]
    assert window.isVisible()
