"""Saved chats: the Store, one SQLite database per data dir that survives crashes and kill -9.

Layout of a data dir (default `platformdirs.user_data_dir("Tramontane")`, or
`$TRAMONTANE_DATA_DIR`, or the path given to `Store`):

    chats.sqlite3 (+ -wal, -shm)   chats, messages, image references, settings (schema.py)
    tramontane.lock                 OS lock held by the one app instance using this dir (lock.py)
    images/aa/<sha256>.<ext>        every attached image, stored once by content (images.py)

Why it does not lose chats:
* WAL journal + `synchronous=FULL`: each commit is fsynced to the WAL before it returns, so a
  finished reply survives kill -9 *and* power loss / OS crash (NORMAL survives kill -9 but
  may roll back the last commits on power loss). The store commits about once a second
  while a reply streams, so one fsync per commit costs nothing anyone can notice.
* A streaming reply is a row in state `streaming` whose text is checkpointed in its own
  transaction; on the next open it is marked `interrupted` and keeps its partial text.
* Image files are written (fsync + atomic rename) before the row that refers to them is
  committed, and unlinked only after the row is gone, so a crash leaves at most an
  unreferenced file, which the next open removes.
* Schema changes are forward migrations keyed on `PRAGMA user_version`, run in one
  transaction after copying the old database to `chats.sqlite3.v<N>.bak`.

The Store composes one part per domain over one connection (database.py) and one migration
chain (schema.py): `chats` (chats.py), `messages` (messages.py), `versions` (versions.py),
`replies` (replies.py), `attachments` (attachments.py), `tool_messages` (tool_messages.py),
`setting_values` (setting_values.py) and `search` (search.py). Each part's methods are also
offered on the Store under their established names (`store.rename_chat` is
`store.chats.rename`): one implementation each.

Pure Python + sqlite3 (no Qt) so the GUI worker thread and the CLI can both use it; one
`Store` may be shared between threads (every call holds an internal lock).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...env import read_env
from ...engine.private_files import create_private_file, make_private_dir, tighten_tree
from . import schema
from .attachments import Attachments
from .chats import Chats
from .database import Database
from .errors import StoreError
from .lock import DirLock
from .messages import Messages
from .replies import Replies
from .search import Search
from .setting_values import SettingValues
from .tool_messages import ToolMessages
from .versions import Versions

DB_NAME = "chats.sqlite3"
LOCK_NAME = "tramontane.lock"
IMAGES_DIR = "images"


def default_data_dir() -> Path:
    """$TRAMONTANE_DATA_DIR, else the platform's per-user data dir."""
    chosen = read_env().data_dir
    if chosen:
        return chosen
    import platformdirs

    return Path(platformdirs.user_data_dir("Tramontane", appauthor=False))


class _Offered:
    """A domain part's method offered on the Store under its established name: reading
    `store.<name>` gives the part's own bound method, so there is no second implementation."""

    def __init__(self, part: str, method: str):
        self.part = part
        self.method = method

    def __get__(self, store: "Store | None", owner: type | None = None) -> Any:
        if store is None:
            return self
        return getattr(getattr(store, self.part), self.method)


class Store:
    """The chat database of one data dir. Opening it takes the data dir's lock."""

    def __init__(self, data_dir: str | Path | None = None, *, checkpoint_interval_s: float = 1.0):
        self.data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        self.db_path = self.data_dir / DB_NAME
        self.images_dir = self.data_dir / IMAGES_DIR
        try:
            make_private_dir(self.data_dir)
        except OSError as exc:
            raise StoreError(f"{self.data_dir}: cannot create data dir: {exc.strerror or exc}") from exc
        self._dir_lock = DirLock(self.data_dir / LOCK_NAME)
        self._dir_lock.acquire()
        conn = None
        try:
            # Chats and photos are the user's alone: 0600 files in a 0700 folder (SQLite gives its
            # -wal and -shm files the database's mode), and a folder from an older version is
            # tightened here, once per start.
            if not self.db_path.exists():
                os.close(create_private_file(self.db_path, os.O_WRONLY | os.O_CREAT))
            tighten_tree(self.data_dir)
            conn = schema.connect(self.db_path)
            schema.migrate(conn, self.db_path)
            self.search_method = schema.setup_search(conn, self.db_path)
            self._compose(Database(conn, self.db_path), checkpoint_interval_s)
            self._recover()
        except BaseException:
            if conn is not None:
                conn.close()
            self._dir_lock.release()
            raise

    def _compose(self, db: Database, checkpoint_interval_s: float) -> None:
        self.db = db
        self.attachments = Attachments(db, self.images_dir)
        self.messages = Messages(db, self.attachments)
        self.versions = Versions(db, self.messages)
        self.replies = Replies(db, self.messages, self.versions, checkpoint_interval_s=checkpoint_interval_s)
        self.chats = Chats(db, self.messages, self.versions, self.attachments)
        self.tool_messages = ToolMessages(db, self.messages)
        self.setting_values = SettingValues(db)
        self.search = Search(db, self.chats, self.search_method)

    def _recover(self) -> None:
        """After a crash: cut replies become `interrupted`, unfinished tool calls `stopped`,
        unreferenced image files go."""
        with self.db.tx() as conn:
            conn.execute(
                "UPDATE messages SET state = 'interrupted', finish_reason = 'interrupted',"
                " reasoning_open = (reasoning != '' AND text = '') "  # cut while it thought
                "WHERE state = 'streaming'"
            )
            self.tool_messages.stop_unfinished()
        self.attachments.remove_unreferenced_files()

    def close(self) -> None:
        with self.db.lock:
            if self.db.is_open:
                self.db.close()
                self._dir_lock.release()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def checkpoint_interval_s(self) -> float:
        """A streaming reply's text is written at most once per this many seconds."""
        return self.replies.checkpoint_interval_s

    @checkpoint_interval_s.setter
    def checkpoint_interval_s(self, seconds: float) -> None:
        self.replies.checkpoint_interval_s = seconds

    # ---- each part's methods under the names callers know
    # chats
    create_chat = _Offered("chats", "create")
    update_chat = _Offered("chats", "update")
    update_chat_settings = _Offered("chats", "update_settings")
    rename_chat = _Offered("chats", "rename")
    set_pinned = _Offered("chats", "set_pinned")
    delete_chat = _Offered("chats", "delete")
    list_chats = _Offered("chats", "list")
    get_chat_info = _Offered("chats", "info")
    get_chat = _Offered("chats", "get")
    branch_chat = _Offered("chats", "branch")
    duplicate_chat = _Offered("chats", "branch")
    restore_chat = _Offered("chats", "restore")
    engine_messages = _Offered("chats", "engine_messages")
    search_chats = _Offered("search", "chats_with")
    # messages
    add_message = _Offered("messages", "add")
    add_chat_message = _Offered("messages", "add_chat_message")
    get_message = _Offered("messages", "get")
    edit_message = _Offered("messages", "edit")
    delete_message = _Offered("messages", "delete")
    truncate_after = _Offered("messages", "truncate_after")
    to_chat_message = _Offered("messages", "to_chat_message")
    # versions
    edit_as_version = _Offered("versions", "edit_as_version")
    show_version = _Offered("versions", "show")
    message_versions = _Offered("versions", "of_message")
    regenerate_reply = _Offered("versions", "regenerate_reply")
    reply_versions = _Offered("versions", "of_reply")
    # a reply being generated
    begin_reply = _Offered("replies", "begin")
    checkpoint_reply = _Offered("replies", "checkpoint")
    finish_reply = _Offered("replies", "finish")
    abandon_reply = _Offered("replies", "abandon")
    # tool use
    set_tool = _Offered("tool_messages", "set_tool")
    add_tool_message = _Offered("tool_messages", "add")
    update_tool_message = _Offered("tool_messages", "update")
    set_reply_sources = _Offered("tool_messages", "set_sources")
    # images
    image_path = _Offered("attachments", "path")
    image_bytes = _Offered("attachments", "read")
    # settings
    get_setting = _Offered("setting_values", "get")
    set_setting = _Offered("setting_values", "set")
    delete_setting = _Offered("setting_values", "delete")
    settings = _Offered("setting_values", "all")
    # checks
    integrity_check = _Offered("db", "integrity_check")
