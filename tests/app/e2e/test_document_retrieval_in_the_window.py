"""Retrieval on the real window (issue 37): a 300-page PDF that fpdf2 writes is too long to read
whole, so each question brings in the chunks BM25 ranks best. Ten facts are planted on pages of
their own among filler, each with decoys that share its words on other pages; for each planted
question the chunk that holds its fact must be among the prompt's excerpts (recall@5 >= 0.9),
the reply (scripted) keeps the excerpts' sources, and the window shows them under it."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("pytestqt")
fpdf = pytest.importorskip("fpdf")

from support.app_window import GREEDY, MODEL, close_window, drop_files, make_window, send  # noqa: E402
from support.scripted import ScriptedLogits, script_logits  # noqa: E402

PAGES = 300
# (subject, what, answer): "The <what> of the <subject> is <answer>."
FACTS = [
    ("Aldebaran archive", "vault code", "4417"),
    ("Corvina lighthouse", "keeper's surname", "Pellworth"),
    ("Merrow bridge", "opening year", "1887"),
    ("Tolland observatory", "telescope maker", "Fraunhold"),
    ("Quillan orchard", "oldest tree variety", "Ashmead"),
    ("Brackwater ferry", "departure hour", "seven fifteen"),
    ("Harrowgate mill", "wheel diameter", "nine metres"),
    ("Sollis monastery", "bell founder", "Ostrander"),
    ("Velmont station", "platform count", "eleven"),
    ("Dunmere reservoir", "dam engineer", "Catherine Voss"),
]
OTHER_WHATS = ["roof colour", "founding charter", "winter schedule", "visitor book"]
SYLLABLES = ["ka", "ro", "mi", "tel", "an", "su", "dor", "vi", "len", "pa", "qua", "ris", "to", "bel", "nu"]


def fact(subject: str, what: str, answer: str) -> str:
    return f"The {what} of the {subject} is {answer}."


def question(subject: str, what: str) -> str:
    return f"What is the {what} of the {subject}?"


def filler(rng: random.Random, words: int) -> str:
    made = ("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(words))
    return " ".join(made) + "."


def long_pdf() -> tuple[bytes, dict[int, int]]:
    """The PDF, and the page each fact is on (1-based). Decoys name a fact's subject with
    another attribute, or its attribute with another subject, on pages of their own."""
    rng = random.Random(37)
    pages = [filler(rng, rng.randint(90, 140)) for _ in range(PAGES)]
    fact_pages = dict(zip(range(len(FACTS)), rng.sample(range(PAGES), len(FACTS))))
    free = [p for p in range(PAGES) if p not in fact_pages.values()]
    for i, (subject, what, answer) in enumerate(FACTS):
        page = fact_pages[i]
        words = pages[page].split(" ")
        at = rng.randint(0, len(words))
        pages[page] = " ".join(words[:at] + [fact(subject, what, answer)] + words[at:])
        other_subject = FACTS[(i + 1) % len(FACTS)][0]
        for decoy in (f"The {rng.choice(OTHER_WHATS)} of the {subject} was never written down.",
                      f"Nobody recalls the {what} of the {other_subject} old hall."):
            page = rng.choice(free)
            pages[page] = f"{pages[page]} {decoy}"
    pdf = fpdf.FPDF()
    pdf.set_font("Helvetica", size=10)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 5, text)
    return bytes(pdf.output()), {i: p + 1 for i, p in fact_pages.items()}


def flat(text: str) -> str:
    return " ".join(text.split())  # the PDF's line breaks fall anywhere in a sentence


@pytest.fixture
def window(qtbot, tmp_path, isolated):
    from support.gguf_edit import rewrite_gguf

    # The tiny model with a longer context (its file says 512): room for five excerpts.
    model = rewrite_gguf(MODEL, tmp_path / "tiny-8k.gguf", set_kv={"mistral3.context_length": 8192})
    w = make_window(qtbot, tmp_path / "data", load=False)
    w.model_loading.load_model(str(model), "")
    qtbot.waitUntil(lambda: w.session.engine_info is not None, timeout=30000)
    yield w
    close_window(w)


def test_planted_facts_of_a_long_pdf_reach_the_prompt_and_their_pages_are_shown(qtbot, window, tmp_path, monkeypatch):
    data, fact_pages = long_pdf()
    path = tmp_path / "report.pdf"
    path.write_bytes(data)
    engine = window.worker.engine
    prompts = []
    generate_from = engine.generate_from

    def recording(prompt, *args, **kwargs):
        prompts.append(engine.tokenizer.decode(list(prompt.ids)))
        return generate_from(prompt, *args, **kwargs)
    engine.generate_from = recording
    placed = []
    window.worker.documentsPlaced.connect(lambda _rid, prompt: placed.append(prompt))
    window.session.param_overrides = dict(GREEDY, max_tokens=8, ignore_eos=False)

    drop_files(window.composer, [path])
    qtbot.waitUntil(lambda: not window.composer.checking, timeout=60000)
    assert window.composer.document_chips[0].label.text().startswith(f"report.pdf · {PAGES} pages")

    found = 0
    for i, (subject, what, answer_text) in enumerate(FACTS):
        script_logits(monkeypatch, ScriptedLogits(engine.tokenizer.encode(answer_text), engine.tokenizer.eos_id))
        reply_id = send(qtbot, window, question(subject, what))
        prompt = flat(prompts[-1])
        assert [p.mode for p in placed[-1].placements.values()] == ["retrieved"]
        # Not the whole document: the other facts are not all in this prompt.
        assert sum(fact(*f) in prompt for f in FACTS) < len(FACTS)
        hit = fact(subject, what, answer_text) in prompt
        found += hit
        stored = window.store.get_message(reply_id)
        assert stored.text == answer_text  # the scripted model's reply
        pages = [s["page"] for s in stored.tool["sources"]]
        assert all(s["file"] == "report.pdf" for s in stored.tool["sources"]) and len(pages) <= 5
        if hit:
            assert fact_pages[i] in pages  # the source names the fact's page
            def shown() -> str:
                shown_in = [w for w in window.view.widgets if w.message.id == reply_id]
                return shown_in[0].sources_text if shown_in and shown_in[0].sources_label.isVisible() else ""
            qtbot.waitUntil(lambda: bool(shown()), timeout=5000)  # the view redraws the finished reply
            assert shown().startswith("Sources: report.pdf p. ") and f"p. {fact_pages[i]}" in shown()
    assert window.worker.engine.context_size > 512  # the longer context took (the app plans at most 4k here)
    recall = found / len(FACTS)
    assert recall >= 0.9, f"recall@5 {recall:.2f} over {len(FACTS)} planted questions"

    # The sources come back with the chat after it is reopened.
    chat_id = window.session.current_chat_id
    reply = window.store.get_chat(chat_id).messages[-1]
    assert reply.role == "assistant" and reply.tool["sources"]
