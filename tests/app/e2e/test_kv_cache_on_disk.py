"""A chat reopened after the app restarts is not read again: the window's engine keeps the KV
blocks of recent chats in the data folder (`kv-cache/`, private), and the relaunched window's
first reply in that chat reuses them (issue 24, item 2)."""
from __future__ import annotations

import stat

import pytest

pytest.importorskip("pytestqt")

from support.app_window import close_window, make_window, send  # noqa: E402
from tramontane.app.worker import KV_CACHE_FOLDER  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

# Long enough for several whole 32-token blocks (a block is kept only once it is full).
LONG = " ".join(f"word{i}" for i in range(60))


def test_reopened_chat_reuses_blocks_from_disk_after_restart(qtbot, tmp_path):
    data = tmp_path / "data"
    w1 = make_window(qtbot, data)
    send(qtbot, w1, LONG)
    chat_id = w1.session.current_chat_id
    close_window(w1)  # closing the engine writes what its writer still held

    folder = data / KV_CACHE_FOLDER
    files = [p for p in folder.iterdir() if p.is_file()]
    assert files, "no KV blocks were written to the data folder"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)

    w2 = make_window(qtbot, data)  # a relaunch: a new engine, nothing in memory
    try:
        w2.navigation.open_chat(chat_id)
        results = []
        w2.worker.finished.connect(lambda _rid, result: results.append(result))
        send(qtbot, w2, "and then?")
        qtbot.waitUntil(lambda: bool(results), timeout=30000)
        # The first message's prompt and the reply were published as blocks: at least the
        # whole blocks of the first turn come back from disk instead of being read again.
        assert results[-1].stats.reused_tokens >= 64, results[-1].stats
    finally:
        close_window(w2)


def test_deleting_a_chat_deletes_what_the_cache_kept_of_it(qtbot, tmp_path):
    """The KV blocks and reply ids of a chat are its content (the first layer's keys give its
    tokens back): deleting the chat deletes them, in memory and in the data folder."""
    data = tmp_path / "data"
    w = make_window(qtbot, data)
    try:
        send(qtbot, w, LONG)
        chat_id = w.session.current_chat_id
        engine = w.worker.engine
        qtbot.waitUntil(lambda: engine.pool.named() > 0, timeout=30000)  # its blocks, named in the pool
        w.chats.delete_chat(chat_id)
        w.chats.commit_deletes()  # the Undo offer ends: deleted from the store
        folder = data / KV_CACHE_FOLDER
        qtbot.waitUntil(lambda: not any(folder.iterdir()), timeout=30000)  # the worker deletes them
        assert engine.pool.named() == 0 and len(engine.prefix_cache) == 0
    finally:
        close_window(w)
