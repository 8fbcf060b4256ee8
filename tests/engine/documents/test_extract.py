"""Extraction of PDFs written by fpdf2 (a PDF library nobody here wrote) and of text files: page
text with numbers, scans marked, and hostile files refused in one sentence, bounded in time."""
import io
import threading
import time

import pytest

from tramontane.engine.documents.extract import DocumentError, Limits, extract

from support.documents import text_pdf as make_pdf

fpdf = pytest.importorskip("fpdf")


def make_scanned_pdf() -> bytes:
    from PIL import Image

    image = io.BytesIO()
    Image.new("RGB", (200, 100), (250, 250, 250)).save(image, format="PNG")
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.image(io.BytesIO(image.getvalue()), x=10, y=10, w=100)
    return bytes(pdf.output())


def test_pdf_pages_keep_their_text_and_numbers():
    doc = extract(make_pdf(["The ferry leaves at noon.", "Lighthouse keeper Ada Vance."]), "notes.pdf")
    assert [p.number for p in doc.pages] == [1, 2]
    assert "ferry leaves at noon" in doc.pages[0].text
    assert "Ada Vance" in doc.pages[1].text and "ferry" not in doc.pages[1].text
    assert doc.scanned_pages == []


def test_an_image_only_page_is_marked_as_a_scan():
    doc = extract(make_scanned_pdf(), "scan.pdf")
    assert doc.scanned_pages == [1] and doc.pages[0].text.strip() == ""


def test_an_encrypted_pdf_is_one_sentence():
    with pytest.raises(DocumentError, match=r"^secret\.pdf: the PDF is encrypted with a password"):
        extract(make_pdf(["hidden"], password="pw"), "secret.pdf")


def test_a_corrupt_pdf_is_one_sentence():
    data = make_pdf(["x"])
    with pytest.raises(DocumentError, match=r"^broken\.pdf: the file is not a readable PDF"):
        extract(data[: len(data) // 3], "broken.pdf")


def test_a_2000_page_pdf_is_read_up_to_the_page_cap_and_says_so():
    data = make_pdf([f"page {n}" for n in range(1, 2001)])
    started = time.monotonic()
    doc = extract(data, "big.pdf")
    assert time.monotonic() - started < 30.0
    assert [p.number for p in doc.pages] == list(range(1, 1001)) and "page 1000" in doc.pages[-1].text
    assert doc.total_pages == 2000
    assert doc.notes == ("big.pdf: only its first 1000 of 2000 pages were read (a document may have at most 1000).",)
    small = extract(data, "big.pdf", Limits(max_pages=3))
    assert len(small.pages) == 3 and small.total_pages == 2000


def test_the_time_budget_and_cancel_are_checked_between_pages():
    data = make_pdf(["page"] * 20)
    with pytest.raises(DocumentError, match="took longer than 0 s"):
        extract(data, "slow.pdf", Limits(time_budget_s=0.0))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(DocumentError, match="^c.pdf: reading the document was cancelled"):
        extract(data, "c.pdf", cancel=cancel)


def test_a_binary_renamed_txt_is_one_sentence():
    with pytest.raises(DocumentError, match=r"^photo\.txt: the file is a PNG image, not a document"):
        extract(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(100), "photo.txt")
    with pytest.raises(DocumentError, match=r"^blob\.txt: the file holds binary data, not text"):
        extract(b"\x01\x02\x00\x03" + bytes(100), "blob.txt")
    assert extract("héllo\r\nworld".encode(), "a.md").pages[0].text == "héllo\nworld"


def test_a_file_over_the_byte_cap_is_refused():
    with pytest.raises(DocumentError, match=r"^a\.txt: the file is .* MiB, more than"):
        extract(b"a" * 2048, "a.txt", Limits(max_bytes=1024))
