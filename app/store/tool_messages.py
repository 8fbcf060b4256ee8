"""Tool use in a chat (schema v5): an assistant message's tool calls and a `tool` message's
card (what was called, the user's answer, the result, time, error), kept as JSON; the same
per-message JSON holds a reply's document sources (issue 37: the excerpts it was given)."""
from __future__ import annotations

import json

from .database import Database
from .errors import StoreError
from .messages import Messages
from .rows import tool_data


class ToolMessages:
    def __init__(self, db: Database, messages: Messages):
        self.db = db
        self.messages = messages

    def set_tool(self, message_id: int, data: dict | None) -> None:
        """Set a message's tool calls (assistant) or card (tool message); None clears it."""
        try:
            encoded = None if data is None else json.dumps(data)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"message {message_id} tool data: not JSON-serialisable: {exc}") from exc
        with self.db.tx() as conn:
            conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?", (encoded, message_id))

    def set_sources(self, message_id: int, sources: list[dict]) -> None:
        """A reply's document sources ({file, page, heading} each, shown under it), beside its
        tool calls in the message's JSON; [] clears them (a regenerate that searched nothing)."""
        with self.db.tx() as conn:
            row = conn.execute("SELECT tool_json FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return  # deleted meanwhile (its chat)
            data = {k: v for k, v in (tool_data(row["tool_json"]) or {}).items() if k != "sources"}
            if sources:
                data["sources"] = [dict(s) for s in sources]
            conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?",
                         (json.dumps(data) if data else None, message_id))

    def add(self, chat_id: int, text: str, card: dict) -> int:
        """Append a tool message: `text` is the result the model is given, `card` what is shown."""
        with self.db.tx() as conn:
            self.db.require_chat(chat_id)
            now = self.db.now()
            message_id = self.messages.insert_row(chat_id, "tool", text, [], "complete", None, None, now)
            conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?", (json.dumps(card), message_id))
            self.db.touch(chat_id, now)
            return message_id

    def update(self, message_id: int, text: str, card: dict) -> None:
        with self.db.tx() as conn:
            conn.execute("UPDATE messages SET text = ?, tool_json = ? WHERE id = ? AND role = 'tool'",
                         (text, json.dumps(card), message_id))

    def stop_unfinished(self) -> None:
        """Inside a transaction, on open after a crash: a call that was waiting for its answer,
        or running, will not finish now."""
        conn = self.db.conn
        for row in conn.execute(
                "SELECT id, tool_json FROM messages WHERE role = 'tool' AND (tool_json LIKE ? OR tool_json LIKE ?)",
                ('%"status": "waiting"%', '%"status": "running"%')).fetchall():
            card = tool_data(row["tool_json"])
            if card is not None and card.get("status") in ("waiting", "running"):
                conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?",
                             (json.dumps({**card, "status": "stopped"}), row["id"]))
