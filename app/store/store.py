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

Pure Python + sqlite3 (no Qt) so the GUI worker thread and the CLI can both use it; one
`Store` may be shared between threads (every call holds an internal lock).
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ...engine.api import ChatMessage, GenerationStats, ImagePart
from ...engine.private_files import create_private_file, make_private_dir, tighten_tree
from . import schema
from .errors import NotFoundError, StoreError
from .images import ImageFiles, image_extension
from .lock import DATA_DIR_ENV, DirLock
from .rows import (Chat, ChatInfo, Message, StoredImage, chat_columns, chat_info,
                   check_role_and_state, split_parts, stat_values, to_chat_message, tool_data)
from .rows import message as message_from_row

DB_NAME = "chats.sqlite3"
LOCK_NAME = "tramontane.lock"
IMAGES_DIR = "images"


def default_data_dir() -> Path:
    """$TRAMONTANE_DATA_DIR, else the platform's per-user data dir."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("Tramontane", appauthor=False))


class Store:
    """The chat database of one data dir. Opening it takes the data dir's lock."""

    def __init__(self, data_dir: str | Path | None = None, *, checkpoint_interval_s: float = 1.0):
        self.data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        self.db_path = self.data_dir / DB_NAME
        self.images_dir = self.data_dir / IMAGES_DIR
        self.images = ImageFiles(self.images_dir)
        # checkpoint_reply writes at most once per this many seconds per message.
        self.checkpoint_interval_s = checkpoint_interval_s
        self._lock = threading.RLock()
        self._last_checkpoint: dict[int, float] = {}
        self._last_now = 0.0
        try:
            make_private_dir(self.data_dir)
        except OSError as exc:
            raise StoreError(f"{self.data_dir}: cannot create data dir: {exc.strerror or exc}") from exc
        self._dir_lock = DirLock(self.data_dir / LOCK_NAME)
        self._dir_lock.acquire()
        try:
            # Chats and photos are the user's alone: 0600 files in a 0700 folder (SQLite gives its
            # -wal and -shm files the database's mode), and a folder from an older version is
            # tightened here, once per start.
            if not self.db_path.exists():
                os.close(create_private_file(self.db_path, os.O_WRONLY | os.O_CREAT))
            tighten_tree(self.data_dir)
            self._conn = schema.connect(self.db_path)
            schema.migrate(self._conn, self.db_path)
            self.search_method = schema.setup_search(self._conn, self.db_path)
            self._recover()
        except BaseException:
            conn = getattr(self, "_conn", None)
            if conn is not None:
                conn.close()
            self._dir_lock.release()
            raise

    # ---- opening

    def _recover(self) -> None:
        """After a crash: cut replies become `interrupted`, unreferenced image files go."""
        with self._tx():
            self._conn.execute(
                "UPDATE messages SET state = 'interrupted', finish_reason = 'interrupted' "
                "WHERE state = 'streaming'"
            )
            # a tool call that was waiting for its answer, or running: it will not finish now
            for row in self._conn.execute(
                    "SELECT id, tool_json FROM messages WHERE role = 'tool' AND (tool_json LIKE ? OR tool_json LIKE ?)",
                    ('%"status": "waiting"%', '%"status": "running"%')).fetchall():
                card = tool_data(row["tool_json"])
                if card is not None and card.get("status") in ("waiting", "running"):
                    self._conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?",
                                       (json.dumps({**card, "status": "stopped"}), row["id"]))
        known = {
            f"{r['sha256']}.{r['ext']}" for r in self._conn.execute("SELECT sha256, ext FROM images")
        }
        self.images.remove_unknown(known)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._dir_lock.release()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- small SQL layer

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (schema.transaction) under the store's thread lock."""
        with self._lock:
            with schema.transaction(self._open_conn(), self.db_path) as conn:
                yield conn

    def _open_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.db_path}: the store is closed")
        return self._conn

    def _rows(self, sql: str, params: Sequence[Any] | dict = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._open_conn().execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.db_path}: {exc}") from exc

    def _now(self) -> float:
        # Strictly increasing, so "most recent first" never ties within one session.
        now = max(time.time(), self._last_now + 1e-6)
        self._last_now = now
        return now

    def _touch(self, chat_id: int, now: float | None = None) -> None:
        self._conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now or self._now(), chat_id))

    # ---- chats

    def create_chat(self, title: str = "New chat", **fields: Any) -> int:
        """A new empty chat; `fields` are any of model_path, projector_path, remote_url,
        remote_model, system_prompt, settings (dict), pinned."""
        values = chat_columns({"title": title, **fields})
        now = self._now()
        values.setdefault("created_at", now)
        values.setdefault("updated_at", now)
        cols = ", ".join(values)
        marks = ", ".join(f":{c}" for c in values)
        with self._tx() as conn:
            return conn.execute(f"INSERT INTO chats ({cols}) VALUES ({marks})", values).lastrowid

    def update_chat(self, chat_id: int, **fields: Any) -> None:
        """Change any of the create_chat fields (title, model, settings, ...)."""
        values = chat_columns(fields)
        if not values:
            return
        sets = ", ".join(f"{c} = :{c}" for c in values)
        with self._tx() as conn:
            self._require_chat(chat_id)
            conn.execute(f"UPDATE chats SET {sets} WHERE id = :id", {**values, "id": chat_id})
            self._touch(chat_id)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self.update_chat(chat_id, title=title)

    def set_pinned(self, chat_id: int, pinned: bool) -> None:
        self.update_chat(chat_id, pinned=pinned)

    def delete_chat(self, chat_id: int) -> None:
        with self._tx() as conn:
            self._require_chat(chat_id)
            shas = self._image_shas("SELECT id FROM messages WHERE chat_id = ?", (chat_id,))
            conn.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            doomed = self._drop_unused_images(shas)
        self.images.unlink(doomed)

    def list_chats(self) -> list[ChatInfo]:
        """Every chat, pinned ones first, then most recently updated first."""
        return [chat_info(r) for r in self._rows(_CHAT_SELECT + _CHAT_ORDER)]

    def get_chat_info(self, chat_id: int) -> ChatInfo:
        rows = self._rows(_CHAT_SELECT + " WHERE c.id = ?", (chat_id,))
        if not rows:
            raise NotFoundError(f"chat {chat_id} does not exist")
        return chat_info(rows[0])

    def get_chat(self, chat_id: int) -> Chat:
        """The chat with its messages in order."""
        with self._lock:
            info = self.get_chat_info(chat_id)
            messages = self._messages(f"WHERE m.chat_id = ? AND {_SHOWN}", (chat_id,))
        return Chat(**vars(info), messages=messages)

    def search_chats(self, query: str) -> list[ChatInfo]:
        """Chats whose title or any message contains `query` (case-insensitive substring),
        ordered like list_chats. Uses the FTS5 trigram index when `search_method == 'fts5'`
        and the query has at least 3 characters, else a scan of every message."""
        query = query.strip()
        if not query:
            return self.list_chats()
        folded = schema.fold(query)
        if self.search_method == "fts5" and len(query) >= schema.TRIGRAM_MIN_CHARS:
            phrase = '"' + query.replace('"', '""') + '"'
            in_messages = (
                f"c.id IN (SELECT m.chat_id FROM messages m WHERE {_SHOWN} AND m.id IN "
                "(SELECT rowid FROM message_search WHERE message_search MATCH :phrase))"
            )
        else:
            phrase = None
            in_messages = (
                f"c.id IN (SELECT m.chat_id FROM messages m WHERE {_SHOWN} "
                "AND instr(tramontane_fold(m.text), :folded) > 0)"
            )
        sql = (
            _CHAT_SELECT
            + f" WHERE instr(tramontane_fold(c.title), :folded) > 0 OR {in_messages}"
            + _CHAT_ORDER
        )
        rows = self._rows(sql, {"folded": folded, "phrase": phrase})
        return [chat_info(r) for r in rows]

    def branch_chat(self, chat_id: int, up_to_message_id: int | None = None, title: str | None = None) -> int:
        """A new chat with the same settings and a copy of the messages up to and including
        `up_to_message_id` (all of them when None), each reply with its versions. Images are
        shared, not copied."""
        with self._tx() as conn:
            info = self.get_chat_info(chat_id)
            limit = (
                None if up_to_message_id is None else self._message_position(up_to_message_id, chat_id)
            )
            now = self._now()
            new_id = conn.execute(
                "INSERT INTO chats (title, created_at, updated_at, model_path, projector_path,"
                " remote_url, remote_model, system_prompt, settings_json, pinned)"
                " SELECT ?, ?, ?, model_path, projector_path, remote_url, remote_model,"
                " system_prompt, settings_json, 0 FROM chats WHERE id = ?",
                (title if title is not None else f"{info.title} (branch)", now, now, chat_id),
            ).lastrowid
            sources = conn.execute(
                "SELECT id FROM messages WHERE chat_id = ? AND position >= 0"
                " AND (? IS NULL OR position <= ?) ORDER BY position",
                (chat_id, limit, limit),
            ).fetchall()
            for src in sources:
                copy_id = conn.execute(
                    "INSERT INTO messages (chat_id, position, role, text, state, finish_reason,"
                    " prompt_tokens, generated_tokens, reused_tokens, ttft_s, prefill_tok_s,"
                    " decode_tok_s, created_at, tool_json)"
                    " SELECT ?, position, role, text,"
                    " CASE state WHEN 'streaming' THEN 'interrupted' ELSE state END,"
                    " CASE state WHEN 'streaming' THEN 'interrupted' ELSE finish_reason END,"
                    " prompt_tokens, generated_tokens, reused_tokens, ttft_s, prefill_tok_s,"
                    " decode_tok_s, created_at, tool_json FROM messages WHERE id = ?",
                    (new_id, src["id"]),
                ).lastrowid
                conn.execute(
                    "INSERT INTO message_images (message_id, idx, sha256, name, text_offset)"
                    " SELECT ?, idx, sha256, name, text_offset FROM message_images WHERE message_id = ?",
                    (copy_id, src["id"]),
                )
                conn.execute(  # a regenerated reply keeps its versions (‹ 2/3 ›) in the branch
                    f"INSERT INTO reply_versions (message_id, idx, shown, {self._VERSION_COLUMNS}, created_at)"
                    f" SELECT ?, idx, shown, {self._VERSION_COLUMNS}, created_at FROM reply_versions"
                    " WHERE message_id = ?",
                    (copy_id, src["id"]),
                )
            return new_id

    duplicate_chat = branch_chat

    # ---- messages

    def add_message(
        self,
        chat_id: int,
        role: str,
        text: str = "",
        images: Sequence[ImagePart] = (),
        *,
        image_offsets: Sequence[int] | None = None,
        state: str = "complete",
        finish_reason: str | None = None,
        stats: GenerationStats | None = None,
        created_at: float | None = None,
    ) -> int:
        """Append a finished message. Images sit before the text unless `image_offsets`
        gives each one's character offset in `text`."""
        if image_offsets is None:
            image_offsets = [0] * len(images)
        if len(image_offsets) != len(images):
            raise StoreError(f"image_offsets: {len(image_offsets)} offsets for {len(images)} images")
        return self._insert_message(
            chat_id, role, text, list(zip(images, image_offsets)), state, finish_reason, stats, created_at
        )

    def add_chat_message(self, chat_id: int, message: ChatMessage) -> int:
        """Append an engine ChatMessage, keeping where its images sit among its text parts."""
        text, images = split_parts(message.parts)
        return self._insert_message(chat_id, message.role, text, images, "complete", None, None, None)

    def _insert_message(
        self,
        chat_id: int,
        role: str,
        text: str,
        images: list[tuple[ImagePart, int]],
        state: str,
        finish_reason: str | None,
        stats: GenerationStats | None,
        created_at: float | None,
    ) -> int:
        check_role_and_state(role, state)
        if not isinstance(text, str):
            raise StoreError(f"message text: expected str, got {type(text).__name__}")
        with self._lock:
            # Files first, rows second: a crash in between leaves only an orphan file.
            stored = [(self._store_image_file(img), img.name, off) for img, off in images]
            with self._tx():
                self._require_chat(chat_id)
                now = self._now()
                message_id = self._insert_message_row(
                    chat_id, role, text, stored, state, finish_reason, stats,
                    created_at if created_at is not None else now,
                )
                self._touch(chat_id, now)
                return message_id

    def _insert_message_row(
        self,
        chat_id: int,
        role: str,
        text: str,
        stored_images: list[tuple[tuple[str, str, int], str, int]],
        state: str,
        finish_reason: str | None,
        stats: GenerationStats | None,
        created_at: float,
    ) -> int:
        """Inside a transaction: one message row and its image references."""
        conn = self._conn
        message_id = conn.execute(
            "INSERT INTO messages (chat_id, position, role, text, state, finish_reason,"
            " prompt_tokens, generated_tokens, reused_tokens, ttft_s, prefill_tok_s,"
            " decode_tok_s, created_at) VALUES (?, (SELECT coalesce(max(position), -1) + 1"
            " FROM messages WHERE chat_id = ?), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (chat_id, chat_id, role, text, state, finish_reason,
             *stat_values(stats or GenerationStats()), created_at),
        ).lastrowid
        for idx, ((sha, ext, size), name, offset) in enumerate(stored_images):
            conn.execute(
                "INSERT OR IGNORE INTO images (sha256, ext, size, created_at) VALUES (?, ?, ?, ?)",
                (sha, ext, size, created_at),
            )
            conn.execute(
                "INSERT INTO message_images (message_id, idx, sha256, name, text_offset)"
                " VALUES (?, ?, ?, ?, ?)",
                (message_id, idx, sha, name, max(0, min(int(offset), len(text)))),
            )
        return message_id

    def restore_chat(self, chat_fields: dict[str, Any], messages: Sequence[dict[str, Any]]) -> int:
        """Create a whole chat in one transaction, keeping the given timestamps, states and
        stats (used by import). Each message dict has role, text and optionally images
        [(ImagePart, text_offset)], state, finish_reason, stats (GenerationStats), created_at,
        versions (dicts as reply_versions() gives them)."""
        values = chat_columns(chat_fields)
        now = self._now()
        values.setdefault("title", "Imported chat")
        values.setdefault("created_at", now)
        values.setdefault("updated_at", now)
        rows = []
        for i, msg in enumerate(messages):
            role, state = msg["role"], msg.get("state", "complete")
            check_role_and_state(role, state, f"messages[{i}].")
            rows.append(msg)
        with self._lock:
            stored = [
                [(self._store_image_file(img), img.name, off) for img, off in msg.get("images", ())]
                for msg in rows
            ]
            with self._tx() as conn:
                cols = ", ".join(values)
                marks = ", ".join(f":{c}" for c in values)
                chat_id = conn.execute(f"INSERT INTO chats ({cols}) VALUES ({marks})", values).lastrowid
                for msg, images in zip(rows, stored):
                    state = msg.get("state", "complete")
                    message_id = self._insert_message_row(
                        chat_id, msg["role"], msg.get("text", ""), images,
                        "interrupted" if state == "streaming" else state,
                        msg.get("finish_reason"), msg.get("stats"), float(msg.get("created_at", now)),
                    )
                    if msg.get("tool"):  # tool calls and cards (schema v5)
                        conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?",
                                     (json.dumps(msg["tool"]), message_id))
                    for version in msg.get("versions", ()):  # the replies a regenerate kept
                        self._insert_version(conn, message_id, version)
                return chat_id

    def get_message(self, message_id: int) -> Message:
        found = self._messages("WHERE m.id = ?", (message_id,))
        if not found:
            raise NotFoundError(f"message {message_id} does not exist")
        return found[0]

    def edit_message(self, message_id: int, text: str) -> None:
        """Replace a finished message's text (edit-and-resend edits, then truncates after)."""
        with self._tx() as conn:
            msg = self.get_message(message_id)
            if msg.state == "streaming":
                raise StoreError(f"message {message_id} is still streaming; finish it before editing")
            conn.execute("UPDATE messages SET text = ? WHERE id = ?", (text, message_id))
            self._touch(msg.chat_id)

    def delete_message(self, message_id: int) -> None:
        with self._tx() as conn:
            msg = self.get_message(message_id)
            shas = self._image_shas(_WITH_HIDDEN.format("SELECT ?"), (message_id,))
            conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            doomed = self._drop_unused_images(shas)
            self._touch(msg.chat_id)
        self.images.unlink(doomed)

    def truncate_after(self, message_id: int, *, inclusive: bool = False) -> int:
        """Delete every message after `message_id` in its chat (and it too when `inclusive`);
        for regenerate and edit-and-resend. Returns how many messages went."""
        with self._tx() as conn:
            msg = self.get_message(message_id)
            cut = msg.position if inclusive else msg.position + 1
            where = "chat_id = ? AND position >= ?"
            shas = self._image_shas(_WITH_HIDDEN.format(f"SELECT id FROM messages WHERE {where}"),
                                    (msg.chat_id, cut))
            count = conn.execute(f"DELETE FROM messages WHERE {where}", (msg.chat_id, cut)).rowcount
            doomed = self._drop_unused_images(shas)
            self._touch(msg.chat_id)
        self.images.unlink(doomed)
        return count

    # ---- versions of an edited message (edit and resend keeps what was there)

    def edit_as_version(self, message_id: int, text: str) -> None:
        """Edit and resend: `text` becomes a new version of the finished message, shown; the
        messages after it are kept, hidden, as what follows the version shown until now
        (schema v4). Switch back with show_version."""
        with self._tx() as conn:
            msg = self.get_message(message_id)
            if msg.state == "streaming" or msg.position < 0:
                raise StoreError(f"message {message_id} is not a finished message of its chat")
            self._refuse_while_streaming(conn, msg.chat_id)
            if not conn.execute("SELECT 1 FROM message_versions WHERE message_id = ?", (message_id,)).fetchone():
                conn.execute("INSERT INTO message_versions (message_id, idx, shown, text, created_at)"
                             " VALUES (?, 0, 1, ?, ?)", (message_id, msg.text, msg.created_at))
            shown = self._shown_message_version(conn, message_id)
            self._hide_tail(conn, msg, shown)
            conn.execute(
                "INSERT INTO message_versions (message_id, idx, shown, text, created_at) VALUES"
                " (?, (SELECT max(idx) + 1 FROM message_versions WHERE message_id = ?), 0, ?, ?)",
                (message_id, message_id, text, self._now()))
            newest = conn.execute("SELECT max(idx) FROM message_versions WHERE message_id = ?",
                                  (message_id,)).fetchone()[0]
            self._show_message_version(conn, msg, newest)

    def show_version(self, message_id: int, idx: int) -> None:
        """Show version `idx` of an edited message (with what followed it) or of a
        regenerated reply."""
        with self._tx() as conn:
            if conn.execute("SELECT 1 FROM message_versions WHERE message_id = ?", (message_id,)).fetchone():
                msg = self.get_message(message_id)
                self._refuse_while_streaming(conn, msg.chat_id)
                if not conn.execute("SELECT 1 FROM message_versions WHERE message_id = ? AND idx = ?",
                                    (message_id, idx)).fetchone():
                    raise StoreError(f"message {message_id} has no version {idx}")
                shown = self._shown_message_version(conn, message_id)
                if idx != shown:
                    self._hide_tail(conn, msg, shown)
                    self._show_message_version(conn, msg, idx)
            else:
                self._show_version(conn, message_id, idx)

    def message_versions(self, message_id: int) -> list[dict[str, Any]]:
        """Every version of an edited message, oldest first ([] when it was never edited)."""
        return [dict(r) for r in self._rows(
            "SELECT idx, shown, text, created_at FROM message_versions WHERE message_id = ? ORDER BY idx",
            (message_id,))]

    def _refuse_while_streaming(self, conn, chat_id: int) -> None:
        if conn.execute("SELECT 1 FROM messages WHERE chat_id = ? AND state = 'streaming'", (chat_id,)).fetchone():
            raise StoreError(f"chat {chat_id}: a reply is being written; wait for it or stop it first")

    @staticmethod
    def _shown_message_version(conn, message_id: int) -> int:
        row = conn.execute("SELECT idx FROM message_versions WHERE message_id = ? AND shown",
                           (message_id,)).fetchone()
        return row[0] if row is not None else 0

    @staticmethod
    def _hide_tail(conn, msg: Message, version: int) -> None:
        """The shown messages after `msg` become the hidden continuation of its `version`."""
        conn.execute(
            "UPDATE messages SET tail_of = ?, tail_idx = ?, position = -id"
            " WHERE chat_id = ? AND position > ?", (msg.id, version, msg.chat_id, msg.position))

    def _show_message_version(self, conn, msg: Message, idx: int) -> None:
        """Version `idx`'s text, and the messages that followed it back in place (in their
        order: ids grow with positions within a chat). Its tail was hidden by the caller."""
        tail = conn.execute("SELECT id FROM messages WHERE tail_of = ? AND tail_idx = ? ORDER BY id",
                            (msg.id, idx)).fetchall()
        for offset, row in enumerate(tail, start=1):
            conn.execute("UPDATE messages SET position = ?, tail_of = NULL, tail_idx = NULL WHERE id = ?",
                         (msg.position + offset, row["id"]))
        conn.execute("UPDATE messages SET text = (SELECT text FROM message_versions WHERE message_id = ?"
                     " AND idx = ?) WHERE id = ?", (msg.id, idx, msg.id))
        conn.execute("UPDATE message_versions SET shown = (idx = ?) WHERE message_id = ?", (idx, msg.id))
        self._touch(msg.chat_id)

    # ---- versions of a reply (regenerate keeps the replies it replaces)

    _VERSION_COLUMNS = ("text, finish_reason, prompt_tokens, generated_tokens, reused_tokens, ttft_s,"
                        " prefill_tok_s, decode_tok_s")

    def regenerate_reply(self, message_id: int) -> int:
        """Make the finished reply `message_id` streaming again for a new version, keeping
        what it says now as a version of it; the messages after it go. Returns its id."""
        msg = self.get_message(message_id)
        if msg.role != "assistant" or msg.state == "streaming":
            raise StoreError(f"message {message_id} is not a finished reply")
        self.truncate_after(message_id)
        with self._tx() as conn:
            if not conn.execute("SELECT 1 FROM reply_versions WHERE message_id = ?", (message_id,)).fetchone():
                conn.execute(
                    f"INSERT INTO reply_versions (message_id, idx, shown, {self._VERSION_COLUMNS}, created_at)"
                    f" SELECT id, 0, 0, {self._VERSION_COLUMNS}, created_at FROM messages WHERE id = ?",
                    (message_id,))
            conn.execute("UPDATE reply_versions SET shown = 0 WHERE message_id = ?", (message_id,))
            conn.execute(
                "UPDATE messages SET text = '', state = 'streaming', finish_reason = NULL, prompt_tokens = 0,"
                " generated_tokens = 0, reused_tokens = 0, ttft_s = NULL, prefill_tok_s = NULL,"
                " decode_tok_s = NULL WHERE id = ?", (message_id,))
            self._touch(msg.chat_id)
        return message_id

    def _show_version(self, conn, message_id: int, idx: int) -> None:
        msg = self.get_message(message_id)
        row = conn.execute(f"SELECT {self._VERSION_COLUMNS} FROM reply_versions WHERE message_id = ? AND idx = ?",
                           (message_id, idx)).fetchone()
        if row is None or msg.state == "streaming":
            raise StoreError(f"message {message_id} has no version {idx}")
        conn.execute(
            "UPDATE messages SET text = ?, finish_reason = ?, prompt_tokens = ?, generated_tokens = ?,"
            " reused_tokens = ?, ttft_s = ?, prefill_tok_s = ?, decode_tok_s = ? WHERE id = ?",
            (*tuple(row), message_id))
        conn.execute("UPDATE reply_versions SET shown = (idx = ?) WHERE message_id = ?", (idx, message_id))
        self._touch(msg.chat_id)

    def reply_versions(self, message_id: int) -> list[dict[str, Any]]:
        """Every version of a reply, oldest first ([] when it was never regenerated)."""
        return [dict(r) for r in self._rows(
            f"SELECT idx, shown, {self._VERSION_COLUMNS}, created_at FROM reply_versions"
            " WHERE message_id = ? ORDER BY idx", (message_id,))]

    def _insert_version(self, conn, message_id: int, version: dict[str, Any]) -> None:
        """Append a version to a reply (import); `version` as reply_versions() gives it."""
        idx = conn.execute("SELECT coalesce(max(idx), -1) + 1 FROM reply_versions WHERE message_id = ?",
                           (message_id,)).fetchone()[0]
        values = [version.get(k) for k in ("finish_reason", "prompt_tokens", "generated_tokens",
                                           "reused_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s")]
        conn.execute(
            f"INSERT INTO reply_versions (message_id, idx, shown, {self._VERSION_COLUMNS}, created_at)"
            " VALUES (?, ?, ?, ?, ?, coalesce(?, 0), coalesce(?, 0), coalesce(?, 0), ?, ?, ?, ?)",
            (message_id, idx, int(bool(version.get("shown"))), str(version.get("text") or ""), *values,
             version.get("created_at") or self._now()))

    def abandon_reply(self, message_id: int) -> None:
        """A reply that failed with nothing written: gone, or, when it was a regenerate, back
        to the version shown before."""
        last = self._rows("SELECT max(idx) AS idx FROM reply_versions WHERE message_id = ?", (message_id,))
        if last[0]["idx"] is None:
            self.delete_message(message_id)
            return
        with self._tx() as conn:
            conn.execute("UPDATE messages SET state = 'complete' WHERE id = ?", (message_id,))
            self._show_version(conn, message_id, last[0]["idx"])

    # ---- a reply being generated

    def begin_reply(self, chat_id: int, role: str = "assistant") -> int:
        """Create the (empty) reply row in state `streaming`; returns its message id."""
        return self._insert_message(chat_id, role, "", [], "streaming", None, None, None)

    # ---- tool use (schema v5)

    def set_tool(self, message_id: int, data: dict | None) -> None:
        """Set a message's tool calls (assistant) or card (tool message); None clears it."""
        try:
            encoded = None if data is None else json.dumps(data)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"message {message_id} tool data: not JSON-serialisable: {exc}") from exc
        with self._tx() as conn:
            conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?", (encoded, message_id))

    def add_tool_message(self, chat_id: int, text: str, card: dict) -> int:
        """Append a tool message: `text` is the result the model is given, `card` what is shown."""
        with self._tx() as conn:
            self._require_chat(chat_id)
            now = self._now()
            message_id = self._insert_message_row(chat_id, "tool", text, [], "complete", None, None, now)
            conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?", (json.dumps(card), message_id))
            self._touch(chat_id, now)
            return message_id

    def update_tool_message(self, message_id: int, text: str, card: dict) -> None:
        with self._tx() as conn:
            conn.execute("UPDATE messages SET text = ?, tool_json = ? WHERE id = ? AND role = 'tool'",
                         (text, json.dumps(card), message_id))

    def checkpoint_reply(self, message_id: int, text: str, *, force: bool = False) -> bool:
        """Save the partial text of a streaming reply, in its own transaction. Skipped
        (returns False) within `checkpoint_interval_s` of the previous checkpoint unless
        `force`, and when the message is gone or no longer streaming."""
        with self._lock:
            now = time.monotonic()
            last = self._last_checkpoint.get(message_id)
            if not force and last is not None and now - last < self.checkpoint_interval_s:
                return False
            with self._tx() as conn:
                updated = conn.execute(
                    "UPDATE messages SET text = ? WHERE id = ? AND state = 'streaming'", (text, message_id)
                ).rowcount
                if updated:
                    conn.execute(
                        "UPDATE chats SET updated_at = ? WHERE id = "
                        "(SELECT chat_id FROM messages WHERE id = ?)",
                        (self._now(), message_id),
                    )
            self._last_checkpoint[message_id] = now
            return bool(updated)

    def finish_reply(
        self,
        message_id: int,
        text: str,
        stats: GenerationStats | None = None,
        finish_reason: str | None = None,
    ) -> bool:
        """Save the final text and numbers; the reply becomes `complete`. `finish_reason`
        defaults to stats.finish_reason. Returns False when the message was deleted
        meanwhile (e.g. its chat), raises StoreError if it is not streaming."""
        stats = stats or GenerationStats()
        reason = finish_reason or stats.finish_reason
        with self._tx() as conn:
            self._last_checkpoint.pop(message_id, None)
            row = conn.execute("SELECT chat_id, state FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return False
            if row["state"] != "streaming":
                raise StoreError(f"message {message_id} is {row['state']}, not a streaming reply")
            conn.execute(
                "UPDATE messages SET text = ?, state = 'complete', finish_reason = ?,"
                " prompt_tokens = ?, generated_tokens = ?, reused_tokens = ?, ttft_s = ?,"
                " prefill_tok_s = ?, decode_tok_s = ? WHERE id = ?",
                (text, reason, *stat_values(stats), message_id),
            )
            if conn.execute("SELECT 1 FROM reply_versions WHERE message_id = ?", (message_id,)).fetchone():
                # A regenerated reply: this text is its newest version, and the shown one.
                conn.execute("UPDATE reply_versions SET shown = 0 WHERE message_id = ?", (message_id,))
                conn.execute(
                    f"INSERT INTO reply_versions (message_id, idx, shown, {self._VERSION_COLUMNS}, created_at)"
                    f" SELECT id, (SELECT max(idx) + 1 FROM reply_versions WHERE message_id = ?), 1,"
                    f" {self._VERSION_COLUMNS}, ? FROM messages WHERE id = ?",
                    (message_id, self._now(), message_id))
            self._touch(row["chat_id"])
            return True

    # ---- messages for the engine

    def engine_messages(self, chat_id: int, *, include_system_prompt: bool = True) -> list[ChatMessage]:
        """The chat as engine input: the chat's system prompt (if any) then every message
        that is not still streaming, with images loaded from the image store."""
        chat = self.get_chat(chat_id)
        out = []
        if include_system_prompt and chat.system_prompt:
            out.append(ChatMessage.text("system", chat.system_prompt))
        out.extend(self.to_chat_message(m) for m in chat.messages if m.state != "streaming")
        return out

    def to_chat_message(self, message: Message) -> ChatMessage:
        return to_chat_message(message, self.images.read)

    # ---- images

    def image_path(self, sha256: str, ext: str) -> Path:
        return self.images.path(sha256, ext)

    def image_bytes(self, sha256: str, ext: str) -> bytes:
        return self.images.read(sha256, ext)

    def _store_image_file(self, image: ImagePart) -> tuple[str, str, int]:
        """Write the image file (if new) before its row exists; returns (sha256, ext, size)."""
        if not isinstance(image, ImagePart):
            raise StoreError(f"image: expected ImagePart, got {type(image).__name__}")
        if not image.data:
            raise StoreError(f"image {image.name!r}: empty")
        sha = image.sha256
        known = self._open_conn().execute("SELECT ext FROM images WHERE sha256 = ?", (sha,)).fetchone()
        ext = known["ext"] if known else image_extension(image.data, image.name)
        self.images.write(image, ext)
        return sha, ext, len(image.data)

    def _image_shas(self, message_ids_sql: str, params: Sequence[Any]) -> set[str]:
        rows = self._conn.execute(
            f"SELECT DISTINCT sha256 FROM message_images WHERE message_id IN ({message_ids_sql})", params
        )
        return {r["sha256"] for r in rows}

    def _drop_unused_images(self, shas: set[str]) -> list[Path]:
        """Inside a transaction, after deleting messages: forget images no message uses."""
        doomed = []
        for sha in shas:
            if self._conn.execute("SELECT 1 FROM message_images WHERE sha256 = ? LIMIT 1", (sha,)).fetchone():
                continue
            row = self._conn.execute("SELECT ext FROM images WHERE sha256 = ?", (sha,)).fetchone()
            self._conn.execute("DELETE FROM images WHERE sha256 = ?", (sha,))
            if row:
                doomed.append(self.image_path(sha, row["ext"]))
        return doomed

    # ---- settings

    def get_setting(self, key: str, default: Any = None) -> Any:
        rows = self._rows("SELECT value_json FROM settings WHERE key = ?", (key,))
        return json.loads(rows[0]["value_json"]) if rows else default

    def set_setting(self, key: str, value: Any) -> None:
        try:
            encoded = json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"setting {key!r}: not JSON-serialisable: {exc}") from exc
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO settings (key, value_json) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value_json = excluded.value_json",
                (key, encoded),
            )

    def delete_setting(self, key: str) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM settings WHERE key = ?", (key,))

    def settings(self) -> dict[str, Any]:
        return {r["key"]: json.loads(r["value_json"]) for r in self._rows("SELECT * FROM settings")}

    # ---- checks

    def integrity_check(self) -> str:
        """'ok' when SQLite finds nothing wrong."""
        return "; ".join(r[0] for r in self._rows("PRAGMA integrity_check"))

    # ---- row helpers

    def _require_chat(self, chat_id: int) -> None:
        if not self._conn.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone():
            raise NotFoundError(f"chat {chat_id} does not exist")

    def _message_position(self, message_id: int, chat_id: int) -> int:
        row = self._conn.execute("SELECT chat_id, position FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None or row["chat_id"] != chat_id:
            raise NotFoundError(f"message {message_id} does not exist in chat {chat_id}")
        return row["position"]

    def _messages(self, where: str, params: Sequence[Any]) -> list[Message]:
        with self._lock:
            rows = self._rows(f"SELECT m.* FROM messages m {where} ORDER BY m.chat_id, m.position", params)
            images: dict[int, list[StoredImage]] = {}
            if rows:
                marks = ",".join("?" * len(rows))
                for r in self._rows(
                    "SELECT mi.message_id, mi.sha256, mi.name, mi.text_offset, i.ext"
                    " FROM message_images mi JOIN images i USING (sha256)"
                    f" WHERE mi.message_id IN ({marks}) ORDER BY mi.message_id, mi.idx",
                    [r["id"] for r in rows],
                ):
                    images.setdefault(r["message_id"], []).append(
                        StoredImage(r["sha256"], r["ext"], r["name"], r["text_offset"],
                                    self.image_path(r["sha256"], r["ext"]))
                    )
                versions = {r["message_id"]: (r["n"], r["shown"]) for table in ("reply_versions", "message_versions")
                            for r in self._rows(
                    "SELECT message_id, count(*) AS n, coalesce(max(CASE WHEN shown THEN idx END), -1) AS shown"
                    f" FROM {table} WHERE message_id IN ({marks}) GROUP BY message_id",
                    [r["id"] for r in rows])}
        messages = [message_from_row(r, images.get(r["id"], [])) for r in rows]
        for m in messages:
            if m.id in versions:
                n, shown = versions[m.id]
                # While a new version is written none is shown: it will be the last one.
                m.versions, m.version = (n + 1, n) if shown < 0 else (n, shown)
        return messages


# The messages a chat shows: hidden versions' messages (schema v4) have negative positions.
_SHOWN = "m.position >= 0"
# Message ids (an SQL select) with the hidden versions that hang off them, at any depth.
_WITH_HIDDEN = ("WITH RECURSIVE kept(id) AS ({} UNION SELECT h.id FROM messages h JOIN kept"
                " ON h.tail_of = kept.id) SELECT id FROM kept")

_CHAT_SELECT = (
    f"SELECT c.*, (SELECT count(*) FROM messages m WHERE m.chat_id = c.id AND {_SHOWN}) AS message_count"
    " FROM chats c"
)
_CHAT_ORDER = " ORDER BY c.pinned DESC, c.updated_at DESC, c.id DESC"
