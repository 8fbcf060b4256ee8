"""A reply being generated: its row in state `streaming`, the partial text checkpointed in its
own transactions, the final text and numbers, or its end when it failed with nothing written."""
from __future__ import annotations

import time

from ...engine.api import GenerationStats
from .database import Database
from .errors import StoreError
from .messages import Messages
from .rows import stat_values
from .versions import Versions


class Replies:
    def __init__(self, db: Database, messages: Messages, versions: Versions, *, checkpoint_interval_s: float):
        self.db = db
        self.messages = messages
        self.versions = versions
        # checkpoint writes at most once per this many seconds per message.
        self.checkpoint_interval_s = checkpoint_interval_s
        self._last_checkpoint: dict[int, float] = {}

    def begin(self, chat_id: int, role: str = "assistant") -> int:
        """Create the (empty) reply row in state `streaming`; returns its message id."""
        return self.messages.insert(chat_id, role, "", [], "streaming", None, None, None)

    def checkpoint(self, message_id: int, text: str, *, reasoning: str = "", force: bool = False) -> bool:
        """Save the partial text (and thought) of a streaming reply, in its own transaction. Skipped
        (returns False) within `checkpoint_interval_s` of the previous checkpoint unless
        `force`, and when the message is gone or no longer streaming."""
        with self.db.lock:
            now = time.monotonic()
            last = self._last_checkpoint.get(message_id)
            if not force and last is not None and now - last < self.checkpoint_interval_s:
                return False
            with self.db.tx() as conn:
                updated = conn.execute(
                    "UPDATE messages SET text = ?, reasoning = ? WHERE id = ? AND state = 'streaming'",
                    (text, reasoning, message_id)
                ).rowcount
                if updated:
                    conn.execute(
                        "UPDATE chats SET updated_at = ? WHERE id = "
                        "(SELECT chat_id FROM messages WHERE id = ?)",
                        (self.db.now(), message_id),
                    )
            self._last_checkpoint[message_id] = now
            return bool(updated)

    def finish(
        self,
        message_id: int,
        text: str,
        stats: GenerationStats | None = None,
        finish_reason: str | None = None,
        *,
        reasoning: str = "",
        reasoning_s: float | None = None,
        reasoning_open: bool = False,
    ) -> bool:
        """Save the final text and numbers; the reply becomes `complete`. `finish_reason`
        defaults to stats.finish_reason. `reasoning`: a reasoning model's thought, apart from
        the answer; `reasoning_s` how long it thought, `reasoning_open` whether it was cut off
        before [/THINK]. Returns False when the message was deleted meanwhile (e.g. its chat),
        raises StoreError if it is not streaming."""
        if not isinstance(reasoning, str):
            raise StoreError(f"message {message_id}: reasoning must be text, got {type(reasoning).__name__}")
        stats = stats or GenerationStats()
        reason = finish_reason or stats.finish_reason
        with self.db.tx() as conn:
            self._last_checkpoint.pop(message_id, None)
            row = conn.execute("SELECT chat_id, state FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return False
            if row["state"] != "streaming":
                raise StoreError(f"message {message_id} is {row['state']}, not a streaming reply")
            conn.execute(
                "UPDATE messages SET text = ?, state = 'complete', finish_reason = ?,"
                " prompt_tokens = ?, generated_tokens = ?, reused_tokens = ?, ttft_s = ?,"
                " prefill_tok_s = ?, decode_tok_s = ?, reasoning = ?, reasoning_s = ?, reasoning_open = ?"
                " WHERE id = ?",
                (text, reason, *stat_values(stats), reasoning, reasoning_s if reasoning else None,
                 int(bool(reasoning) and reasoning_open), message_id),
            )
            self.versions.keep_finished_reply(conn, message_id)
            self.db.touch(row["chat_id"])
            return True

    def abandon(self, message_id: int) -> None:
        """A reply that failed with nothing written: gone, or, when it was a regenerate, back
        to the version shown before."""
        newest = self.versions.newest_reply_version(message_id)
        if newest is None:
            self.messages.delete(message_id)
            return
        with self.db.tx() as conn:
            conn.execute("UPDATE messages SET state = 'complete' WHERE id = ?", (message_id,))
            self.versions.show_reply_version(conn, message_id, newest)
