"""The composer's document chips say what a document takes (issue 37): its tokens whole,
counted on the job pool by the engine's own counter (the tiny model's tokenizer, through
documents/prompt.token_counter), or 'retrieval (5 excerpts)' when the room the context has
left is too small for it by the engine's rule (retrieval.place_documents); the cost line adds
the whole documents to the images against that room, as for images alone."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from support import FIXTURES  # noqa: E402
from tramontane.app.widgets.composer import Composer  # noqa: E402
from tramontane.engine.api import DocumentPart  # noqa: E402
from tramontane.engine.documents.block import document_block  # noqa: E402
from tramontane.engine.documents.extract import extract  # noqa: E402
from tramontane.engine.documents.prompt import token_counter  # noqa: E402
from tramontane.engine.documents.retrieval import RETRIEVAL_TOKENS  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402

NOTE = b"The boiler room key hangs behind the blue door.\n"
LONG = b"".join(b"## Pier %d\n\nThe crane of pier %d lifts cargo every morning.\n\n" % (i, i) for i in range(400))


@pytest.fixture(scope="module")
def count_text():
    engine = LocalEngine(FIXTURES / "mistral3_tiny-f32.gguf", None, device="cpu")
    yield token_counter(engine.count_tokens)
    engine.close()


@pytest.fixture
def composer(qtbot, count_text):
    c = Composer()
    qtbot.addWidget(c)
    c.set_token_counter(count_text)
    c.show()
    return c


def attach(qtbot, composer, data: bytes, name: str):
    assert composer.add_document(DocumentPart(data, name))
    qtbot.waitUntil(lambda: not composer.checking, timeout=30000)
    return composer.document_chips[-1]


def test_a_document_chip_shows_its_tokens_and_the_room_left(qtbot, composer, count_text):
    tokens = count_text(document_block(extract(NOTE, "key.md")))
    assert tokens > 10
    composer.set_context_room(50_000)
    chip = attach(qtbot, composer, NOTE, "key.md")
    assert chip.label.text() == f"key.md · {tokens:,} tokens"
    assert composer.images_cost.isVisibleTo(composer)
    assert composer.images_cost.text() == f"1 document: {tokens:,} tokens of the 50,000 the context has left"
    composer.set_context_room(None)  # no local context known: the cost alone
    assert composer.images_cost.text() == f"1 document: {tokens:,} tokens"


def test_a_document_too_long_for_the_room_says_retrieval(qtbot, composer, count_text):
    long_tokens = count_text(document_block(extract(LONG, "harbour.md")))
    short_tokens = count_text(document_block(extract(NOTE, "key.md")))
    assert long_tokens > RETRIEVAL_TOKENS + short_tokens
    room = long_tokens + short_tokens - 1  # one token short of both whole: the long one is searched
    composer.set_context_room(room)
    short = attach(qtbot, composer, NOTE, "key.md")
    long = attach(qtbot, composer, LONG, "harbour.md")
    assert (short.tokens, long.tokens) == (short_tokens, long_tokens)
    assert (short.mode, long.mode) == ("whole", "retrieved")
    assert long.label.text() == "harbour.md · retrieval (5 excerpts)"
    assert short.label.text() == f"key.md · {short_tokens:,} tokens"
    assert composer.images_cost.text() == f"1 document: {short_tokens:,} tokens of the {room:,} the context has left"
    composer.set_context_room(room + 1)  # exactly room for both: both whole
    assert (short.mode, long.mode) == ("whole", "whole")
    composer.set_context_room(10 ** 6)
    assert long.label.text() == f"harbour.md · {long_tokens:,} tokens"
    assert composer.images_cost.text().startswith(f"2 documents: {short_tokens + long_tokens:,} tokens of the 1,000,000")
    long.remove_button.click()
    assert composer.images_cost.text() == f"1 document: {short_tokens:,} tokens of the 1,000,000 the context has left"


def test_without_a_counter_the_chip_shows_its_name_and_pages(qtbot, composer):
    composer.set_token_counter(None)
    composer.set_context_room(4096)
    chip = attach(qtbot, composer, NOTE, "key.md")
    assert chip.label.text() == "key.md" and chip.tokens is None
    assert not composer.images_cost.isVisibleTo(composer)
