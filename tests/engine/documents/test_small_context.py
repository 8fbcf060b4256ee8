"""Retrieval excerpts cut to a small context (issue 37): on the tiny model with its context made
300 positions (gguf_edit; far below RETRIEVAL_TOKENS), a long document's excerpts are fewer and
the last one shortened so that the prompt fits by the engine's own rule, and the engine then
answers it (the check in the engine passes on the real prompt). With the context the file
says (512) more of the excerpts go in; the fit is the tightest one: one word more would not fit."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tramontane.engine.api import ChatMessage, DocumentPart, EngineError, SamplingParams
from tramontane.engine.documents.prompt import EXCERPTS, MIN_EXCERPT_WORDS, engine_documents_prompt, fitting_excerpts
from tramontane.engine.documents.retrieval import RETRIEVAL_TOKENS, TOKEN, Hit
from tramontane.engine.runtime.local import LocalEngine
from tramontane.engine.runtime.prompts import check_fits

from support import FIXTURES
from support.gguf_edit import rewrite_gguf

fpdf = pytest.importorskip("fpdf")
MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
SMALL = 300
ROOMY = 4096
REPLY = 16
WORDS = "tide gauge pier crane ledger harbour freight lantern vessel cargo manifest customs".split()


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    small = rewrite_gguf(MODEL, tmp_path_factory.mktemp("ctx") / "tiny-300.gguf",
                         set_kv={"mistral3.context_length": SMALL})
    roomy = rewrite_gguf(MODEL, tmp_path_factory.mktemp("ctx") / "tiny-4k.gguf",
                         set_kv={"mistral3.context_length": ROOMY})
    opened = [LocalEngine(small, None, device="cpu"), LocalEngine(roomy, None, device="cpu")]
    yield opened
    for engine in opened:
        engine.close()


def long_pdf(pages: int = 100) -> bytes:
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=10)
    for page in range(pages):
        pdf.add_page()
        # every page (one chunk: shorter than CHUNK_WORDS) mentions the tide: the question finds five
        pdf.multi_cell(0, 5, " ".join(WORDS[(page + i) % len(WORDS)] for i in range(20)) + " The tide rises.")
    return bytes(pdf.output())


def conversation() -> list[ChatMessage]:
    return [ChatMessage("user", [DocumentPart(long_pdf(), "harbour.pdf"), "What does the tide do?"])]


def excerpts_of(prompt) -> str:
    return next(p for p in prompt.messages[-1].parts if isinstance(p, str) and p.startswith("<excerpts>"))


def test_a_small_context_gets_fewer_and_shorter_excerpts_that_fit(engines):
    small, full = engines
    assert small.context_size == SMALL < RETRIEVAL_TOKENS
    cut = engine_documents_prompt(small, conversation(), REPLY)
    roomy = engine_documents_prompt(full, conversation(), REPLY)
    assert [p.mode for p in cut.placements.values()] == ["retrieved"]
    n = small.count_tokens(cut.messages)
    check_fits(n, REPLY, SMALL)  # the engine's rule holds on the prompt as placed
    assert n > SMALL - 60  # and the room was used, not thrown away
    assert 1 <= excerpts_of(cut).count("\n[") < excerpts_of(roomy).count("\n[") == EXCERPTS
    assert not excerpts_of(roomy).endswith(" …\n</excerpts>")
    assert [s.page for s in cut.sources] == [s.page for s in roomy.sources][:len(cut.sources)]
    assert any(note.startswith("The context leaves room for") for note in cut.notes)
    assert not any(note.startswith("The context leaves room for") for note in roomy.notes)
    # the engine takes it: the check it makes before prefill passes on this prompt
    result = small.chat(cut.messages, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert result.stats.prompt_tokens == n


def test_the_last_excerpt_is_cut_to_the_most_words_that_fit():
    hits = [Hit("f.pdf", i + 1, "", " ".join(f"w{i}x{j}" for j in range(100)), float(i)) for i in range(5)]

    def count(chosen):  # a prompt of 50 tokens, then one token a word
        return 50 + sum(len(TOKEN.findall(h.text)) for h in chosen)

    fitted = fitting_excerpts(hits, count, 50 + 100 * 2 + 40 + 1 + 1, reply_tokens=8)
    assert [h.page for h in fitted] == [1, 2, 3]
    assert fitted[:2] == hits[:2] and fitted[2].text.endswith(" …")
    assert count(fitted) == 50 + 100 * 2 + 41  # " …" is one more piece: 40 words and the mark
    with pytest.raises(EngineError):
        check_fits(count(fitted[:2] + [replace(fitted[2], text=" ".join(f"w2x{j}" for j in range(41)) + " …")]),
                   8, 50 + 100 * 2 + 40 + 1 + 1)
    assert fitting_excerpts(hits, count, 10_000, 8) == hits  # all fit: all of them
    # too little room for the shortest cut: the whole ones only, and none when none fit
    assert fitting_excerpts(hits, count, 50 + 100 + MIN_EXCERPT_WORDS, 8) == hits[:1]
    assert fitting_excerpts(hits, count, 40, 8) == []


@pytest.mark.parametrize("found, whole, part, words", [
    (1, 0, True, "part of the 1 excerpt found"),  # was "0 of the 1 excerpts found and part of the next"
    (3, 0, True, "part of the best of the 3 excerpts found"),
    (3, 0, False, "none of the 3 excerpts found"),
    (5, 2, True, "2 of the 5 excerpts found and part of the next"),
    (5, 4, False, "4 of the 5 excerpts found"),
])
def test_the_note_says_which_excerpts_went_in(found, whole, part, words):
    from tramontane.engine.documents.prompt import excerpt_words

    hits = [Hit("f.pdf", i + 1, "", f"excerpt {i} text", float(i)) for i in range(found)]
    fitted = hits[:whole] + ([replace(hits[whole], text="excerpt")] if part else [])
    assert excerpt_words(hits, fitted) == words
