"""Export to Markdown and JSON, and import the JSON back (round trip equal)."""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from urllib.parse import unquote

import pytest

from tramontane.app.store import Store
from tramontane.app.store.export import (
    ChatFileError,
    chat_from_json,
    chat_to_json,
    export_json,
    export_markdown,
    import_json,
)
from tramontane.engine.api import ChatMessage, GenerationStats, ImagePart

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 3
JPG = b"\xff\xd8\xff\xe0" + b"\x00jpeg" * 50


def rich_chat(s: Store) -> int:
    chat = s.create_chat("Vacances à Perpignan — [draft]", model_path="/models/Ministral-3-3B.gguf",
                         projector_path="/models/mmproj.gguf", system_prompt="Line one.\n\nLine three.",
                         settings={"temperature": 0.15, "top_p": 0.9, "stop": ["</s>"]})
    s.add_chat_message(chat, ChatMessage("user", ["Compare ", ImagePart(PNG, "beach photo.png"), " and ",
                                                  ImagePart(JPG, "hill.jpg")]))
    reply = s.begin_reply(chat)
    s.finish_reply(reply, "The **beach** is flatter.\n\n```py\nprint('x')\n```",
                   GenerationStats(prompt_tokens=812, reused_tokens=0, generated_tokens=17, ttft_s=0.42,
                                   prefill_tok_s=1930.5, decode_tok_s=31.25, finish_reason="stop"))
    s.add_message(chat, "user", "Again with the same photo", [ImagePart(PNG, "beach photo.png")])
    cut = s.begin_reply(chat)
    s.checkpoint_reply(cut, "It was cut he", force=True)
    s.set_pinned(chat, True)
    s.db.conn.execute("UPDATE messages SET state = 'interrupted', finish_reason = 'interrupted' WHERE id = ?", (cut,))
    s.add_message(chat, "tool", '{"result": 42}')
    return chat


def test_json_round_trip_is_equal(store, tmp_path):
    chat = rich_chat(store)
    first = chat_to_json(store, chat)
    path = export_json(store, chat, tmp_path / "chat.json")
    imported = import_json(store, path)
    assert imported != chat
    second = chat_to_json(store, imported)
    assert second == first
    a, b = store.get_chat(chat), store.get_chat(imported)
    for field in ("title", "created_at", "updated_at", "model_path", "projector_path", "remote_url",
                  "remote_model", "system_prompt", "settings", "pinned"):
        assert getattr(a, field) == getattr(b, field), field
    strip = lambda m: {k: v for k, v in vars(m).items() if k not in ("id", "chat_id")}  # noqa: E731
    assert [strip(m) for m in a.messages] == [strip(m) for m in b.messages]
    assert store.engine_messages(chat) == store.engine_messages(imported)
    # images are shared by content, not duplicated
    assert len(list(store.images_dir.glob("*/*"))) == 2
    # the file is self-contained: images are inside as base64
    doc = json.loads(path.read_text(encoding="utf-8"))
    images = doc["messages"][0]["images"]
    assert [base64.b64decode(i["data_base64"]) for i in images] == [PNG, JPG]
    assert [i["text_offset"] for i in images] == [8, 13]


def test_json_import_into_another_data_dir(store, tmp_path):
    path = export_json(store, rich_chat(store), tmp_path / "c.json")
    with Store(tmp_path / "elsewhere") as other:
        chat = import_json(other, path)
        assert chat_to_json(other, chat) == json.loads(path.read_text(encoding="utf-8"))
        assert other.engine_messages(chat)[1].images[1].data == JPG


def test_streaming_reply_exports_and_imports_as_interrupted(store):
    chat = store.create_chat()
    reply = store.begin_reply(chat)
    store.checkpoint_reply(reply, "partial", force=True)
    doc = chat_to_json(store, chat)
    assert doc["messages"][0]["state"] == "streaming"
    imported = store.get_chat(chat_from_json(store, doc))
    assert [(m.state, m.text) for m in imported.messages] == [("interrupted", "partial")]


def _bad(doc, mutate):
    doc = copy.deepcopy(doc)
    mutate(doc)
    return doc


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d.update(version=7), "version"),
    (lambda d: d.pop("chat"), "chat"),
    (lambda d: d["chat"].update(title=3), "chat.title"),
    (lambda d: d["chat"].update(created_at="yesterday"), "chat.created_at"),
    (lambda d: d["chat"].update(settings=[1]), "chat.settings"),
    (lambda d: d["chat"].update(pinned="yes"), "chat.pinned"),
    (lambda d: d.update(messages={}), "messages"),
    (lambda d: d["messages"][1].update(role="wizard"), "messages[1].role"),
    (lambda d: d["messages"][1].update(state="thinking"), "messages[1].state"),
    (lambda d: d["messages"][1]["stats"].update(generated_tokens=-1), "messages[1].stats.generated_tokens"),
    (lambda d: d["messages"][1]["stats"].update(ttft_s="fast"), "messages[1].stats.ttft_s"),
    (lambda d: d["messages"][0]["images"][1].update(data_base64="not base64!"), "messages[0].images[1].data_base64"),
    (lambda d: d["messages"][0]["images"][0].update(sha256="0" * 64), "messages[0].images[0].sha256"),
    (lambda d: d["messages"][0]["images"][0].update(text_offset=10_000), "messages[0].images[0].text_offset"),
    (lambda d: d["messages"][1].update(reasoning="thought"), "messages[1].reasoning"),
    (lambda d: d["messages"][1].update(reasoning={"text": 3}), "messages[1].reasoning.text"),
    (lambda d: d["messages"][1].update(reasoning={"text": "t", "seconds": -1}), "messages[1].reasoning.seconds"),
    (lambda d: d["messages"][1].update(reasoning={"text": "t", "cut": "no"}), "messages[1].reasoning.cut"),
])
def test_bad_json_names_file_and_field(store, tmp_path, mutate, field):
    doc = _bad(chat_to_json(store, rich_chat(store)), mutate)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    before = len(store.list_chats())
    with pytest.raises(ChatFileError) as info:
        import_json(store, path)
    assert str(info.value).startswith(f"{path}: {field}"), str(info.value)
    assert len(store.list_chats()) == before  # nothing half-imported


def test_unreadable_json_files(store, tmp_path):
    with pytest.raises(ChatFileError, match="missing.json: cannot read"):
        import_json(store, tmp_path / "missing.json")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json", encoding="utf-8")
    with pytest.raises(ChatFileError, match="garbage.json: not JSON"):
        import_json(store, garbage)
    garbage.write_text("[]", encoding="utf-8")
    with pytest.raises(ChatFileError, match="garbage.json: expected a JSON object"):
        import_json(store, garbage)
    garbage.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")  # was a RecursionError
    with pytest.raises(ChatFileError, match="garbage.json: not a chat export: JSON nested too deeply"):
        import_json(store, garbage)


def test_markdown_export_with_image_files_beside_it(store, tmp_path):
    chat = rich_chat(store)
    md_path = export_markdown(store, chat, tmp_path / "out" / "My chat.md")
    text = md_path.read_text(encoding="utf-8")
    assert text.startswith("# Vacances à Perpignan — [draft]\n")
    assert "- Model: `Ministral-3-3B.gguf`" in text and "- Vision projector: `mmproj.gguf`" in text
    assert "## System prompt\n\n> Line one.\n>\n> Line three." in text
    assert "The **beach** is flatter.\n\n```py\nprint('x')\n```" in text
    assert "*reply interrupted*" in text and "It was cut he" in text
    assert "*17 tokens · 31.2 tok/s*" in text
    headings = re.findall(r"^## (\w+)$", text, flags=re.M)
    assert headings == ["User", "Assistant", "User", "Assistant", "Tool"]
    links = re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", text)
    assert [alt for alt, _ in links] == ["beach photo.png", "hill.jpg", "beach photo.png"]
    for (_, link), data in zip(links, [PNG, JPG, PNG]):
        assert (md_path.parent / unquote(link)).read_bytes() == data
        assert unquote(link).startswith("My chat_images/")
    # images sit where they were in the message: "Compare ", image, " and ", image
    first_user = text.split("## User\n\n", 1)[1].split("## Assistant", 1)[0]
    assert re.sub(r"\(.*?\)", "()", first_user).split("\n\n")[:4] == [
        "Compare", "![beach photo.png]()", "and", "![hill.jpg]()"]
    assert sorted(p.name for p in (md_path.parent / "My chat_images").iterdir()) == sorted(
        f"{hashlib.sha256(d).hexdigest()}.{e}" for d, e in [(PNG, "png"), (JPG, "jpg")])


def test_markdown_for_a_remote_chat(store, tmp_path):
    chat = store.create_chat("R", remote_url="http://127.0.0.1:8080/v1", remote_model="ministral")
    store.add_message(chat, "user", "hi")
    text = export_markdown(store, chat, tmp_path / "r.md").read_text(encoding="utf-8")
    assert "- Server: http://127.0.0.1:8080/v1, model `ministral`" in text
    assert not (tmp_path / "r_images").exists()


# --------------------------------------------------------------------------- documents (issue 37)

NOTES_MD = ("# Setup\n\nTurn the boiler valve twice.\n\n# Service\n\nThe boiler is serviced in May.\n" * 3).encode()


def boiler_pdf() -> bytes:
    fpdf = pytest.importorskip("fpdf")
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=10)
    for text in ("The boiler room key hangs behind the blue door.", "Page two: the boiler is serviced in May."):
        pdf.add_page()
        pdf.multi_cell(0, 5, text)
    return bytes(pdf.output())


def document_chat(s: Store) -> tuple[int, bytes]:
    """A whole PDF (its reply cites nothing) beside an image, then a Markdown file whose reply
    was given excerpts of it (the sources the window saved)."""
    from tramontane.engine.api import DocumentPart

    pdf = boiler_pdf()
    chat = s.create_chat("Boiler", model_path="/models/tiny.gguf")
    s.add_chat_message(chat, ChatMessage("user", [ImagePart(PNG, "room.png"), DocumentPart(pdf, "boiler.pdf"),
                                                  "Where is the key?"]))
    s.finish_reply(s.begin_reply(chat), "Behind the blue door.")
    s.add_chat_message(chat, ChatMessage("user", ["And this: ", DocumentPart(NOTES_MD, "notes.md"), "when?"]))
    reply = s.begin_reply(chat)
    s.finish_reply(reply, "In May.")
    s.set_reply_sources(reply, [{"file": "notes.md", "page": None, "heading": "Service"},
                                {"file": "notes.md", "page": None, "heading": "Setup"}])
    return chat, pdf


def test_json_export_carries_documents_and_how_they_were_read(store, tmp_path):
    from tramontane.engine.documents.block import document_block
    from tramontane.engine.documents.extract import extract

    chat, pdf = document_chat(store)
    path = export_json(store, chat, tmp_path / "boiler.json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    [whole] = doc["messages"][0]["documents"]
    assert base64.b64decode(whole["data_base64"]) == pdf and whole["sha256"] == hashlib.sha256(pdf).hexdigest()
    assert (whole["name"], whole["kind"], whole["mode"], whole["pages"]) == ("boiler.pdf", "pdf", "whole", 2)
    assert whole["text"] == document_block(extract(pdf, "boiler.pdf")) and "behind the blue door" in whole["text"]
    assert "sources" not in whole and [i["name"] for i in doc["messages"][0]["images"]] == ["room.png"]
    [retrieved] = doc["messages"][2]["documents"]
    assert (retrieved["name"], retrieved["kind"], retrieved["mode"], retrieved["text_offset"]) == (
        "notes.md", "markdown", "retrieved", len("And this: "))
    assert retrieved["sources"] == [{"file": "notes.md", "page": None, "heading": "Service"},
                                    {"file": "notes.md", "page": None, "heading": "Setup"}]
    assert "text" not in retrieved and "pages" not in retrieved


def test_json_import_restores_documents(store, tmp_path):
    from tramontane.engine.api import DocumentPart

    chat, pdf = document_chat(store)
    first = chat_to_json(store, chat)
    with Store(tmp_path / "elsewhere") as other:
        imported = import_json(other, export_json(store, chat, tmp_path / "c.json"))
        assert chat_to_json(other, imported) == first
        messages = other.engine_messages(imported)
        assert messages == store.engine_messages(chat)
        parts = messages[0].parts
        assert [type(p) for p in parts] == [ImagePart, DocumentPart, str]
        assert (parts[1].data, parts[1].name) == (pdf, "boiler.pdf")
        assert messages[2].parts == ["And this: ", DocumentPart(NOTES_MD, "notes.md"), "when?"]
        assert [d.name for d in other.get_chat(imported).messages[2].documents] == ["notes.md"]
        assert other.get_chat(imported).messages[3].tool["sources"][0]["heading"] == "Service"


def document_then_image_chat(s: Store) -> int:
    """A document sent before an image at one text offset (the store keeps that order)."""
    from tramontane.engine.api import DocumentPart

    chat = s.create_chat("Order", model_path="/models/tiny.gguf")
    s.add_chat_message(chat, ChatMessage("user", ["See ", DocumentPart(NOTES_MD, "notes.md"), ImagePart(PNG, "a.png"),
                                                  "here", ImagePart(JPG, "b.jpg")]))
    return chat


def test_json_keeps_a_document_before_an_image_at_one_offset(store, tmp_path):
    from tramontane.engine.api import DocumentPart

    chat = document_then_image_chat(store)
    first = chat_to_json(store, chat)
    with Store(tmp_path / "elsewhere") as other:
        imported = import_json(other, export_json(store, chat, tmp_path / "order.json"))
        assert [a.name for a in other.get_chat(imported).messages[0].attachments] == ["notes.md", "a.png", "b.jpg"]
        assert other.engine_messages(imported)[0].parts == [
            "See ", DocumentPart(NOTES_MD, "notes.md"), ImagePart(PNG, "a.png"), "here", ImagePart(JPG, "b.jpg")]
        assert chat_to_json(other, imported) == first
    [message] = first["messages"]
    assert [(i["name"], i["position"]) for i in message["images"]] == [("a.png", 1), ("b.jpg", 2)]
    assert [(d["name"], d["position"]) for d in message["documents"]] == [("notes.md", 0)]


def test_json_without_positions_reads_as_before(store):
    """An export written before positions: by offset, images before documents at one offset."""
    doc = chat_to_json(store, document_then_image_chat(store))
    for entry in doc["messages"][0]["images"] + doc["messages"][0]["documents"]:
        del entry["position"]
    imported = chat_from_json(store, doc)
    assert [a.name for a in store.get_chat(imported).messages[0].attachments] == ["a.png", "notes.md", "b.jpg"]


@pytest.mark.parametrize("mutate,problem", [
    (lambda d: d["messages"][0]["images"][1].pop("position"), "images[1].position: missing"),
    (lambda d: d["messages"][0]["images"][1].update(position=1), "images[1].position: expected one of 0..2"),
    (lambda d: d["messages"][0]["documents"][0].update(position=3), "documents[0].position: expected one of 0..2"),
    (lambda d: d["messages"][0]["documents"][0].update(position=True), "documents[0].position: expected one of"),
])
def test_bad_positions_name_the_field(store, mutate, problem):
    doc = _bad(chat_to_json(store, document_then_image_chat(store)), mutate)
    with pytest.raises(ChatFileError) as info:
        chat_from_json(store, doc, source="p.json")
    assert str(info.value).startswith(f"p.json: messages[0].{problem}"), str(info.value)


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["messages"][0]["documents"][0].update(data_base64="not base64!"), "messages[0].documents[0].data_base64"),
    (lambda d: d["messages"][0]["documents"][0].update(sha256="0" * 64), "messages[0].documents[0].sha256"),
    (lambda d: d["messages"][2]["documents"][0].update(text_offset=999), "messages[2].documents[0].text_offset"),
    (lambda d: d["messages"][2]["documents"][0].update(mode="skimmed"), "messages[2].documents[0].mode"),
    (lambda d: d["messages"][2]["documents"][0].pop("name"), "messages[2].documents[0].name"),
    (lambda d: d["messages"][2].update(documents={}), "messages[2].documents"),
])
def test_bad_documents_in_json_name_the_field(store, tmp_path, mutate, field):
    doc = _bad(chat_to_json(store, document_chat(store)[0]), mutate)
    before = len(store.list_chats())
    with pytest.raises(ChatFileError) as info:
        chat_from_json(store, doc, source="d.json")
    assert str(info.value).startswith(f"d.json: {field}"), str(info.value)
    assert len(store.list_chats()) == before


def test_markdown_lists_documents_with_their_files_beside_it(store, tmp_path):
    chat, pdf = document_chat(store)
    md_path = export_markdown(store, chat, tmp_path / "Boiler chat.md")
    text = md_path.read_text(encoding="utf-8")
    listed = re.findall(r"^- Document: \[([^\]]*)\]\(([^)]+)\) — (.*)$", text, flags=re.M)
    assert [(name, words) for name, _, words in listed] == [
        ("boiler.pdf", "PDF, 2 pages, read whole"),
        ("notes.md", "Markdown, searched (too long to read whole): Sources: notes.md, Service, Setup")]
    for (_, link, _), data in zip(listed, [pdf, NOTES_MD]):
        assert unquote(link).startswith("Boiler chat_documents/")
        assert (md_path.parent / unquote(link)).read_bytes() == data
    assert unquote(listed[0][1]).endswith(f"{hashlib.sha256(pdf).hexdigest()}.pdf")
    second_user = text.split("## User\n\n")[2]
    assert second_user.startswith("And this: when?\n\n- Document: [notes.md](")  # after the text
