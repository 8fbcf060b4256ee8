"""OpenAI's `file` content parts, written as the official client's docs show them, read through
the same extraction; malformed parts in one sentence, the size capped before decoding."""
import base64

import pytest

from tramontane.engine.documents.document import DocumentError, Limits
from tramontane.engine.documents.file_parts import document_from_file_part

fpdf = pytest.importorskip("fpdf")


def pdf_bytes(text: str) -> bytes:
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(0, 10, text)
    return bytes(pdf.output())


def part(data: str, filename: str | None = "report.pdf") -> dict:
    file = {"file_data": data}
    if filename is not None:
        file["filename"] = filename
    return {"type": "file", "file": file}


def test_a_pdf_data_url_is_extracted():
    url = "data:application/pdf;base64," + base64.b64encode(pdf_bytes("quarterly figures")).decode()
    doc = document_from_file_part(part(url))
    assert (doc.name, doc.kind) == ("report.pdf", "pdf") and "quarterly figures" in doc.pages[0].text
    unnamed = document_from_file_part(part(url, None))
    assert unnamed.name == "document.pdf" and unnamed.kind == "pdf"
    text = document_from_file_part(part("data:text/csv;base64," + base64.b64encode(b"a,b\n1,2\n").decode(), "../../etc/t"))
    assert (text.name, text.kind) == ("t.csv", "csv")
    bare = document_from_file_part(part(base64.b64encode(b"# hi\n").decode(), "n.md"))
    assert bare.pages[0].text == "# hi\n"


def test_malformed_parts_are_one_sentence():
    with pytest.raises(DocumentError, match=r'^a "file" content part needs a "file" object'):
        document_from_file_part({"type": "file"})
    with pytest.raises(DocumentError, match=r"^x\.pdf: files uploaded by id \(file_id\) are not kept"):
        document_from_file_part({"type": "file", "file": {"file_id": "file-abc", "filename": "x.pdf"}})
    with pytest.raises(DocumentError, match=r'^report\.pdf: "file_data" is not valid base64'):
        document_from_file_part(part("data:application/pdf;base64,@@@"))
    with pytest.raises(DocumentError, match=r"^report\.pdf: the file is about .* MiB, more than the 0 MiB"):
        document_from_file_part(part("A" * 4_000_000), Limits(max_bytes=1000))
    png = b"\x89PNG\r\n\x1a\n" + bytes(32)
    with pytest.raises(DocumentError, match=r"^p\.txt: the file is a PNG image, not a document"):
        document_from_file_part(part(base64.b64encode(png).decode(), "p.txt"))
