"""Word, HTML, CSV, Markdown and source files, each made here by its own library (python-docx
writes the Word files) or by hand, read back with headings, tables and rows in place; the kind
told by content as well as name; zip bombs and lying zips refused before they unpack."""
import io
import struct
import time
import tracemalloc
import zipfile

import pytest

from tramontane.engine.documents.extract import DocumentError, Limits, detect, extract

from support.documents import docx_bomb, docx_bytes as make_docx, rezip

pytest.importorskip("docx")


def test_docx_keeps_headings_lists_tables_in_order():
    doc = extract(make_docx(), "report.docx")
    assert doc.kind == "docx" and len(doc.pages) == 1
    assert doc.pages[0].text == (
        "# Harbour report\n\nThe ferry leaves at noon.\n\n## Crew\n\n- Ada Vance keeps the light.\n\n"
        "| Name | Role | Shift |\n| Ada | Keeper | Night |\n| Ben | Pilot | Day |\n\n"
        "| wide | narrow |\n\nAfter the tables.")


def test_a_docx_zip_bomb_is_refused_from_its_directory():
    bomb = docx_bomb()
    assert len(bomb) < 2**20
    tracemalloc.start()
    started = time.monotonic()
    with pytest.raises(DocumentError, match=r"^bomb\.docx: its part word/media/image1\.png unpacks to \d+ times its packed size, as a zip bomb does"):
        extract(bomb, "bomb.docx")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.monotonic() - started < 2.0 and peak < 8 * 2**20  # the 64 MiB were never inflated


def test_a_docx_over_the_unpacked_cap_is_refused():
    with pytest.raises(DocumentError, match=r"^r\.docx: the Word document would unpack to \d+ MiB, more than the 0 MiB"):
        extract(make_docx(), "r.docx", Limits(max_unpacked_bytes=10_000))


def lie_about_size(data: bytes, member: str, size: int) -> bytes:
    """The central directory's uncompressed size of `member` set to `size` (the data unchanged)."""
    buf = bytearray(data)
    at = buf.index(b"PK\x01\x02")  # the first central directory entry
    while True:
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", buf, at + 28)
        if buf[at + 46:at + 46 + name_len].decode() == member:
            struct.pack_into("<I", buf, at + 24, size)
            return bytes(buf)
        at += 46 + name_len + extra_len + comment_len


def test_a_zip_that_lies_about_sizes_stops_at_the_declared_size():
    body = b"<w:p/>" * (10 * 2**20)  # 60 MiB of XML packed into ~60 KiB
    data = rezip(make_docx(), {})
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        xml = z.read("word/document.xml")
    liar = lie_about_size(rezip(data, {"word/document.xml": xml.replace(b"</w:body>", body + b"</w:body>")}),
                          "word/document.xml", 4096)
    tracemalloc.start()
    started = time.monotonic()
    with pytest.raises(DocumentError, match=r"^liar\.docx: the file is not a readable Word document \(its zip archive is damaged: Bad CRC-32"):
        extract(liar, "liar.docx")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.monotonic() - started < 2.0 and peak < 16 * 2**20


def test_other_zips_and_damaged_docx_are_named():
    sheet = io.BytesIO()
    with zipfile.ZipFile(sheet, "w") as z:
        z.writestr("xl/workbook.xml", "<workbook/>")
    with pytest.raises(DocumentError, match=r"^book\.docx: the file is an Excel workbook, not a Word document\.$"):
        extract(sheet.getvalue(), "book.docx")
    with pytest.raises(DocumentError, match=r"^cut\.docx: the file is not a readable Word document"):
        extract(make_docx()[:3000], "cut.docx")
    with pytest.raises(DocumentError, match=r"^fake\.docx: the file is not a Word document \(a \.docx file is a zip archive"):
        extract(b"just some words", "fake.docx")
    ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504)
    with pytest.raises(DocumentError, match=r"^locked\.docx: the Word document is encrypted with a password"):
        extract(ole, "locked.docx")
    with pytest.raises(DocumentError, match=r"^old\.doc: the file is in the old Word format \(\.doc\); save it as \.docx"):
        extract(ole, "old.doc")


def test_html_text_headings_lists_tables_and_no_scripts():
    page = ("<!DOCTYPE html><html><head><title>Tide tables</title><style>p{color:red}</style>"
            "<script>var secret = 'hidden';</script></head><body><nav><a href='/'>Home</a></nav>"
            "<h1>Tides &amp; times</h1><p>High   water\n at <b>06:12</b>.</p><noscript>enable js</noscript>"
            "<ul><li>Spring</li><li>Neap</li></ul><table><tr><th>Day</th><th>Height</th></tr>"
            "<tr><td><p>Mon</p></td><td>4.1 m</td></tr></table><pre>  a  b\n  c</pre>"
            "<svg><title>icon</title><text>svgtext</text></svg><p>caf\u00e9</p></body></html>")
    doc = extract(page.encode(), "tides.html")
    assert doc.kind == "html"
    assert doc.pages[0].text == ("# Tide tables\nHome\n# Tides & times\nHigh water at 06:12.\n- Spring\n- Neap\n"
                                 "| Day | Height |\n| Mon | 4.1 m |\n  a  b\n  c\ncaf\u00e9")
    latin = '<html><head><meta charset="iso-8859-1"></head><body><p>caf\u00e9</p></body></html>'.encode("latin-1")
    assert extract(latin, "old.htm").pages[0].text == "caf\u00e9"
    assert detect(b"  <!doctype html><p>x</p>", "saved.txt") == ("html", None)


def test_csv_header_and_rows_as_a_table_bounded():
    data = "name;city\r\nAda;\"Brest; Finist\u00e8re\"\r\nBen;Oslo\r\n\r\n".encode()
    doc = extract(data, "people.csv")
    assert doc.pages[0].text == "| name | city |\n| --- | --- |\n| Ada | Brest; Finist\u00e8re |\n| Ben | Oslo |"
    many = "a,b\n" + "".join(f"{i},{i * i}\n" for i in range(50))
    doc = extract(many.encode(), "many.csv", Limits(max_rows=10))
    lines = doc.pages[0].text.split("\n")
    assert len(lines) == 12 and lines[-1] == "| 9 | 81 |"
    assert doc.notes == ("many.csv: only its first 10 of 50 rows were read.",)
    tsv = extract(b"x\ty\n1\t2\n", "t.tsv")
    assert tsv.pages[0].text == "| x | y |\n| --- | --- |\n| 1 | 2 |"
    with pytest.raises(DocumentError, match=r"^wide\.csv: the CSV file cannot be read at line 2 \(field larger than field limit"):
        extract(b"a\n" + b"x" * 200_000 + b"\n", "wide.csv")


def test_markdown_text_and_source_files():
    md = extract(b"# Title\n\nSome *text*.\r\n", "notes.md")
    assert (md.kind, md.pages[0].text) == ("markdown", "# Title\n\nSome *text*.\n")
    code = "def f(x):\n\treturn x  # \u00e9\n"
    src = extract(code.encode(), "tool.py")
    assert (src.kind, src.language, src.pages[0].text) == ("source", "Python", code)
    assert detect(b"all:\n\techo hi\n", "Makefile") == ("source", "Makefile")
    assert detect(b"fn main() {}", "main.rs") == ("source", "Rust")
    assert extract(b"plain words", "README").kind == "text"
    assert extract(b"words in an odd file", "data.xyz").kind == "text"


@pytest.mark.parametrize("data,what", [
    (b"\x89PNG\r\n\x1a\n" + bytes(64), "a PNG image"),
    (b"\xff\xd8\xff\xe0" + bytes(64), "a JPEG image"),
    (b"\x7fELF\x02\x01\x01" + bytes(64), "a program \\(ELF\\)"),
    (b"GGUF\x03\x00\x00\x00" + bytes(64), "a GGUF model file"),
])
def test_a_binary_renamed_txt_is_named_by_its_content(data, what):
    with pytest.raises(DocumentError, match=rf"^photo\.txt: the file is {what}, not a document, whatever its name says\.$"):
        extract(data, "photo.txt")


def test_content_wins_over_the_name():
    fpdf = pytest.importorskip("fpdf")
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(0, 10, "inside a pdf")
    doc = extract(bytes(pdf.output()), "looks-like.txt")
    assert doc.kind == "pdf" and "inside a pdf" in doc.pages[0].text
    assert extract(make_docx(), "renamed.bin").kind == "docx"
