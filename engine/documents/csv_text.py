"""A CSV or TSV file's text (the standard library's `csv`): the header and the rows as a
Markdown table, at most `Limits.max_rows` rows (the rest counted and said so)."""
from __future__ import annotations

import csv
import io
import threading
import time
from pathlib import Path

from .document import Document, DocumentError, Limits, Page, check_running, check_size, decode_text

SNIFF_CHARS = 64 * 1024
CHECK_EVERY = 1000  # rows between time and cancel checks


def _dialect(text: str, name: str):
    if Path(name).suffix.lower() == ".tsv":
        return csv.excel_tab
    try:
        # \r\n as \n: the Sniffer's quote patterns only see a quoted field at a line's end before \n
        return csv.Sniffer().sniff(text[:SNIFF_CHARS].replace("\r\n", "\n"), delimiters=",;\t|")
    except csv.Error:
        return csv.excel  # one column, or nothing to tell it by: the common form


def _row_line(row: list[str]) -> str:
    return "| " + " | ".join(" ".join(cell.split()).replace("|", "\\|") for cell in row) + " |"


def extract_csv(data: bytes, name: str, limits: Limits = Limits(), cancel: threading.Event | None = None) -> Document:
    check_size(data, name, limits)
    started = time.monotonic()
    text = decode_text(data, name)
    reader = csv.reader(io.StringIO(text, newline=""), _dialect(text, name))
    lines, rows = [], 0
    try:
        for row in reader:
            if rows % CHECK_EVERY == 0:
                check_running(name, started, limits, cancel)
            if not any(cell.strip() for cell in row):
                continue
            rows += 1
            if rows > limits.max_rows + 1:  # the header is not one of the rows
                continue  # counted for the note, not kept
            lines.append(_row_line(row))
            if rows == 1:
                lines.append("|" + " --- |" * len(row))
    except csv.Error as exc:
        raise DocumentError(f"{name}: the CSV file cannot be read at line {reader.line_num} ({exc}).") from exc
    notes = ()
    if rows > limits.max_rows + 1:
        notes = (f"{name}: only its first {limits.max_rows} of {rows - 1} rows were read.",)
    return Document(name, "csv", [Page(1, "\n".join(lines))], notes=notes)
