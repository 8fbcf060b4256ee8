"""Search: case-insensitive substrings of titles and messages, FTS5 or a scan, kept in step."""
from __future__ import annotations

import random

import pytest

from tramontane.app.store import schema
from tramontane.app.store import Store


def _corpus(s: Store, rng: random.Random) -> dict[int, list[str]]:
    words = ["Mistral", "tramontane", "vent", "Wörld", "ÉCOLE", "50%_off", 'say "hi"', "a_b", "kv cache",
             "GPU", "prefill", "naïve", "北風", "x"]
    texts: dict[int, list[str]] = {}
    for i in range(12):
        title = " ".join(rng.sample(words, 2))
        chat = s.create_chat(title)
        texts[chat] = [title]
        for _ in range(rng.randint(0, 4)):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
            s.add_message(chat, rng.choice(["user", "assistant"]), text)
            texts[chat].append(text)
    return texts


QUERIES = ["mistral", "TRAMONTANE", "wörld", "WÖRLD", "école", "50%", "%", "_", "a_b", '"hi"', "kv c",
           "gpu", "fill", "naï", "北風", "北", "x", "zzz", "Mistral tramontane", "  vent  "]


def _expected(texts: dict[int, list[str]], query: str) -> set[int]:
    q = query.strip().lower()
    return {chat for chat, parts in texts.items() if any(q in p.lower() for p in parts)}


@pytest.mark.parametrize("fts", [True, False], ids=["fts5", "scan"])
def test_search_is_case_insensitive_substring_in_title_and_text(tmp_path, monkeypatch, fts):
    if not fts:
        monkeypatch.setattr(schema, "fts5_trigram_available", lambda: False)
    elif not schema.fts5_trigram_available():
        pytest.skip("this SQLite has no FTS5 trigram tokenizer")
    with Store(tmp_path) as s:
        assert s.search_method == ("fts5" if fts else "scan")
        texts = _corpus(s, random.Random(7))
        order = [c.id for c in s.list_chats()]
        for query in QUERIES:
            found = [c.id for c in s.search_chats(query)]
            assert set(found) == _expected(texts, query), query
            assert found == [c for c in order if c in found]  # same order as the list
        assert [c.id for c in s.search_chats("   ")] == order


def test_search_index_follows_edits_deletes_and_checkpoints(store):
    chat = store.create_chat("plain")
    m = store.add_message(chat, "user", "alpha beta")
    assert [c.id for c in store.search_chats("alpha")] == [chat]
    store.edit_message(m, "gamma delta")
    assert store.search_chats("alpha") == [] and [c.id for c in store.search_chats("gamma")] == [chat]
    reply = store.begin_reply(chat)
    store.checkpoint_reply(reply, "streamed epsilon", force=True)
    assert [c.id for c in store.search_chats("epsilon")] == [chat]
    store.finish_reply(reply, "final zeta")
    assert store.search_chats("epsilon") == [] and [c.id for c in store.search_chats("zeta")] == [chat]
    store.truncate_after(m)
    assert store.search_chats("zeta") == []
    store.delete_chat(chat)
    assert store.search_chats("gamma") == []


def test_search_index_rebuilt_after_an_open_without_fts5(tmp_path, monkeypatch):
    if not schema.fts5_trigram_available():
        pytest.skip("this SQLite has no FTS5 trigram tokenizer")
    with Store(tmp_path) as s:
        chat = s.create_chat("t")
        m = s.add_message(chat, "user", "before")
    monkeypatch.setattr(schema, "fts5_trigram_available", lambda: False)
    with Store(tmp_path) as s:  # writes while the index is not maintained
        assert s.search_method == "scan"
        s.edit_message(m, "after")
        s.add_message(chat, "assistant", "another")
    monkeypatch.undo()
    with Store(tmp_path) as s:
        assert s.search_method == "fts5"
        assert s.search_chats("before") == []
        assert [c.id for c in s.search_chats("after")] == [chat]
        assert [c.id for c in s.search_chats("another")] == [chat]
        assert s.integrity_check() == "ok"
        s.db.conn.execute("INSERT INTO message_search(message_search) VALUES ('integrity-check')")


@pytest.mark.parametrize("fts", [True, False], ids=["fts5", "scan"])
def test_search_finds_text_only_in_a_version_not_shown(tmp_path, monkeypatch, fts):
    """Issue 35, item 9: an edited message's first text, a regenerated reply's other reply and
    what followed a version not shown are still the chat's; search finds their chat."""
    if not fts:
        monkeypatch.setattr(schema, "fts5_trigram_available", lambda: False)
    elif not schema.fts5_trigram_available():
        pytest.skip("this SQLite has no FTS5 trigram tokenizer")
    with Store(tmp_path) as s:
        other = s.create_chat("other")
        s.add_message(other, "user", "nothing to see")
        chat = s.create_chat("trip")
        question = s.add_message(chat, "user", "first Perpignan question")
        reply = s.add_message(chat, "assistant", "an answer about Collioure")
        s.regenerate_reply(reply)
        s.finish_reply(reply, "a shorter answer")
        s.edit_as_version(question, "the edited question")
        shown = [m.text for m in s.get_chat(chat).messages]
        assert shown == ["the edited question"]  # the rest is in versions not shown
        for query in ("perpignan", "Collioure", "shorter answer", "edited"):
            assert [c.id for c in s.search_chats(query)] == [chat], query
        assert s.search_chats("absent words") == []
