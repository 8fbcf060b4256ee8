"""Documents the tests make with libraries nobody here wrote: PDFs with a text layer (fpdf2,
optionally encrypted), scanned-page PDFs (a photo of a page, no text layer), Word files
(python-docx) and a zip rewritten with parts replaced (a DOCX zip bomb). One builder each, for
the library tests, the window tests and the benches."""
from __future__ import annotations

import io
import zipfile


def text_pdf(pages: list[str], password: str | None = None, font_size: int = 12, line: float = 8) -> bytes:
    """A PDF of one page per text (Helvetica), encrypted with `password` when one is given."""
    import fpdf

    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=font_size)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, line, text)
    if password is not None:
        pdf.set_encryption(owner_password="owner", user_password=password)
    return bytes(pdf.output())


def scanned_pdf(pages: int, text_page: bool = False) -> bytes:
    """A4 pages each holding one photo of a page: white with a black box in its top-left
    quarter, no text layer; `text_page` adds a typed page after them."""
    import fpdf
    from PIL import Image

    photo = Image.new("RGB", (400, 560), (255, 255, 255))
    photo.paste((0, 0, 0), (20, 20, 180, 260))
    png = io.BytesIO()
    photo.save(png, format="PNG")
    pdf = fpdf.FPDF(format="A4")
    pdf.set_font("helvetica", size=12)
    for _ in range(pages):
        pdf.add_page()
        pdf.image(io.BytesIO(png.getvalue()), x=0, y=0, w=210, h=297)
    if text_page:
        pdf.add_page()
        pdf.cell(0, 10, "typed page")
    return bytes(pdf.output())


def docx_bytes() -> bytes:
    """A Word file with headings, a bullet, a table and a merged-cell table (python-docx)."""
    import docx

    document = docx.Document()
    document.add_heading("Harbour report", level=1)
    document.add_paragraph("The ferry leaves at noon.")
    document.add_heading("Crew", level=2)
    document.add_paragraph("Ada Vance keeps the light.", style="List Bullet")
    table = document.add_table(rows=3, cols=3)
    for r, row in enumerate([["Name", "Role", "Shift"], ["Ada", "Keeper", "Night"], ["Ben", "Pilot", "Day"]]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    merged = document.add_table(rows=1, cols=3)
    merged.cell(0, 0).merge(merged.cell(0, 1)).text = "wide"
    merged.cell(0, 2).text = "narrow"
    document.add_paragraph("After the tables.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def rezip(data: bytes, replace: dict[str, bytes]) -> bytes:
    """The zip `data` with the members in `replace` rewritten (or added), deflated."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, replace.get(info.filename, src.read(info.filename)))
        for extra in set(replace) - set(src.namelist()):
            dst.writestr(extra, replace[extra])
    return out.getvalue()


def docx_bomb(inflated: int = 64 * 2**20) -> bytes:
    """A Word file one of whose parts unpacks to `inflated` zero bytes (packed well under 1 MiB)."""
    return rezip(docx_bytes(), {"word/media/image1.png": bytes(inflated)})
