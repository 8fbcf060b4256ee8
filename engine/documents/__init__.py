"""Documents in the chat (issue 37): text from PDF and plain-text files, bounded in bytes, pages
and time, with one-sentence errors (`extract.py`)."""
