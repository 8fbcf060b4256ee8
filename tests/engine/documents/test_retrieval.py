"""Whole or retrieved: the placement rule at its edges, chunks by page and heading with overlap,
and retrieval from a 300-page PDF (fpdf2 writes it) with facts planted on known pages, found by
questions worded apart from the facts: recall@5 >= 0.9 over 24 questions."""
import os
import random
import stat

import pytest

from tramontane.engine.documents.block import document_block
from tramontane.engine.documents.document import Document, Page
from tramontane.engine.documents.extract import extract
from tramontane.engine.documents.retrieval import (
    Budget, DocumentIndex, chunk_document, fts_query, place_documents)

fpdf = pytest.importorskip("fpdf")


def count_words(text: str) -> int:  # a stand-in tokenizer: the rule only adds the counts it is given
    return len(text.split())


def doc(name: str, words: int) -> Document:
    return Document(name, "text", [Page(1, " ".join(["w"] * words))])


def test_documents_go_whole_while_they_fit_the_room():
    a, b = doc("a.txt", 1000), doc("b.txt", 3000)
    ta, tb = (count_words(document_block(d)) for d in (a, b))
    room_for_both = Budget(context_tokens=10_000, conversation_tokens=10_000 - 500 - ta - tb, reply_tokens=500)
    assert [p.mode for p in place_documents([a, b], count_words, room_for_both)] == ["whole", "whole"]
    one_short = Budget(10_000, room_for_both.conversation_tokens + 1, 500)
    placed = place_documents([a, b], count_words, one_short, retrieval_tokens=100)
    assert [(p.mode, p.tokens) for p in placed] == [("whole", ta), ("retrieved", tb)]
    # a later document that would fit does not jump the queue: the prefix stays in attachment order
    placed = place_documents([b, a], count_words, Budget(10_000, 10_000 - 500 - ta - 100, 500), retrieval_tokens=100)
    assert [p.mode for p in placed] == ["retrieved", "retrieved"]
    assert place_documents([a], count_words, Budget(4096, 4000, 1024))[0].mode == "retrieved"


def test_chunks_keep_page_heading_and_overlap():
    words = [f"w{i}" for i in range(300)]
    text = "# Intro\nshort intro\n## Deep part\n" + " ".join(words) + "\n# Next\nlast words"
    chunks = chunk_document(Document("n.md", "markdown", [Page(1, text)]), words=100, overlap=20)
    assert [c.heading for c in chunks] == ["Intro", "Intro > Deep part", "Intro > Deep part", "Intro > Deep part",
                                           "Intro > Deep part", "Next"]
    assert chunks[0].text == "# Intro\nshort intro" and chunks[0].page is None
    deep = [c.text.split() for c in chunks[1:5]]
    assert deep[0][:4] == ["##", "Deep", "part", "w0"] and deep[1][0] == "w77" and deep[0][-20:] == deep[1][:20]
    assert deep[-1][-1] == "w299" and chunks[-1].text == "# Next\nlast words"
    pdf = Document("p.pdf", "pdf", [Page(1, "alpha"), Page(2, "beta")])
    assert [(c.page, c.text) for c in chunk_document(pdf)] == [(1, "alpha"), (2, "beta")]
    code = Document("a.py", "source", [Page(1, "# a comment\nx = 1\n")], language="Python")
    assert [(c.heading, c.text) for c in chunk_document(code)] == [("", "# a comment\nx = 1")]


FILLER = ("the harbour report notes that the ferry schedule changed and the crew kept the lighthouse "
          "records while the council reviewed the budget for the new pier and the storage of fuel "
          "supplies the keeper wrote about weather tides cargo nets engines maps lanterns rope paint "
          "inspection visitors permits repairs radio signals fishing boats winter storms spring market "
          # the questions' own common words, so only the rare names tell the pages apart
          "code archive vault master island lens made crew stored long renew block land burned maps "
          "oil stores make mixed crates leads frequency uses logged leave every first metres").split()
# (fact, question, answer): the rare name is the only thing tying a question to its page.
FACTS = [
    ("The harbour master of Quillon is named Teodor Brask.", "Who is the harbour master at Quillon?", "Brask"),
    ("The vault code for the Marlowe archive is 4471.", "What is the code of the Marlowe archive vault?", "4471"),
    ("Ferries to Ostrava Island leave at 06:40 every Tuesday.", "When do ferries leave for Ostrava Island?", "06:40"),
    ("The Pellucid lighthouse lens was made in 1873 by Chance Brothers.", "Who made the lens of the Pellucid lighthouse?", "Chance"),
    ("The council of Varnholm approved a pier budget of 2.4 million.", "How big was the pier budget Varnholm approved?", "2.4"),
    ("Keeper Ingrid Solvang logged a storm surge of 3.1 metres.", "What storm surge did Ingrid Solvang log?", "3.1"),
    ("The Kestrel Deep trawler carries a crew of eleven.", "How many crew are on the Kestrel Deep?", "eleven"),
    ("Radio beacon Zelophan transmits on 287 kHz.", "Which frequency does the Zelophan beacon use?", "287"),
    ("The Tamsworth fuel depot stores diesel in tank seven.", "Where is diesel kept at the Tamsworth depot?", "seven"),
    ("Captain Odalys Fierro retired after forty winters.", "When did captain Fierro retire?", "forty"),
    ("The Brindlecombe market opens on the first Saturday.", "When does the Brindlecombe market open?", "Saturday"),
    ("Signal flags at Yarrowpoint are stored in the blue chest.", "Where are the Yarrowpoint signal flags stored?", "blue"),
    ("The Mirefield pier is 412 metres long.", "How long is the Mirefield pier?", "412"),
    ("Permit holders for Cindervale must renew each March.", "When must Cindervale permit holders renew?", "March"),
    ("The Gallowmere engine was rebuilt with a Kromhout block.", "What block was the Gallowmere engine rebuilt with?", "Kromhout"),
    ("Visitors to Hesperine Rock may land only at low tide.", "When may visitors land on Hesperine Rock?", "low"),
    ("The Thistledown net loft burned in the fire of 1921.", "When did the Thistledown net loft burn?", "1921"),
    ("Maps of the Corvalis channel were redrawn by Elsa Marr.", "Who redrew the maps of the Corvalis channel?", "Marr"),
    ("The Umberlee lantern burns colza oil.", "What oil does the Umberlee lantern burn?", "colza"),
    ("Inspector Bartholomew Quince audits the Wexcombe stores.", "Who audits the stores at Wexcombe?", "Quince"),
    ("The Saltmarsh ropewalk produces hemp hawsers.", "What does the Saltmarsh ropewalk make?", "hemp"),
    ("Paint for the Dunraven hull is mixed with lamp black.", "What is mixed into the paint for the Dunraven hull?", "lamp"),
    ("The Lorimer cargo manifest lists 96 crates of tea.", "How many crates of tea are on the Lorimer manifest?", "96"),
    ("Repairs at Ashgrove slipway are led by foreman Nils Oberg.", "Who leads repairs at the Ashgrove slipway?", "Oberg"),
]


def planted_pdf(pages: int, seed: int = 7) -> tuple[bytes, dict[int, int]]:
    rng = random.Random(seed)
    where = dict(zip(range(len(FACTS)), rng.sample(range(1, pages + 1), len(FACTS))))
    on_page = {page: i for i, page in where.items()}
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=9)
    pdf.set_auto_page_break(False)
    for page in range(1, pages + 1):
        pdf.add_page()
        sentences = [" ".join(rng.choices(FILLER, k=rng.randint(8, 16))).capitalize() + "." for _ in range(14)]
        if page in on_page:
            sentences.insert(rng.randint(0, len(sentences)), FACTS[on_page[page]][0])
        pdf.multi_cell(0, 4.5, " ".join(sentences))
    return bytes(pdf.output()), where


def test_retrieval_finds_planted_facts_in_a_300_page_pdf(tmp_path):
    data, where = planted_pdf(300)
    document = extract(data, "harbour.pdf")
    assert len(document.pages) == 300
    assert place_documents([document], count_words, Budget(32_768, 200, 1024))[0].mode == "retrieved"
    with DocumentIndex(tmp_path / "chat-1.sqlite3") as index:
        assert index.add(document, "sha-harbour") > 300
        found = 0
        for i, (_, question, answer) in enumerate(FACTS):
            hits = index.search(question, k=5)
            assert 1 <= len(hits) <= 5 and all(h.file == "harbour.pdf" for h in hits)
            found += any(h.page == where[i] and answer in h.text for h in hits)
        assert found / len(FACTS) >= 0.9, f"recall@5 {found}/{len(FACTS)}"


def test_the_index_is_private_per_content_and_removable(tmp_path):
    path = tmp_path / "chat.sqlite3"
    a = Document("a.md", "markdown", [Page(1, "# Tides\nThe neap tide is gentle.")])
    b = Document("b.pdf", "pdf", [Page(1, "cover"), Page(2, "The spring tide is strong.")])
    with DocumentIndex(path) as index:
        assert index.add(a, "sa") == 1 and index.add(a, "sa") == 1
        index.add(b, "sb")
        assert [(h.file, h.page, h.heading) for h in index.search("spring tide")] == [("b.pdf", 2, ""), ("a.md", None, "Tides")]
        assert [h.file for h in index.search("tide", sha256s=["sa"])] == ["a.md"]
        assert index.search("the of and") == [] and index.search("") == []
        index.remove("sb")
    if os.name == "posix":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with DocumentIndex(path) as index:  # kept on disk, reopened
        assert index.documents() == [("sa", "a.md", 1)]
        assert [h.file for h in index.search("spring tide")] == ["a.md"]


def test_questions_become_safe_fts_queries(tmp_path):
    assert fts_query('What is "NEAR" the pier? (AND) -x* col:y') == '"near" OR "pier" OR "col"'
    with DocumentIndex(tmp_path / "q.sqlite3") as index:
        index.add(Document("q.txt", "text", [Page(1, "near the pier, col y")]), "q")
        assert len(index.search('What is "NEAR" the pier? (AND) -x* col:y')) == 1
