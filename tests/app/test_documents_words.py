"""How the window says a reply read its documents (issue 37): each document's mode, then the
excerpts' sources, then the reader's notes, from a real DocumentPrompt."""
from __future__ import annotations

from tramontane.app.reply_commands import documents_words
from tramontane.engine.documents.block import Source
from tramontane.engine.documents.document import Document, Page
from tramontane.engine.documents.prompt import DocumentPrompt
from tramontane.engine.documents.retrieval import Placement


def test_modes_sources_and_notes_in_words():
    short = Document("a.md", "markdown", [Page(1, "x")])
    long = Document("b.pdf", "pdf", [Page(1, "y")])
    prompt = DocumentPrompt([], {"1": Placement(short, "whole", 3), "2": Placement(long, "retrieved", 9000)},
                            [Source("b.pdf", 12), Source("b.pdf", 40)], ["b.pdf: 1,000 of its 2,000 pages were read."])
    assert documents_words(prompt).splitlines() == [
        "a.md: read whole; b.pdf: searched (too long to read whole)",
        "Sources: b.pdf, page 12; b.pdf, page 40",
        "b.pdf: 1,000 of its 2,000 pages were read.",
    ]
    assert documents_words(DocumentPrompt([])) == ""
