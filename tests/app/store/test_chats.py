"""Chats: create, change, list, delete, branch, and a chat as engine input."""
from __future__ import annotations

import pytest

from tramontane.app.store import NotFoundError, StoreError
from tramontane.engine.api import ChatMessage, DocumentPart, ImagePart
from support.store_data import JPG, PNG, conversation, image_files


def test_create_get_update_list_delete(store):
    a = store.create_chat("Alpha", model_path="/models/m.gguf", projector_path="/models/mmproj.gguf",
                          system_prompt="Be brief.", settings={"temperature": 0.15, "max_tokens": 64})
    b = store.create_chat("Beta", remote_url="http://127.0.0.1:8080/v1", remote_model="mistral-small")
    chat = store.get_chat(a)
    assert (chat.title, chat.model_path, chat.projector_path, chat.system_prompt) == (
        "Alpha", "/models/m.gguf", "/models/mmproj.gguf", "Be brief.")
    assert chat.settings == {"temperature": 0.15, "max_tokens": 64}
    assert chat.messages == [] and chat.created_at <= chat.updated_at
    beta = store.get_chat_info(b)
    assert (beta.remote_url, beta.remote_model, beta.model_path) == ("http://127.0.0.1:8080/v1", "mistral-small", None)

    assert [c.id for c in store.list_chats()] == [b, a]  # most recent first
    store.add_message(a, "user", "hello")
    assert [c.id for c in store.list_chats()] == [a, b]
    assert store.list_chats()[0].message_count == 1
    store.rename_chat(b, "Beta renamed")
    assert [(c.id, c.title) for c in store.list_chats()] == [(b, "Beta renamed"), (a, "Alpha")]
    store.set_pinned(a, True)
    assert [c.id for c in store.list_chats()] == [a, b]  # pinned first
    store.update_chat(a, settings={"temperature": 0.0}, model_path=None)
    assert store.get_chat_info(a).settings == {"temperature": 0.0}
    assert store.get_chat_info(a).model_path is None

    store.delete_chat(a)
    assert [c.id for c in store.list_chats()] == [b]
    with pytest.raises(NotFoundError, match=f"chat {a} "):
        store.get_chat(a)
    with pytest.raises(NotFoundError):
        store.add_message(a, "user", "x")
    # ids are never reused, so stale ids in the GUI or an engine session key cannot alias
    assert store.create_chat() > b


def test_bad_chat_fields_are_refused(store):
    with pytest.raises(StoreError, match="'colour': unknown"):
        store.create_chat("x", colour="red")
    with pytest.raises(StoreError, match="'settings': expected a dict"):
        store.create_chat("x", settings=[1, 2])
    with pytest.raises(StoreError, match="'settings': not JSON"):
        store.create_chat("x", settings={"f": object()})
    with pytest.raises(StoreError, match="'title': expected text"):
        store.create_chat(None)


def test_branch_copies_up_to_message_and_shares_images(store):
    chat = store.create_chat("Trip", model_path="/m.gguf", system_prompt="sys", settings={"seed": 3})
    ids = conversation(store, chat, 3)
    branch = store.branch_chat(chat, ids[2])
    b = store.get_chat(branch)
    a = store.get_chat(chat)
    assert (b.title, b.model_path, b.system_prompt, b.settings) == ("Trip (branch)", "/m.gguf", "sys", {"seed": 3})
    assert [m.text for m in b.messages] == [m.text for m in a.messages[:3]]
    assert [m.images for m in b.messages] == [m.images for m in a.messages[:3]]
    assert {m.id for m in b.messages}.isdisjoint(ids)
    copy = store.duplicate_chat(chat, title="Copy")
    assert [m.text for m in store.get_chat(copy).messages] == [m.text for m in a.messages]
    files = image_files(store)
    store.delete_chat(chat)
    assert image_files(store) == files  # still used by the copies
    store.delete_chat(copy)
    assert len(image_files(store)) == 2  # only the branch's two questions remain
    with pytest.raises(NotFoundError, match="does not exist in chat"):
        store.branch_chat(branch, ids[0])  # a message of another chat


def test_engine_messages_keep_images_in_place(store):
    chat = store.create_chat(system_prompt="You describe images.")
    a, b = ImagePart(PNG, "a.png"), ImagePart(JPG, "b.jpg")
    sent = [
        ChatMessage("user", [a, "What is this?"]),
        ChatMessage("assistant", ["A thing."]),
        ChatMessage("user", ["Compare ", a, " with ", b, ""]),
        ChatMessage("user", ["text then image", b]),
    ]
    for message in sent:
        store.add_chat_message(chat, message)
    got = store.engine_messages(chat)
    assert got[0] == ChatMessage("system", ["You describe images."])
    expected = [ChatMessage(m.role, [p for p in m.parts if p != ""]) for m in sent]
    assert got[1:] == expected
    assert store.engine_messages(chat, include_system_prompt=False) == expected
    store.add_message(chat, "user", "two first", [a, b])
    assert store.engine_messages(chat)[-1].parts == [a, b, "two first"]
    # an edit that shortens the text keeps the images, at most at the end
    store.edit_message(store.get_chat(chat).messages[2].id, "Cmp")
    assert store.engine_messages(chat)[3].parts == ["Cmp", a, b]


def test_documents_and_images_at_one_offset_come_back_in_the_order_sent(store):
    """The store reads a message's images and documents as one ordered list: a document sent
    before an image at the same place in the text is still before it (it came back after)."""
    chat = store.create_chat()
    doc, image = DocumentPart(b"notes: the cat is grey", "notes.txt"), ImagePart(PNG, "a.png")
    sent = [ChatMessage("user", ["Read ", doc, image, " then ", image, doc]),
            ChatMessage("user", [doc, image, "x"])]
    for message in sent:
        store.add_chat_message(chat, message)
    assert store.engine_messages(chat, include_system_prompt=False) == sent
    first = store.get_chat(chat).messages[0]
    assert [a.name for a in first.attachments] == ["notes.txt", "a.png", "a.png", "notes.txt"]
    assert [a.name for a in first.images] == ["a.png", "a.png"] and len(first.documents) == 2


def test_update_settings_sets_and_removes_keys_keeping_the_others(store):
    chat = store.create_chat("Alpha", settings={"tools": True})
    assert store.update_chat_settings(chat, sampling={"max_tokens": 5}) == {"tools": True, "sampling": {"max_tokens": 5}}
    assert store.get_chat_info(chat).settings == {"tools": True, "sampling": {"max_tokens": 5}}
    store.update_chat_settings(chat, sampling=None, tools=False)
    assert store.get_chat_info(chat).settings == {"tools": False}
    with pytest.raises(NotFoundError, match="chat 999 "):
        store.update_chat_settings(999, sampling=None)
    with pytest.raises(StoreError, match="not JSON-serialisable"):
        store.update_chat_settings(chat, sampling={1, 2})
    assert store.get_chat_info(chat).settings == {"tools": False}  # the failed write left nothing


def test_a_branch_keeps_the_documents_and_outlives_the_original(store):
    """Issue 37 item 4: a branch holds its messages' documents (shared files, as images), in
    their place among the attachments; deleting the original chat leaves the branch's documents
    readable, and deleting the branch too removes the files."""
    chat = store.create_chat()
    doc = DocumentPart(b"# Report\n\nthe harbour wall is 40 m long", "report.md")
    sent = [ChatMessage("user", ["Read this ", doc, ImagePart(PNG, "a.png")]), ChatMessage.text("assistant", "Read.")]
    for message in sent:
        store.add_chat_message(chat, message)
    before = image_files(store)
    branch = store.branch_chat(chat)
    assert store.engine_messages(branch, include_system_prompt=False) == sent
    assert len(before) == 2 and image_files(store) == before  # the document and the image, shared, not copied
    store.delete_chat(chat)
    assert store.engine_messages(branch, include_system_prompt=False) == sent
    store.delete_chat(branch)
    assert image_files(store) == set()
