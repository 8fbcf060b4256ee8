"""Text out of an attached document, bounded: the kind told by content and name, PDF pages
(PDFium), plain text, Markdown and source files here, Word, HTML and CSV in their own modules.

Every extraction is capped in bytes read, pages and time (the budget is checked between pages),
and can be cancelled by the caller through a `threading.Event`; bad input ends as one
`DocumentError` sentence naming the file. Running it off the UI thread is the caller's business.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from .csv_text import extract_csv
from .document import Document, DocumentError, Limits, Page, check_running, check_size, decode_text
from .html_text import extract_html
from .word import extract_docx

TEXT_SUFFIXES = {".txt", ".text", ".rst", ".log", ".org", ".tex", ".adoc"}
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
CSV_SUFFIXES = {".csv", ".tsv"}
# Source files are kept verbatim with their language; the name decides the language.
SOURCE_LANGUAGES = {
    ".py": "Python", ".pyi": "Python", ".js": "JavaScript", ".mjs": "JavaScript", ".cjs": "JavaScript",
    ".jsx": "JavaScript", ".ts": "TypeScript", ".tsx": "TypeScript", ".c": "C", ".h": "C",
    ".cc": "C++", ".cpp": "C++", ".cxx": "C++", ".hpp": "C++", ".hh": "C++", ".cs": "C#",
    ".java": "Java", ".kt": "Kotlin", ".kts": "Kotlin", ".scala": "Scala", ".go": "Go", ".rs": "Rust",
    ".swift": "Swift", ".m": "Objective-C", ".rb": "Ruby", ".php": "PHP", ".pl": "Perl", ".lua": "Lua",
    ".r": "R", ".jl": "Julia", ".hs": "Haskell", ".ml": "OCaml", ".ex": "Elixir", ".exs": "Elixir",
    ".erl": "Erlang", ".clj": "Clojure", ".dart": "Dart", ".zig": "Zig", ".nim": "Nim",
    ".sh": "Shell", ".bash": "Shell", ".zsh": "Shell", ".fish": "Shell", ".ps1": "PowerShell",
    ".bat": "Batch", ".cmd": "Batch", ".sql": "SQL", ".css": "CSS", ".scss": "SCSS", ".less": "Less",
    ".json": "JSON", ".jsonl": "JSON Lines", ".yaml": "YAML", ".yml": "YAML", ".toml": "TOML",
    ".ini": "INI", ".cfg": "INI", ".xml": "XML", ".svg": "SVG", ".proto": "Protocol Buffers",
    ".graphql": "GraphQL", ".cmake": "CMake", ".gradle": "Gradle", ".vue": "Vue", ".svelte": "Svelte",
    ".asm": "Assembly", ".s": "Assembly", ".f90": "Fortran", ".vhd": "VHDL", ".v": "Verilog",
    ".diff": "diff", ".patch": "diff", ".cu": "CUDA", ".cuh": "CUDA", ".glsl": "GLSL",
}
SOURCE_NAMES = {"makefile": "Makefile", "dockerfile": "Dockerfile", "cmakelists.txt": "CMake",
                "gnumakefile": "Makefile", "justfile": "Just", "rakefile": "Ruby", "gemfile": "Ruby"}
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # Compound File: old Office, encrypted new Office
# The first bytes of binary files people rename by mistake, and what to call them.
MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
    (b"\x7fELF", "a program (ELF)"), (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"), (b"Rar!", "a RAR archive"), (b"GGUF", "a GGUF model file"),
    (b"SQLite format 3\x00", "an SQLite database"), (OLE_MAGIC, "an Office file in the old format (.doc, .xls or .ppt) or an encrypted one"),
    (b"%!PS", "a PostScript file"), (b"RIFF", "a RIFF media file (WebP, WAV or AVI)"),
)


def extract_pdf(data: bytes, name: str, limits: Limits = Limits(), cancel: threading.Event | None = None) -> Document:
    """Each page's text with its number; a page with no text but images is marked as a scan.
    A file with more than `limits.max_pages` pages is read up to that page, and says so."""
    import pypdfium2 as pdfium

    check_size(data, name, limits)
    started = time.monotonic()
    pdf = open_pdf(data, name)
    try:
        count = len(pdf)
        read = min(count, limits.max_pages)
        pages = []
        for index in range(read):
            check_running(name, started, limits, cancel)
            pages.append(_pdf_page(pdf[index], index + 1, pdfium))
        notes = ()
        if read < count:
            notes = (f"{name}: only its first {read} of {count} pages were read (a document may have at most {limits.max_pages}).",)
        return Document(name, "pdf", pages, total_pages=count if read < count else None, notes=notes)
    finally:
        pdf.close()


def open_pdf(data: bytes, name: str):
    """A PdfDocument over the bytes, or the sentence for an encrypted or unreadable file."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        if pdfium_c.FPDF_GetLastError() == pdfium_c.FPDF_ERR_PASSWORD or "password" in str(exc).lower():
            raise DocumentError(f"{name}: the PDF is encrypted with a password, so its text cannot be read.") from exc
        raise DocumentError(f"{name}: the file is not a readable PDF ({exc}).") from exc


def _pdf_page(page, number: int, pdfium) -> Page:
    import pypdfium2.raw as pdfium_c

    try:
        textpage = page.get_textpage()
        try:
            text = textpage.get_text_range().replace("\r\n", "\n").replace("\r", "\n")
        finally:
            textpage.close()
        has_images = any(True for _ in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE], max_depth=2))
    finally:
        page.close()
    return Page(number, text, has_text_layer=bool(text.strip()) or not has_images)


def extract_text(data: bytes, name: str, limits: Limits = Limits(), kind: str = "text",
                 language: str | None = None) -> Document:
    """A plain-text, Markdown or source file: UTF-8 (BOM allowed), else refused as binary.
    Line ends are made \\n; a source file is otherwise kept exactly as it is."""
    check_size(data, name, limits)
    text = decode_text(data, name).replace("\r\n", "\n")
    return Document(name, kind, [Page(1, text)], language=language)


def binary_kind(data: bytes) -> str | None:
    """What a binary file is, from its first bytes ('a PNG image'), or None when it may be text."""
    for magic, what in MAGIC:
        if data.startswith(magic):
            return what
    if data.startswith(b"PK\x03\x04"):
        return "a zip archive"
    return None


def detect(data: bytes, name: str) -> tuple[str, str | None]:
    """(kind, language) of a document from its content first, then its name."""
    path = Path(name)
    suffix = path.suffix.lower()
    head = data[:1024]
    if b"%PDF-" in head:
        return "pdf", None
    if data.startswith(b"PK\x03\x04"):
        return "docx", None  # the Word reader names any other zip (xlsx, odt, a plain archive)
    if data.startswith(OLE_MAGIC):  # Word's encrypted .docx is an OLE file too, not a zip
        if suffix in (".docx", ".docm", ".dotx"):
            raise DocumentError(f"{name}: the Word document is encrypted with a password, so its text cannot be read.")
        if suffix in (".doc", ".dot"):
            raise DocumentError(f"{name}: the file is in the old Word format (.doc); save it as .docx or PDF to attach it.")
    if suffix in (".docx", ".docm", ".dotx"):
        raise DocumentError(f"{name}: the file is not a Word document (a .docx file is a zip archive, and this one is not).")
    if suffix == ".pdf":
        return "pdf", None  # PDFium names what is wrong with it
    what = binary_kind(data)
    if what is not None:
        raise DocumentError(f"{name}: the file is {what}, not a document, whatever its name says.")
    if suffix in HTML_SUFFIXES or head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        return "html", None
    if suffix in CSV_SUFFIXES:
        return "csv", None
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown", None
    language = SOURCE_NAMES.get(path.name.lower()) or SOURCE_LANGUAGES.get(suffix)
    if language is not None:
        return "source", language
    return "text", None  # .txt, no suffix, or any other name: text if its bytes are text


def extract(data: bytes, name: str, limits: Limits = Limits(), cancel: threading.Event | None = None) -> Document:
    """A document of any kind read here, told by its content and its name's suffix."""
    check_size(data, name, limits)
    kind, language = detect(data, name)
    if kind == "pdf":
        return extract_pdf(data, name, limits, cancel)
    if kind == "docx":
        return extract_docx(data, name, limits, cancel)
    if kind == "html":
        return extract_html(data, name, limits, cancel)
    if kind == "csv":
        return extract_csv(data, name, limits, cancel)
    return extract_text(data, name, limits, kind, language)
