"""Documents in the chat (issue 37): text out of PDF, Word, HTML, CSV, Markdown, text and source
files, bounded in bytes, pages and time, with one-sentence errors (`extract.py`)."""
