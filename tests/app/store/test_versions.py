"""Versions of a regenerated reply: kept, shown one at a time, restored after a failed
regenerate, exported and imported."""
from __future__ import annotations

import json

from tramontane.app.store import Store
from tramontane.app.store.export import export_json, export_markdown, import_json
from tramontane.engine.api import GenerationStats


def chat_with_reply(store: Store) -> tuple[int, int]:
    chat = store.create_chat("c")
    store.add_message(chat, "user", "Hi")
    reply = store.add_message(chat, "assistant", "first", stats=GenerationStats(prompt_tokens=5, generated_tokens=1),
                              finish_reason="stop")
    return chat, reply


def test_regenerate_keeps_every_version_and_shows_one(tmp_path):
    with Store(tmp_path) as store:
        chat, reply = chat_with_reply(store)
        store.add_message(chat, "user", "later")  # goes with the regenerate
        assert store.regenerate_reply(reply) == reply
        m = store.get_chat(chat).messages
        assert [x.role for x in m] == ["user", "assistant"] and m[1].state == "streaming"
        assert (m[1].versions, m[1].version) == (2, 1)  # the one being written is the last
        assert store.engine_messages(chat)[-1].role == "user"  # not the streaming reply
        store.finish_reply(reply, "second", GenerationStats(prompt_tokens=5, generated_tokens=2, finish_reason="stop"))
        store.regenerate_reply(reply)
        store.finish_reply(reply, "third", GenerationStats(prompt_tokens=5, generated_tokens=3, finish_reason="stop"))
        got = store.get_message(reply)
        assert (got.text, got.versions, got.version) == ("third", 3, 2)
        assert [v["text"] for v in store.reply_versions(reply)] == ["first", "second", "third"]
        store.show_version(reply, 0)
        got = store.get_message(reply)
        assert (got.text, got.generated_tokens, got.version) == ("first", 1, 0)
        assert store.engine_messages(chat)[-1].text_content == "first"  # later turns build on it
        assert [v["shown"] for v in store.reply_versions(reply)] == [1, 0, 0]


def test_a_failed_regenerate_with_nothing_written_gives_the_old_reply_back(tmp_path):
    with Store(tmp_path) as store:
        chat, reply = chat_with_reply(store)
        store.regenerate_reply(reply)
        store.abandon_reply(reply)
        got = store.get_message(reply)
        assert (got.text, got.state, got.versions) == ("first", "complete", 1)
        other = store.begin_reply(chat)  # a plain new reply that fails: gone
        store.abandon_reply(other)
        assert [m.id for m in store.get_chat(chat).messages][-1] == reply


def test_versions_are_exported_and_imported(tmp_path):
    with Store(tmp_path / "a") as store:
        chat, reply = chat_with_reply(store)
        store.regenerate_reply(reply)
        store.finish_reply(reply, "second", GenerationStats(generated_tokens=2, finish_reason="stop"))
        store.show_version(reply, 0)
        path = export_json(store, chat, tmp_path / "c.json")
        doc = json.loads(path.read_text())
        versions = doc["messages"][1]["versions"]
        assert [(v["text"], v["shown"]) for v in versions] == [("first", True), ("second", False)]
        assert "version 1 of 2" in export_markdown(store, chat, tmp_path / "c.md").read_text()
    with Store(tmp_path / "b") as store:
        new = import_json(store, path)
        got = store.get_chat(new).messages[1]
        assert (got.text, got.versions, got.version) == ("first", 2, 0)
        assert [v["text"] for v in store.reply_versions(got.id)] == ["first", "second"]


def test_a_branch_keeps_the_versions_of_its_replies(tmp_path):
    with Store(tmp_path) as store:
        chat, reply = chat_with_reply(store)
        store.regenerate_reply(reply)
        store.finish_reply(reply, "second", GenerationStats(prompt_tokens=5, generated_tokens=2, finish_reason="stop"))
        store.show_version(reply, 0)
        branch = store.branch_chat(chat)
        copy = store.get_chat(branch).messages[1]
        assert copy.id != reply
        assert (copy.text, copy.generated_tokens, copy.versions, copy.version) == ("first", 1, 2, 0)
        assert store.reply_versions(copy.id) == store.reply_versions(reply)
        store.show_version(copy.id, 1)  # the branch's versions are its own
        assert store.get_message(copy.id).text == "second" and store.get_message(reply).text == "first"
        store.delete_chat(chat)
        assert [v["text"] for v in store.reply_versions(copy.id)] == ["first", "second"]


def test_edit_versions_nest_and_their_images_go_with_the_chat(tmp_path):
    """Edits inside an older version stay with it; a hidden version's image is kept while any
    version holds it and its file goes with the last message that refers to it."""
    from tramontane.engine.api import ImagePart

    png = (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    with Store(tmp_path) as store:
        chat = store.create_chat("c")
        q1 = store.add_message(chat, "user", "q1")
        store.add_message(chat, "assistant", "a1")
        q2 = store.add_message(chat, "user", "q2", [ImagePart(png, "cat.png")])
        store.add_message(chat, "assistant", "a2")
        store.edit_as_version(q2, "q2 edited")  # q2: 2 versions, a2 hidden
        store.add_message(chat, "assistant", "a2 for the edit")
        store.edit_as_version(q1, "q1 edited")  # q1: 2 versions; a1, q2 (with its versions) hidden
        assert [m.text for m in store.get_chat(chat).messages] == ["q1 edited"]
        assert store.get_chat_info(chat).message_count == 1
        assert [c.id for c in store.search_chats("a2 for")] == [chat]  # a hidden version is still the chat's
        store.show_version(q1, 0)
        got = store.get_chat(chat).messages
        assert [(m.text, m.versions, m.version) for m in got] == [
            ("q1", 2, 0), ("a1", 1, 0), ("q2 edited", 2, 1), ("a2 for the edit", 1, 0)]
        store.show_version(q2, 0)
        assert [m.text for m in store.get_chat(chat).messages] == ["q1", "a1", "q2", "a2"]
        image = store.get_chat(chat).messages[2].images[0]
        assert image.path.is_file()
        store.show_version(q1, 1)  # the image is now only in hidden messages: kept
        assert image.path.is_file()
        store.truncate_after(q1, inclusive=True)  # q1 and every version after it go
        assert not image.path.exists()
        assert store.db.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
        assert store.integrity_check() == "ok"


def test_each_version_keeps_its_own_thought_through_show_branch_and_export(tmp_path):
    """A reasoning model's regenerated reply (issue 36): every version its own thought; shown,
    branched, exported and imported with it."""
    with Store(tmp_path / "data") as s:
        chat, reply = chat_with_reply(s)
        s.regenerate_reply(reply)
        assert s.get_message(reply).reasoning == ""  # the new version starts with no thought
        s.finish_reply(reply, "second", reasoning="think twice", reasoning_s=1.5)
        s.regenerate_reply(reply)
        s.finish_reply(reply, "", finish_reason="cancelled", reasoning="cut", reasoning_s=0.2, reasoning_open=True)
        kept = [(v["text"], v["reasoning"], v["reasoning_s"], v["reasoning_open"]) for v in s.reply_versions(reply)]
        assert kept == [("first", "", None, 0), ("second", "think twice", 1.5, 0), ("", "cut", 0.2, 1)]
        s.show_version(reply, 1)
        m = s.get_message(reply)
        assert (m.text, m.reasoning, m.reasoning_s, m.reasoning_open) == ("second", "think twice", 1.5, False)
        s.show_version(reply, 2)
        assert s.get_message(reply).reasoning_open
        branch = s.branch_chat(chat)
        copied = s.get_chat(branch).messages[-1]
        assert (copied.reasoning, copied.reasoning_open) == ("cut", True)
        assert [v["reasoning"] for v in s.reply_versions(copied.id)] == ["", "think twice", "cut"]
        doc = json.loads(export_json(s, chat, tmp_path / "c.json").read_text("utf-8"))
        assert doc["messages"][-1]["reasoning"] == {"text": "cut", "seconds": 0.2, "cut": True}
        assert "reasoning" not in doc["messages"][-1]["versions"][0]  # none: older exports read the same
        again = s.get_chat(import_json(s, tmp_path / "c.json")).messages[-1]
        assert (again.reasoning, again.reasoning_s, again.reasoning_open) == ("cut", 0.2, True)
        assert [(v["reasoning"], v["reasoning_open"]) for v in s.reply_versions(again.id)] == [
            ("", 0), ("think twice", 0), ("cut", 1)]
        md = export_markdown(s, chat, tmp_path / "c.md").read_text("utf-8")
        assert "<details><summary>Thought for less than a second (stopped)</summary>" in md and "> cut" in md
