"""Versions of a message: an edited message's texts, each with the messages that followed it
(schema v4, edit and resend keeps what was there), and a regenerated reply's replies (schema
v3, ‹ 2/3 ›)."""
from __future__ import annotations

import sqlite3
from typing import Any

from .database import Database
from .errors import StoreError
from .messages import Messages
from .rows import Message

# A reply version's columns, the same names in `messages` and `reply_versions`.
REPLY_VERSION_COLUMNS = ("text, finish_reason, prompt_tokens, generated_tokens, reused_tokens, ttft_s,"
                         " prefill_tok_s, decode_tok_s, reasoning, reasoning_s, reasoning_open")


class Versions:
    def __init__(self, db: Database, messages: Messages):
        self.db = db
        self.messages = messages

    # ---- versions of an edited message (edit and resend keeps what was there)

    def edit_as_version(self, message_id: int, text: str) -> None:
        """Edit and resend: `text` becomes a new version of the finished message, shown; the
        messages after it are kept, hidden, as what follows the version shown until now
        (schema v4). Switch back with show_version."""
        with self.db.tx() as conn:
            msg = self.messages.get(message_id)
            if msg.state == "streaming" or msg.position < 0:
                raise StoreError(f"message {message_id} is not a finished message of its chat")
            self.db.refuse_while_streaming(msg.chat_id)
            if not conn.execute("SELECT 1 FROM message_versions WHERE message_id = ?", (message_id,)).fetchone():
                conn.execute("INSERT INTO message_versions (message_id, idx, shown, text, created_at)"
                             " VALUES (?, 0, 1, ?, ?)", (message_id, msg.text, msg.created_at))
            shown = _shown_message_version(conn, message_id)
            _hide_tail(conn, msg, shown)
            conn.execute(
                "INSERT INTO message_versions (message_id, idx, shown, text, created_at) VALUES"
                " (?, (SELECT max(idx) + 1 FROM message_versions WHERE message_id = ?), 0, ?, ?)",
                (message_id, message_id, text, self.db.now()))
            newest = conn.execute("SELECT max(idx) FROM message_versions WHERE message_id = ?",
                                  (message_id,)).fetchone()[0]
            self._show_message_version(conn, msg, newest)

    def show(self, message_id: int, idx: int) -> None:
        """Show version `idx` of an edited message (with what followed it) or of a
        regenerated reply."""
        with self.db.tx() as conn:
            if conn.execute("SELECT 1 FROM message_versions WHERE message_id = ?", (message_id,)).fetchone():
                msg = self.messages.get(message_id)
                self.db.refuse_while_streaming(msg.chat_id)
                if not conn.execute("SELECT 1 FROM message_versions WHERE message_id = ? AND idx = ?",
                                    (message_id, idx)).fetchone():
                    raise StoreError(f"message {message_id} has no version {idx}")
                shown = _shown_message_version(conn, message_id)
                if idx != shown:
                    _hide_tail(conn, msg, shown)
                    self._show_message_version(conn, msg, idx)
            else:
                self.show_reply_version(conn, message_id, idx)

    def of_message(self, message_id: int) -> list[dict[str, Any]]:
        """Every version of an edited message, oldest first ([] when it was never edited)."""
        return [dict(r) for r in self.db.rows(
            "SELECT idx, shown, text, created_at FROM message_versions WHERE message_id = ? ORDER BY idx",
            (message_id,))]

    def _show_message_version(self, conn: sqlite3.Connection, msg: Message, idx: int) -> None:
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
        self.db.touch(msg.chat_id)

    # ---- versions of a reply (regenerate keeps the replies it replaces)

    def regenerate_reply(self, message_id: int) -> int:
        """Make the finished reply `message_id` streaming again for a new version, keeping
        what it says now as a version of it; the messages after it go. Returns its id."""
        msg = self.messages.get(message_id)
        if msg.role != "assistant" or msg.state == "streaming":
            raise StoreError(f"message {message_id} is not a finished reply")
        self.messages.truncate_after(message_id)
        with self.db.tx() as conn:
            if not conn.execute("SELECT 1 FROM reply_versions WHERE message_id = ?", (message_id,)).fetchone():
                conn.execute(
                    f"INSERT INTO reply_versions (message_id, idx, shown, {REPLY_VERSION_COLUMNS}, created_at)"
                    f" SELECT id, 0, 0, {REPLY_VERSION_COLUMNS}, created_at FROM messages WHERE id = ?",
                    (message_id,))
            conn.execute("UPDATE reply_versions SET shown = 0 WHERE message_id = ?", (message_id,))
            conn.execute(
                "UPDATE messages SET text = '', state = 'streaming', finish_reason = NULL, prompt_tokens = 0,"
                " generated_tokens = 0, reused_tokens = 0, ttft_s = NULL, prefill_tok_s = NULL,"
                " decode_tok_s = NULL, reasoning = '', reasoning_s = NULL, reasoning_open = 0 WHERE id = ?",
                (message_id,))
            self.db.touch(msg.chat_id)
        return message_id

    def show_reply_version(self, conn: sqlite3.Connection, message_id: int, idx: int) -> None:
        """Inside a transaction: reply version `idx`'s text and numbers become the message's."""
        msg = self.messages.get(message_id)
        row = conn.execute(f"SELECT {REPLY_VERSION_COLUMNS} FROM reply_versions WHERE message_id = ? AND idx = ?",
                           (message_id, idx)).fetchone()
        if row is None or msg.state == "streaming":
            raise StoreError(f"message {message_id} has no version {idx}")
        assigned = ", ".join(f"{column.strip()} = ?" for column in REPLY_VERSION_COLUMNS.split(","))
        conn.execute(f"UPDATE messages SET {assigned} WHERE id = ?", (*tuple(row), message_id))
        conn.execute("UPDATE reply_versions SET shown = (idx = ?) WHERE message_id = ?", (idx, message_id))
        self.db.touch(msg.chat_id)

    def of_reply(self, message_id: int) -> list[dict[str, Any]]:
        """Every version of a reply, oldest first ([] when it was never regenerated)."""
        return [dict(r) for r in self.db.rows(
            f"SELECT idx, shown, {REPLY_VERSION_COLUMNS}, created_at FROM reply_versions"
            " WHERE message_id = ? ORDER BY idx", (message_id,))]

    def newest_reply_version(self, message_id: int) -> int | None:
        """The index of a reply's newest version (None when it was never regenerated)."""
        return self.db.rows("SELECT max(idx) AS idx FROM reply_versions WHERE message_id = ?",
                            (message_id,))[0]["idx"]

    def keep_finished_reply(self, conn: sqlite3.Connection, message_id: int) -> None:
        """Inside a transaction, once a reply is finished: when it was regenerated, what it
        now says is its newest version, and the shown one."""
        if not conn.execute("SELECT 1 FROM reply_versions WHERE message_id = ?", (message_id,)).fetchone():
            return
        conn.execute("UPDATE reply_versions SET shown = 0 WHERE message_id = ?", (message_id,))
        conn.execute(
            f"INSERT INTO reply_versions (message_id, idx, shown, {REPLY_VERSION_COLUMNS}, created_at)"
            f" SELECT id, (SELECT max(idx) + 1 FROM reply_versions WHERE message_id = ?), 1,"
            f" {REPLY_VERSION_COLUMNS}, ? FROM messages WHERE id = ?",
            (message_id, self.db.now(), message_id))

    def insert_reply_version(self, conn: sqlite3.Connection, message_id: int, version: dict[str, Any]) -> None:
        """Append a version to a reply (import); `version` as of_reply() gives it."""
        idx = conn.execute("SELECT coalesce(max(idx), -1) + 1 FROM reply_versions WHERE message_id = ?",
                           (message_id,)).fetchone()[0]
        values = [version.get(k) for k in ("finish_reason", "prompt_tokens", "generated_tokens",
                                           "reused_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s")]
        reasoning = str(version.get("reasoning") or "")
        conn.execute(
            f"INSERT INTO reply_versions (message_id, idx, shown, {REPLY_VERSION_COLUMNS}, created_at)"
            " VALUES (?, ?, ?, ?, ?, coalesce(?, 0), coalesce(?, 0), coalesce(?, 0), ?, ?, ?, ?, ?, ?, ?)",
            (message_id, idx, int(bool(version.get("shown"))), str(version.get("text") or ""), *values,
             reasoning, version.get("reasoning_s") if reasoning else None,
             int(bool(reasoning) and bool(version.get("reasoning_open"))),
             version.get("created_at") or self.db.now()))

    def copy_reply_versions(self, conn: sqlite3.Connection, to_message_id: int, from_message_id: int) -> None:
        """Inside a transaction: a copied reply keeps its versions (‹ 2/3 ›), as its own (branch)."""
        conn.execute(
            f"INSERT INTO reply_versions (message_id, idx, shown, {REPLY_VERSION_COLUMNS}, created_at)"
            f" SELECT ?, idx, shown, {REPLY_VERSION_COLUMNS}, created_at FROM reply_versions"
            " WHERE message_id = ?",
            (to_message_id, from_message_id),
        )


def _shown_message_version(conn: sqlite3.Connection, message_id: int) -> int:
    row = conn.execute("SELECT idx FROM message_versions WHERE message_id = ? AND shown",
                       (message_id,)).fetchone()
    return row[0] if row is not None else 0


def _hide_tail(conn: sqlite3.Connection, msg: Message, version: int) -> None:
    """The shown messages after `msg` become the hidden continuation of its `version`."""
    conn.execute(
        "UPDATE messages SET tail_of = ?, tail_idx = ?, position = -id"
        " WHERE chat_id = ? AND position > ?", (msg.id, version, msg.chat_id, msg.position))
