"""The one connection to a data dir's chat database that every part of the store shares: its
thread lock, write transactions, reads, the clock the store stamps rows with, and the checks
every part makes (does this chat exist, where is this message)."""
from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from . import schema
from .errors import NotFoundError, StoreError


class Database:
    """One open chat database (schema.connect, migrated by the caller); one `Database` may
    be shared between threads: every call holds its re-entrant lock."""

    def __init__(self, conn: sqlite3.Connection, path: Path):
        self.path = path
        self.lock = threading.RLock()
        self._conn: sqlite3.Connection | None = conn
        self._last_now = 0.0

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.path}: the store is closed")
        return self._conn

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (schema.transaction) under the thread lock."""
        with self.lock:
            with schema.transaction(self.conn, self.path) as conn:
                yield conn

    def rows(self, sql: str, params: Sequence[Any] | dict = ()) -> list[sqlite3.Row]:
        with self.lock:
            try:
                return self.conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc

    def now(self) -> float:
        # Strictly increasing, so "most recent first" never ties within one session.
        with self.lock:
            now = max(time.time(), self._last_now + 1e-6)
            self._last_now = now
            return now

    def touch(self, chat_id: int, now: float | None = None) -> None:
        """Inside a transaction: the chat was changed now (it moves up the list)."""
        self.conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now or self.now(), chat_id))

    def require_chat(self, chat_id: int) -> None:
        if not self.conn.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone():
            raise NotFoundError(f"chat {chat_id} does not exist")

    def message_position(self, message_id: int, chat_id: int) -> int:
        row = self.conn.execute("SELECT chat_id, position FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None or row["chat_id"] != chat_id:
            raise NotFoundError(f"message {message_id} does not exist in chat {chat_id}")
        return row["position"]

    def refuse_while_streaming(self, chat_id: int) -> None:
        if self.conn.execute("SELECT 1 FROM messages WHERE chat_id = ? AND state = 'streaming'",
                             (chat_id,)).fetchone():
            raise StoreError(f"chat {chat_id}: a reply is being written; wait for it or stop it first")

    def integrity_check(self) -> str:
        """'ok' when SQLite finds nothing wrong."""
        return "; ".join(r[0] for r in self.rows("PRAGMA integrity_check"))


# The messages a chat shows: hidden versions' messages (schema v4) have negative positions.
SHOWN = "m.position >= 0"
# Message ids (an SQL select) with the hidden versions that hang off them, at any depth.
WITH_HIDDEN = ("WITH RECURSIVE kept(id) AS ({} UNION SELECT h.id FROM messages h JOIN kept"
               " ON h.tail_of = kept.id) SELECT id FROM kept")
