"""Documents in the chat (issue 37): text out of PDF, Word, HTML, CSV, Markdown, text and source
files, bounded in bytes, pages and time, with one-sentence errors (`extract.py`); scanned pages
as images for the vision tower (`scans.py`); whole or retrieved from a per-chat FTS5 index
(`retrieval.py`); the prompt's document text (`block.py`); OpenAI's file parts (`file_parts.py`)."""
