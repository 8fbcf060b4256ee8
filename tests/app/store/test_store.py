"""The chat store: chats, messages, streaming replies, images, search, lock, settings."""
from __future__ import annotations

import hashlib
import os
import random
import threading
from pathlib import Path

import platformdirs
import pytest

from tramontane.app.store import schema
from tramontane.app.store.lock import DirLock
from tramontane.app.store import (
    NotFoundError,
    Store,
    StoreError,
    StoreLockedError,
    default_data_dir,
    image_extension,
)
from tramontane.engine.api import ChatMessage, GenerationStats, ImagePart

PNG = b"\x89PNG\r\n\x1a\n" + b"png-body"
JPG = b"\xff\xd8\xff\xe0" + b"jpeg-body"


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data") as s:
        yield s


def image_files(s: Store) -> set[str]:
    return {p.name for p in s.images_dir.glob("*/*")}


# ---------------------------------------------------------------- opening, data dir, pragmas


def test_data_dir_from_argument_env_and_platform(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAMONTANE_DATA_DIR", raising=False)
    assert default_data_dir() == Path(platformdirs.user_data_dir("Tramontane", appauthor=False))
    monkeypatch.setenv("TRAMONTANE_DATA_DIR", str(tmp_path / "from-env"))
    with Store() as s:
        assert s.data_dir == tmp_path / "from-env"
        assert (tmp_path / "from-env" / "chats.sqlite3").is_file()
    with Store(tmp_path / "explicit") as s:  # an explicit path beats the environment
        assert s.db_path == tmp_path / "explicit" / "chats.sqlite3"


def test_durability_pragmas(store):
    conn = store.db.conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 5


def test_lock_second_instance_refused_until_first_closes(tmp_path):
    first = Store(tmp_path)
    with pytest.raises(StoreLockedError, match="Another Tramontane is running") as info:
        Store(tmp_path)
    assert str(tmp_path) in str(info.value)
    if os.name != "nt":  # Windows does not let others read the holder's locked byte
        assert f"pid {os.getpid()}" in str(info.value)
    chat = first.create_chat("still usable")
    first.close()
    with Store(tmp_path) as again:
        assert again.get_chat(chat).title == "still usable"


def test_refused_open_releases_the_lock(tmp_path):
    (tmp_path / "chats.sqlite3").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="chats.sqlite3"):
        Store(tmp_path)
    # the failed open did not keep the lock: taking it by hand works
    lock = DirLock(tmp_path / "tramontane.lock")
    lock.acquire()
    lock.release()


def test_closed_store_says_so(tmp_path):
    s = Store(tmp_path)
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.create_chat()
    s.close()  # twice is fine


# ---------------------------------------------------------------- chats


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


def test_messages_in_order_with_stats(store):
    chat = store.create_chat()
    ids = [store.add_message(chat, role, f"{role} says {i}") for i, role in
           enumerate(["system", "user", "assistant", "user", "tool"])]
    stats = GenerationStats(prompt_tokens=11, reused_tokens=7, generated_tokens=5, ttft_s=0.25,
                            prefill_tok_s=300.0, decode_tok_s=20.5, finish_reason="length")
    ids.append(store.add_message(chat, "assistant", "long", stats=stats, finish_reason="length"))
    got = store.get_chat(chat).messages
    assert [m.id for m in got] == ids
    assert [m.position for m in got] == list(range(6))
    assert [m.role for m in got] == ["system", "user", "assistant", "user", "tool", "assistant"]
    last = got[-1]
    assert (last.prompt_tokens, last.reused_tokens, last.generated_tokens) == (11, 7, 5)
    assert (last.ttft_s, last.prefill_tok_s, last.decode_tok_s, last.finish_reason) == (0.25, 300.0, 20.5, "length")
    with pytest.raises(StoreError, match="role 'robot'"):
        store.add_message(chat, "robot", "hi")


# ---------------------------------------------------------------- streaming replies


def test_reply_streams_checkpoints_and_finishes(tmp_path):
    with Store(tmp_path, checkpoint_interval_s=3600) as s:
        chat = s.create_chat()
        s.add_message(chat, "user", "count")
        reply = s.begin_reply(chat)
        m = s.get_message(reply)
        assert (m.state, m.text, m.role, m.position) == ("streaming", "", "assistant", 1)
        assert s.checkpoint_reply(reply, "one")
        assert not s.checkpoint_reply(reply, "one two")  # within the interval: skipped
        assert s.get_message(reply).text == "one"
        assert s.checkpoint_reply(reply, "one two", force=True)
        assert s.get_message(reply).text == "one two"
        # the engine never sees the reply being generated
        assert [msg.role for msg in s.engine_messages(chat)] == ["user"]
        stats = GenerationStats(prompt_tokens=9, reused_tokens=4, generated_tokens=3, ttft_s=0.1,
                                decode_tok_s=12.0, finish_reason="stop")
        assert s.finish_reply(reply, "one two three", stats)
        m = s.get_message(reply)
        assert (m.state, m.text, m.finish_reason, m.reused_tokens) == ("complete", "one two three", "stop", 4)
        assert not s.checkpoint_reply(reply, "late", force=True)  # no longer streaming
        assert s.get_message(reply).text == "one two three"
        with pytest.raises(StoreError, match="not a streaming reply"):
            s.finish_reply(reply, "again")
        cancelled = s.begin_reply(chat)
        s.finish_reply(cancelled, "par", GenerationStats(), finish_reason="cancelled")
        assert s.get_message(cancelled).finish_reason == "cancelled"
        gone = s.begin_reply(chat)
        s.delete_message(gone)
        assert not s.checkpoint_reply(gone, "x", force=True)
        assert not s.finish_reply(gone, "x")


def test_reopen_marks_cut_reply_interrupted_keeping_text(tmp_path):
    s = Store(tmp_path, checkpoint_interval_s=0)
    chat = s.create_chat()
    s.add_message(chat, "user", "q")
    done = s.begin_reply(chat)
    s.finish_reply(done, "full answer")
    cut = s.begin_reply(chat)
    s.checkpoint_reply(cut, "half an ans")
    s.db.conn.close()  # like a crash: no finish, no clean close
    s._dir_lock.release()
    with Store(tmp_path) as again:
        msgs = again.get_chat(chat).messages
        assert [(m.id, m.state, m.text) for m in msgs[1:]] == [
            (done, "complete", "full answer"), (cut, "interrupted", "half an ans")]
        assert msgs[2].finish_reason == "interrupted"
        assert again.engine_messages(chat)[-1].text_content == "half an ans"


def test_checkpoints_from_a_worker_thread_while_reading(store):
    chat = store.create_chat()
    reply = store.begin_reply(chat)
    store.checkpoint_interval_s = 0
    full = "".join(chr(ord("a") + i % 26) for i in range(400))
    errors = []

    def worker():
        try:
            for i in range(1, len(full) + 1, 7):
                store.checkpoint_reply(reply, full[:i])
            store.finish_reply(reply, full)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    while thread.is_alive():
        text = store.get_chat(chat).messages[0].text
        assert full.startswith(text)
        store.list_chats()
    thread.join()
    assert not errors
    assert store.get_message(reply).text == full


# ---------------------------------------------------------------- edit, truncate, branch


def _conversation(s: Store, chat: int, turns: int) -> list[int]:
    ids = []
    for i in range(turns):
        ids.append(s.add_message(chat, "user", f"question {i}", [ImagePart(PNG + bytes([i]), f"q{i}.png")]))
        ids.append(s.add_message(chat, "assistant", f"answer {i}"))
    return ids


def test_edit_and_truncate_for_resend_and_regenerate(store):
    chat = store.create_chat()
    ids = _conversation(store, chat, 3)
    assert len(image_files(store)) == 3
    # regenerate the last answer: drop it, keep its question
    assert store.truncate_after(ids[4]) == 1
    assert [m.id for m in store.get_chat(chat).messages] == ids[:5]
    # edit-and-resend the second question
    store.edit_message(ids[2], "question 1, edited")
    assert store.truncate_after(ids[2]) == 2
    msgs = store.get_chat(chat).messages
    assert [m.text for m in msgs] == ["question 0", "answer 0", "question 1, edited"]
    assert len(image_files(store)) == 2  # the third question's image went with it
    new_reply = store.add_message(chat, "assistant", "answer 1 again")
    assert store.get_message(new_reply).position == 3
    assert store.truncate_after(ids[0], inclusive=True) == 4
    assert store.get_chat(chat).messages == [] and image_files(store) == set()
    streaming = store.begin_reply(chat)
    with pytest.raises(StoreError, match="still streaming"):
        store.edit_message(streaming, "no")
    with pytest.raises(NotFoundError):
        store.truncate_after(10_000)


def test_branch_copies_up_to_message_and_shares_images(store):
    chat = store.create_chat("Trip", model_path="/m.gguf", system_prompt="sys", settings={"seed": 3})
    ids = _conversation(store, chat, 3)
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


# ---------------------------------------------------------------- images


def test_images_stored_once_by_content_and_collected(store):
    chat = store.create_chat()
    m1 = store.add_message(chat, "user", "a", [ImagePart(PNG, "one.png")])
    m2 = store.add_message(chat, "user", "b", [ImagePart(PNG, "same-bytes.png"), ImagePart(JPG, "two.jpg")])
    sha_png, sha_jpg = hashlib.sha256(PNG).hexdigest(), hashlib.sha256(JPG).hexdigest()
    png_path = store.images_dir / sha_png[:2] / f"{sha_png}.png"
    assert png_path.read_bytes() == PNG
    assert image_files(store) == {f"{sha_png}.png", f"{sha_jpg}.jpg"}
    assert [(i.name, i.sha256) for i in store.get_message(m2).images] == [
        ("same-bytes.png", sha_png), ("two.jpg", sha_jpg)]
    store.delete_message(m1)
    assert png_path.exists()  # m2 still refers to it
    store.delete_message(m2)
    assert image_files(store) == set()
    assert store.db.rows("SELECT count(*) AS n FROM images")[0]["n"] == 0
    with pytest.raises(StoreError, match="empty"):
        store.add_message(chat, "user", "x", [ImagePart(b"", "void.png")])


def test_orphan_image_files_removed_on_open(tmp_path):
    with Store(tmp_path) as s:
        s.add_message(s.create_chat(), "user", "keep", [ImagePart(PNG, "k.png")])
        kept = image_files(s)
    stray = tmp_path / "images" / "ab" / ("ab" + "0" * 62 + ".png")
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"left by a crash")
    partial = tmp_path / "images" / "ab" / ".tmp-123-4-x.png"
    partial.write_bytes(b"half")
    with Store(tmp_path) as s:
        assert image_files(s) == kept
        assert not stray.exists() and not partial.exists()


@pytest.mark.parametrize("data,name,ext", [
    (PNG, "x", "png"), (JPG, "x.png", "jpg"), (b"GIF89a...", "", "gif"), (b"BM....", "", "bmp"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "", "webp"), (b"????", "photo.TIFF", "tiff"),
    (b"????", "noext", "bin"), (b"????", "evil.p/ng", "bin"),
])
def test_image_extension(data, name, ext):
    assert image_extension(data, name) == ext


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


def test_missing_image_file_is_a_clear_error(store):
    chat = store.create_chat()
    mid = store.add_message(chat, "user", "x", [ImagePart(PNG, "p.png")])
    path = store.get_message(mid).images[0].path
    path.unlink()
    with pytest.raises(StoreError, match=str(path.name)):
        store.engine_messages(chat)


# ---------------------------------------------------------------- search


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


# ---------------------------------------------------------------- settings


def test_settings_round_trip_and_persist(tmp_path):
    with Store(tmp_path) as s:
        assert s.get_setting("last_chat") is None and s.get_setting("x", 5) == 5
        s.set_setting("last_chat", 3)
        s.set_setting("last_model", "/models/ministral.gguf")
        s.set_setting("default_system_prompt", "Réponds en français.")
        s.set_setting("window", {"w": 800, "h": 600, "split": [1, 2]})
        s.set_setting("last_chat", 4)
        s.delete_setting("last_model")
        with pytest.raises(StoreError, match="'bad': not JSON"):
            s.set_setting("bad", {1, 2})
    with Store(tmp_path) as s:
        assert s.settings() == {"last_chat": 4, "default_system_prompt": "Réponds en français.",
                                "window": {"w": 800, "h": 600, "split": [1, 2]}}


def test_no_qt_import(tmp_path):
    # The worker thread and the CLI use the store: it must not pull Qt in.
    import subprocess
    import sys

    code = ("import sys, tramontane.app.store, tramontane.app.store.export; "
            "print(sorted(m for m in sys.modules if 'PySide' in m or 'Qt' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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
