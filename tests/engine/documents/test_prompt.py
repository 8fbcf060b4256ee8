"""Documents into the prompt (documents_prompt): a whole document is a text chunk before the
question in the message that attached it, token-exact with mistral-common's encoding of that
chunk and the question, and the next turn's prompt starts with every token of this one (the KV
prefix is reused); a long one is retrieved: its note where it was attached, the excerpts that
hold the planted facts before the newest question, their sources; scanned pages as images
with a tower, one sentence without. Files: fpdf2 PDFs; tokens: Mistral's real tekken
tokenizer, counted through our encoder."""
from __future__ import annotations

import json
import random

import pytest

from tramontane.engine.api import ChatMessage, DocumentPart, ImagePart
from tramontane.engine.documents.block import document_block, retrieved_note
from tramontane.engine.documents.document import DocumentError
from tramontane.engine.documents.extract import extract
from tramontane.engine.documents.prompt import documents_prompt, token_counter
from tramontane.engine.documents.retrieval import DocumentIndex
from tramontane.engine.mistral3.chat_format import encode_chat
from tramontane.engine.mistral3.config import VisionConfig
from tramontane.engine.mistral3.tokenizer import Tokenizer

from support.tekken_versions import tekken_tokenizer

fpdf = pytest.importorskip("fpdf")
pytest.importorskip("mistral_common")
from mistral_common.protocol.instruct.chunk import TextChunk  # noqa: E402
from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage  # noqa: E402
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

SMALL_TOWER = VisionConfig(112, 16, 2, 64, 128, 2, 4, 1e-5, (0.5,) * 3, (0.5,) * 3, "silu", 1e4, 64, "mmproj")
FILLER = ("quarterly ledger shipment harbour crane invoice weather timber schedule "
          "northern freight customs office lantern bridge pier vessel cargo manifest").split()
FACTS = [("The lighthouse keeper is named Ottoline Brack.", "Who keeps the lighthouse?", "Ottoline"),
         ("The harbour toll for barges is nineteen florins.", "What toll do barges pay?", "nineteen"),
         ("Dredging of the eastern basin begins in Sextember.", "When does dredging of the eastern basin begin?", "Sextember"),
         ("The pilot boat Kestrel carries a green pennant.", "Which pennant does the pilot boat carry?", "green")]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return tekken_tokenizer()


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> MistralTokenizer:
    """mistral-common's v7 tekken tokenizer from its own tekken_240911.json (as test_chat_format's)."""
    data = json.loads((MistralTokenizer._data_path() / "tekken_240911.json").read_text(encoding="utf-8"))
    data["config"]["version"] = "v7"
    path = tmp_path_factory.mktemp("mc") / "tekken_240911_v7.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return MistralTokenizer.from_file(str(path))


def counter(tok):
    return lambda messages: len(encode_chat(tok, messages).ids)


def text_pdf(pages: list[str]) -> bytes:
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=10)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 5, text)
    return bytes(pdf.output())


def planted_pdf(pages: int, seed: int = 3) -> tuple[bytes, dict[int, int]]:
    rng = random.Random(seed)
    where = dict(zip(range(len(FACTS)), rng.sample(range(1, pages + 1), len(FACTS))))
    on_page = {page: i for i, page in where.items()}
    texts = []
    for page in range(1, pages + 1):
        sentences = [" ".join(rng.choices(FILLER, k=12)).capitalize() + "." for _ in range(12)]
        if page in on_page:
            sentences.insert(rng.randint(0, len(sentences)), FACTS[on_page[page]][0])
        texts.append(" ".join(sentences))
    return text_pdf(texts), where


def part_of(data: bytes, name: str) -> DocumentPart:
    return DocumentPart(data, name)


def test_a_conversation_without_documents_is_left_as_it_is(tok):
    messages = [ChatMessage.text("system", "Be brief."), ChatMessage.text("user", "Hi")]
    prompt = documents_prompt(messages, counter(tok), 4096, 256)
    assert prompt.messages == messages and all(a is b for a, b in zip(prompt.messages, messages))
    assert prompt.placements == {} and prompt.sources == [] and prompt.notes == []


def test_a_whole_document_is_a_chunk_before_the_question_and_its_prefix_stays(tok, ref):
    data = text_pdf(["The boiler room key hangs behind the blue door.", "Page two says the boiler is serviced in May."])
    part = part_of(data, "boiler.pdf")
    turn1 = [ChatMessage("user", [part, "Where is the key?"])]
    prompt = documents_prompt(turn1, counter(tok), 8192, 512)
    assert prompt.mode_of(part.sha256) == "whole"
    block = document_block(extract(data, "boiler.pdf"))
    assert "--- page 2 ---" in block and "behind the blue door" in block
    assert prompt.messages[0].parts == [block, "Where is the key?"]
    ids1 = encode_chat(tok, prompt.messages).ids
    expected = ref.encode_chat_completion(ChatCompletionRequest(messages=[
        UserMessage(content=[TextChunk(text=block), TextChunk(text="Where is the key?")])])).tokens
    assert ids1 == expected
    # the next turn: the same bytes through the document and the first question, then more
    turn2 = turn1 + [ChatMessage.text("assistant", "Behind the blue door."), ChatMessage.text("user", "And the service?")]
    prompt2 = documents_prompt(turn2, counter(tok), 8192, 512)
    ids2 = encode_chat(tok, prompt2.messages).ids
    assert ids2[:len(ids1)] == ids1 and len(ids2) > len(ids1)
    assert ids2 == ref.encode_chat_completion(ChatCompletionRequest(messages=[
        UserMessage(content=[TextChunk(text=block), TextChunk(text="Where is the key?")]),
        AssistantMessage(content="Behind the blue door."), UserMessage(content="And the service?")])).tokens


def test_the_room_decides_whole_or_retrieved(tok):
    data = text_pdf([" ".join(FILLER * 3)] * 4)
    part = part_of(data, "filler.pdf")
    messages = [ChatMessage("user", [part, "What is in it?"])]
    count = counter(tok)
    whole = documents_prompt(messages, count, 100_000, 512)
    tokens = whole.placements[part.sha256].tokens
    assert tokens == token_counter(count)(document_block(extract(data, "filler.pdf")))
    conversation = count([ChatMessage("user", [retrieved_note(whole.placements[part.sha256].document), "What is in it?"])])
    exactly = conversation + 512 + tokens
    assert documents_prompt(messages, count, exactly, 512).mode_of(part.sha256) == "whole"
    assert documents_prompt(messages, count, exactly - 1, 512).mode_of(part.sha256) == "retrieved"


def test_a_long_document_is_retrieved_with_the_chunks_that_hold_the_facts(tok, tmp_path):
    data, where = planted_pdf(60)
    part = part_of(data, "harbour.pdf")
    history = [ChatMessage("user", [part, "I attached the harbour report."]), ChatMessage.text("assistant", "Noted.")]
    with DocumentIndex(tmp_path / "chat.sqlite3") as index:
        found = 0
        for i, (_, question, answer) in enumerate(FACTS):
            prompt = documents_prompt(history + [ChatMessage.text("user", question)], counter(tok), 4096, 512, index=index)
            assert prompt.mode_of(part.sha256) == "retrieved"
            attached, last = prompt.messages[0], prompt.messages[-1]
            assert attached.parts == [retrieved_note(part.document or extract(data, "harbour.pdf")),
                                      "I attached the harbour report."]
            assert prompt.messages[1] == history[1]
            excerpts, asked = last.parts
            assert asked == question and excerpts.startswith("<excerpts>\n[1] harbour.pdf, page ")
            found += answer in excerpts and any(s.page == where[i] for s in prompt.sources)
            assert all(s.file == "harbour.pdf" for s in prompt.sources) and 1 <= len(prompt.sources) <= 5
            assert len(encode_chat(tok, prompt.messages).ids) <= 4096 - 512
        assert found == len(FACTS)
        assert [row[0] for row in index.documents()] == [part.sha256]  # indexed once, over four questions


def test_without_an_index_a_temporary_one_is_used_and_removed(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    data, where = planted_pdf(30)
    prompt = documents_prompt([ChatMessage("user", [part_of(data, "h.pdf"), FACTS[0][1]])], counter(tok), 2048, 256)
    assert FACTS[0][2] in prompt.messages[0].parts[1]
    assert list(tmp_path.iterdir()) == []


def test_a_document_attached_twice_is_placed_once(tok):
    data = text_pdf(["Ferry times: nine and five."])
    part = part_of(data, "ferry.pdf")
    again = DocumentPart(data, "ferry copy.pdf")
    messages = [ChatMessage("user", [part, "When?"]), ChatMessage.text("assistant", "Nine."),
                ChatMessage("user", [again, "Sure?"])]
    prompt = documents_prompt(messages, counter(tok), 8192, 256)
    assert list(prompt.placements) == [part.sha256]
    assert prompt.messages[0].parts[0].startswith('<document name="ferry.pdf"') and prompt.messages[2].parts == ["Sure?"]


def scanned_pdf() -> bytes:
    import io

    from PIL import Image

    photo = Image.new("RGB", (200, 280), (255, 255, 255))
    photo.paste((0, 0, 0), (10, 10, 90, 130))
    png = io.BytesIO()
    photo.save(png, format="PNG")
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=12)
    pdf.add_page()
    pdf.cell(0, 10, "Typed cover page")
    pdf.add_page()
    pdf.image(io.BytesIO(png.getvalue()), x=0, y=0, w=210, h=297)
    return bytes(pdf.output())


def test_scanned_pages_go_as_images_with_a_tower_and_are_named_without(tok):
    data = scanned_pdf()
    messages = [ChatMessage("user", [part_of(data, "letter.pdf"), "What does it say?"])]
    seen = documents_prompt(messages, counter(tok), 8192, 256, vision=SMALL_TOWER)
    block, image, question = seen.messages[0].parts
    assert "[a scanned page: its image is attached]" in block and question == "What does it say?"
    assert isinstance(image, ImagePart) and image.name == "letter.pdf, page 2" and seen.notes == []
    blind = documents_prompt(messages, counter(tok), 8192, 256)
    assert [type(p) for p in blind.messages[0].parts] == [str, str]
    assert "[a scanned page without a text layer: not read]" in blind.messages[0].parts[0]
    assert blind.notes == ["letter.pdf: page 2 is a scan without a text layer, and this model has no vision tower to read them."]


def test_bad_documents_are_one_sentence(tok):
    with pytest.raises(DocumentError, match=r"^notes\.txt: the file holds binary data"):
        documents_prompt([ChatMessage("user", [part_of(b"\x00\x01binary", "notes.txt"), "Read it"])], counter(tok), 4096, 256)
    with pytest.raises(DocumentError, match="only be attached to user messages"):
        documents_prompt([ChatMessage("assistant", [part_of(b"hello", "a.txt")])], counter(tok), 4096, 256)


def test_an_engine_that_cannot_count_is_estimated_from_bytes():
    count = token_counter(lambda messages: None)
    assert count("abcdefg") == 3 and count("") == 0
