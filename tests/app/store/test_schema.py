"""Every older schema opens: data intact, upgraded, a backup kept; failures roll back."""
from __future__ import annotations

import hashlib
import sqlite3

import pytest

from tramontane.app.store import schema
from tramontane.app.store import Store, StoreError
from tramontane.engine.api import GenerationStats

# A frozen copy of the schema version 1 shipped with (independent of app/store/schema.py, so an
# edit there that would break old databases shows up here).
V1_DDL = """
CREATE TABLE chats (
    id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, model_path TEXT, projector_path TEXT, remote_url TEXT,
    remote_model TEXT, system_prompt TEXT NOT NULL DEFAULT '',
    settings_json TEXT NOT NULL DEFAULT '{}');
CREATE INDEX chats_by_updated ON chats(updated_at);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    text TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'complete' CHECK (state IN ('complete', 'streaming', 'interrupted')),
    finish_reason TEXT, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    generated_tokens INTEGER NOT NULL DEFAULT 0, ttft_s REAL, decode_tok_s REAL,
    created_at REAL NOT NULL, UNIQUE (chat_id, position));
CREATE TABLE images (sha256 TEXT PRIMARY KEY, ext TEXT NOT NULL, size INTEGER NOT NULL,
    created_at REAL NOT NULL);
CREATE TABLE message_images (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL, sha256 TEXT NOT NULL REFERENCES images(sha256), name TEXT NOT NULL,
    text_offset INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (message_id, idx));
CREATE INDEX message_images_by_sha ON message_images(sha256);
CREATE TABLE settings (key TEXT PRIMARY KEY, value_json TEXT NOT NULL);
PRAGMA user_version = 1;
"""

IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(200))


def make_v1(data_dir):
    """A version-1 data dir as the first release would have left it (after a crash)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256(IMAGE).hexdigest()
    (data_dir / "images" / sha[:2]).mkdir(parents=True)
    (data_dir / "images" / sha[:2] / f"{sha}.png").write_bytes(IMAGE)
    conn = sqlite3.connect(data_dir / "chats.sqlite3")
    conn.executescript(V1_DDL)
    conn.executescript(f"""
        INSERT INTO chats VALUES (1, 'Old chat', 100.0, 200.0, '/m/old.gguf', '/m/mmproj.gguf',
                                  NULL, NULL, 'Old system prompt', '{{"temperature": 0.7}}');
        INSERT INTO chats VALUES (2, 'Remote chat', 110.0, 150.0, NULL, NULL,
                                  'http://127.0.0.1:1234/v1', 'small', '', '{{}}');
        INSERT INTO messages VALUES (1, 1, 0, 'user', 'look at this', 'complete', NULL, 0, 0, NULL, NULL, 101.0);
        INSERT INTO messages VALUES (2, 1, 1, 'assistant', 'a picture', 'complete', 'stop', 300, 3, 0.5, 25.0, 102.0);
        INSERT INTO messages VALUES (3, 1, 2, 'user', 'and now?', 'complete', NULL, 0, 0, NULL, NULL, 103.0);
        INSERT INTO messages VALUES (4, 1, 3, 'assistant', 'half of a', 'streaming', NULL, 0, 0, NULL, NULL, 104.0);
        INSERT INTO messages VALUES (5, 2, 0, 'user', 'remote hello', 'complete', NULL, 0, 0, NULL, NULL, 111.0);
        INSERT INTO images VALUES ('{sha}', 'png', {len(IMAGE)}, 101.0);
        INSERT INTO message_images VALUES (1, 0, '{sha}', 'cat.png', 0);
        INSERT INTO settings VALUES ('last_chat', '1');
    """)
    conn.close()
    return sha


def test_v1_database_opens_intact_and_upgraded(tmp_path):
    data = tmp_path / "data"
    sha = make_v1(data)
    with Store(data) as s:
        assert s.db.conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 6
        assert s.integrity_check() == "ok"
        assert [(c.id, c.title, c.pinned) for c in s.list_chats()] == [(1, "Old chat", False), (2, "Remote chat", False)]
        old = s.get_chat(1)
        assert (old.created_at, old.updated_at, old.model_path, old.projector_path) == (
            100.0, 200.0, "/m/old.gguf", "/m/mmproj.gguf")
        assert (old.system_prompt, old.settings) == ("Old system prompt", {"temperature": 0.7})
        assert [(m.id, m.role, m.text, m.state) for m in old.messages] == [
            (1, "user", "look at this", "complete"), (2, "assistant", "a picture", "complete"),
            (3, "user", "and now?", "complete"), (4, "assistant", "half of a", "interrupted")]
        answer = old.messages[1]
        assert (answer.prompt_tokens, answer.generated_tokens, answer.ttft_s, answer.decode_tok_s) == (300, 3, 0.5, 25.0)
        assert (answer.reused_tokens, answer.prefill_tok_s) == (0, None)  # new v2 columns
        assert [(i.sha256, i.name) for i in old.messages[0].images] == [(sha, "cat.png")]
        assert s.engine_messages(1)[1].images[0].data == IMAGE
        remote = s.get_chat_info(2)
        assert (remote.remote_url, remote.remote_model) == ("http://127.0.0.1:1234/v1", "small")
        assert s.get_setting("last_chat") == 1
        assert [c.id for c in s.search_chats("remote hello")] == [2]  # index built from old rows
        # the new columns work
        s.set_pinned(2, True)
        reply = s.begin_reply(2)
        s.finish_reply(reply, "hi", GenerationStats(reused_tokens=12, prefill_tok_s=99.0))
        assert (s.get_message(reply).reused_tokens, s.get_message(reply).prefill_tok_s) == (12, 99.0)
        assert s.list_chats()[0].id == 2
    backup = sqlite3.connect(data / "chats.sqlite3.v1.bak")
    assert backup.execute("PRAGMA user_version").fetchone()[0] == 1
    assert backup.execute("SELECT count(*) FROM messages").fetchone()[0] == 5
    backup.close()


def _schema(conn) -> dict:
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " AND name NOT LIKE 'message_search%' ORDER BY name")]
    return {t: [tuple(r) for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}


def test_migrated_schema_equals_a_fresh_one(tmp_path):
    make_v1(tmp_path / "old")
    with Store(tmp_path / "old") as old, Store(tmp_path / "new") as new:
        assert _schema(old.db.conn) == _schema(new.db.conn)
        assert len(_schema(new.db.conn)) == 7  # with reply_versions (v3), message_versions (v4)


def test_failed_migration_rolls_back_and_keeps_data(tmp_path, monkeypatch):
    make_v1(tmp_path)
    monkeypatch.setattr(schema, "MIGRATIONS", {**schema.MIGRATIONS, 2: "ALTER TABLE nope ADD x"})
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 3)
    with pytest.raises(StoreError, match="chats.sqlite3: migrating to schema 3 failed: no such table: nope"):
        Store(tmp_path)
    conn = sqlite3.connect(tmp_path / "chats.sqlite3")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1  # v1->v2 rolled back too
    assert [r[1] for r in conn.execute("PRAGMA table_info(chats)")][-1] == "settings_json"
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 5
    conn.close()
    monkeypatch.undo()
    with Store(tmp_path) as s:  # and the real migration still works afterwards
        assert len(s.get_chat(1).messages) == 4


def test_newer_or_foreign_databases_are_refused(tmp_path):
    newer = tmp_path / "newer"
    newer.mkdir()
    conn = sqlite3.connect(newer / "chats.sqlite3")
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError, match="schema version 99 is newer than this Tramontane understands"):
        Store(newer)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    conn = sqlite3.connect(foreign / "chats.sqlite3")
    conn.execute("CREATE TABLE something (x)")
    conn.close()
    with pytest.raises(StoreError, match="not a Tramontane chat database"):
        Store(foreign)


def test_v5_replies_gain_an_empty_thought_and_old_ones_still_read(tmp_path):
    """v5 -> v6 (issue 36): the reasoning columns on replies and their versions, empty for what
    was there; a crash-cut reply that had only thought is marked cut on the next open."""
    data = tmp_path / "data"
    sha = make_v1(data)
    with Store(data) as s:
        old = s.get_chat(1).messages[1]
        assert (old.reasoning, old.reasoning_s, old.reasoning_open) == ("", None, False)
        assert s.engine_messages(1)[2].parts == ["a picture"]  # no thought: sent as before
        reply = s.begin_reply(1)
        s.checkpoint_reply(reply, "", reasoning="half a thought", force=True)
    with Store(data) as s:  # the app was killed while it thought
        cut = s.get_message(reply)
        assert (cut.state, cut.reasoning, cut.reasoning_open) == ("interrupted", "half a thought", True)
    assert sha
