"""The Store: its data dir, the one-instance lock, recovery on open, no Qt."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs
import pytest

from tramontane.app.store import Store, StoreError, StoreLockedError, default_data_dir
from tramontane.app.store.lock import DirLock
from tramontane.engine.api import ImagePart
from support.store_data import PNG, image_files


def test_data_dir_from_argument_env_and_platform(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAMONTANE_DATA_DIR", raising=False)
    assert default_data_dir() == Path(platformdirs.user_data_dir("Tramontane", appauthor=False))
    monkeypatch.setenv("TRAMONTANE_DATA_DIR", str(tmp_path / "from-env"))
    with Store() as s:
        assert s.data_dir == tmp_path / "from-env"
        assert (tmp_path / "from-env" / "chats.sqlite3").is_file()
    with Store(tmp_path / "explicit") as s:  # an explicit path beats the environment
        assert s.db_path == tmp_path / "explicit" / "chats.sqlite3"


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


def test_no_qt_import(tmp_path):
    # The worker thread and the CLI use the store: it must not pull Qt in.
    import subprocess
    import sys

    code = ("import sys, tramontane.app.store, tramontane.app.store.export; "
            "print(sorted(m for m in sys.modules if 'PySide' in m or 'Qt' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_method_offered_on_the_store_is_its_parts_own(store):
    """One implementation each: `store.rename_chat` is `store.chats.rename`, bound to the part."""
    from tramontane.app.store.store import _Offered

    offered = {name: attr for name, attr in vars(Store).items() if isinstance(attr, _Offered)}
    assert len(offered) >= 39
    for name, attr in offered.items():
        method = getattr(store, name)
        part = getattr(store, attr.part)
        assert method.__self__ is part and method.__func__ is getattr(type(part), attr.method), name
