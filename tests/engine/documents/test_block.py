"""The prompt's document text: the same bytes on every call (the KV cache keeps the prefix),
page markers, a truncated PDF said, scans marked, source fenced with its language; excerpts
numbered as the sources under the reply."""
from tramontane.engine.documents.block import Source, document_block, excerpts_block, sources
from tramontane.engine.documents.document import Document, Page
from tramontane.engine.documents.retrieval import Hit


def test_a_pdf_block_has_its_name_pages_and_scans():
    pdf = Document('a "q".pdf', "pdf", [Page(1, "one\n"), Page(2, "", has_text_layer=False), Page(3, "three")],
                   total_pages=9)
    block = document_block(pdf, vision=True)
    assert block == ('<document name="a _q_.pdf" pages="3 of 9">\n--- page 1 ---\none\n'
                     "--- page 2 ---\n[a scanned page: its image is attached]\n--- page 3 ---\nthree\n</document>")
    assert document_block(pdf, vision=True) == block  # byte-identical on every turn
    assert "[a scanned page without a text layer: not read]" in document_block(pdf, vision=False)


def test_other_kinds_and_source_files():
    md = Document("n.md", "markdown", [Page(1, "# T\nbody\n")])
    assert document_block(md) == '<document name="n.md">\n# T\nbody\n</document>'
    code = Document("x.cpp", "source", [Page(1, "int a; // ```\n")], language="C++")
    assert document_block(code) == '<document name="x.cpp" language="C++">\n````cpp\nint a; // ```\n````\n</document>'


def test_excerpts_and_sources_agree():
    hits = [Hit("r.pdf", 12, "", "fact one", -3.0), Hit("n.docx", None, "Crew > Night", "fact two", -2.0),
            Hit("r.pdf", 12, "", "fact three", -1.0)]
    assert sources(hits) == [Source("r.pdf", 12), Source("n.docx", None, "Crew > Night")]
    assert [s.label for s in sources(hits)] == ["r.pdf, page 12", "n.docx, Crew > Night"]
    assert excerpts_block(hits) == ("<excerpts>\n[1] r.pdf, page 12\nfact one\n\n[2] n.docx, Crew > Night\nfact two\n\n"
                                    "[1] r.pdf, page 12\nfact three\n</excerpts>")
    assert excerpts_block([]) == "" and sources([]) == []
