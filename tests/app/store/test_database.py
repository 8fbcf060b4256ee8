"""The store's one connection: durability pragmas, a closed store, a failing write."""
from __future__ import annotations

import pytest

from tramontane.app.store import schema
from tramontane.app.store import NotFoundError, Store, StoreError
from tramontane.engine.api import ImagePart
from support.store_data import PNG


def test_durability_pragmas(store):
    conn = store.db.conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 6


def test_closed_store_says_so(tmp_path):
    s = Store(tmp_path)
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.create_chat()
    s.close()  # twice is fine


def test_a_failing_write_rolls_back_and_names_the_database(store):
    chat = store.create_chat()
    store.add_message(chat, "user", "kept")
    # Stand in for "disk full" and friends: SQLite aborts the insert of the image reference.
    store.db.conn.execute(
        "CREATE TEMP TRIGGER fail AFTER INSERT ON message_images BEGIN SELECT RAISE(ABORT, 'disk is full'); END")
    with pytest.raises(StoreError, match=r"chats\.sqlite3: disk is full"):
        store.add_message(chat, "user", "lost", [ImagePart(PNG, "p.png")])
    store.db.conn.execute("DROP TRIGGER fail")
    assert [m.text for m in store.get_chat(chat).messages] == ["kept"]  # no half message
    assert store.add_message(chat, "user", "next") and store.integrity_check() == "ok"


def test_the_clock_never_ties_and_a_streaming_chat_refuses_version_changes(store):
    stamps = [store.db.now() for _ in range(1000)]
    assert all(b > a for a, b in zip(stamps, stamps[1:]))
    chat = store.create_chat()
    question = store.add_message(chat, "user", "q")
    store.begin_reply(chat)
    with pytest.raises(StoreError, match=rf"^chat {chat}: a reply is being written"):
        store.edit_as_version(question, "q again")
    with pytest.raises(NotFoundError, match="chat 999 does not exist"):
        store.db.require_chat(999)
