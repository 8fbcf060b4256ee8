"""The chat list's headings: Pinned, Today, Yesterday, Last 7 days, Older."""
from __future__ import annotations

import datetime
import time

import pytest

pytest.importorskip("pytestqt")

from tramontane.app.store import Store  # noqa: E402
from tramontane.app.widgets.chat_list import ChatListModel, HeadingRole, group_of  # noqa: E402


def test_group_of_each_age():
    today = datetime.date(2026, 3, 10)
    at = lambda d: time.mktime(datetime.datetime.combine(d, datetime.time(12)).timetuple())  # noqa: E731
    assert group_of(False, at(today), today) == "Today"
    assert group_of(False, at(today - datetime.timedelta(days=1)), today) == "Yesterday"
    assert group_of(False, at(today - datetime.timedelta(days=6)), today) == "Last 7 days"
    assert group_of(False, at(today - datetime.timedelta(days=7)), today) == "Older"
    assert group_of(True, at(today - datetime.timedelta(days=30)), today) == "Pinned"


def test_a_heading_above_the_first_chat_of_each_group(qtbot, tmp_path):
    with Store(tmp_path / "data") as store:
        now = time.time()
        ids = {}
        for title, days in (("old", 30), ("last week", 3), ("yesterday", 1), ("today a", 0), ("today b", 0)):
            ids[title] = store.create_chat(title)
            store.db.conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now - days * 86400, ids[title]))
        store.db.conn.commit()
        store.set_pinned(ids["old"], True)
        store.db.conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now - 30 * 86400, ids["old"]))
        store.db.conn.commit()
        model = ChatListModel(store)
        model.refresh()
        rows = [(model.index(r).data(), model.index(r).data(HeadingRole)) for r in range(model.rowCount())]
        headings = [h for _, h in rows if h]
        assert rows[0] == ("old", "Pinned")
        assert headings == ["Pinned", "Today", "Yesterday", "Last 7 days"]
        assert sum(1 for t, h in rows if t.startswith("today") and h) == 1  # one heading per group
