"""Chats: creating, changing, listing and deleting them, a branch (a copy up to a message), a
whole chat at once (import), and a chat as engine input."""
from __future__ import annotations

import json
from typing import Any, Sequence

from ...engine.api import ChatMessage
from .attachments import Attachments
from .database import SHOWN, Database
from .errors import NotFoundError
from .messages import Messages
from .rows import Chat, ChatInfo, chat_columns, chat_info, check_role_and_state
from .versions import Versions

# A chat's row with how many messages it shows, as ChatInfo reads it.
CHAT_SELECT = (
    f"SELECT c.*, (SELECT count(*) FROM messages m WHERE m.chat_id = c.id AND {SHOWN}) AS message_count"
    " FROM chats c"
)
# The sidebar's order: pinned chats first, then the most recently updated.
CHAT_ORDER = " ORDER BY c.pinned DESC, c.updated_at DESC, c.id DESC"


class Chats:
    def __init__(self, db: Database, messages: Messages, versions: Versions, attachments: Attachments):
        self.db = db
        self.messages = messages
        self.versions = versions
        self.attachments = attachments

    def create(self, title: str = "New chat", **fields: Any) -> int:
        """A new empty chat; `fields` are any of model_path, projector_path, remote_url,
        remote_model, system_prompt, settings (dict), pinned."""
        values = chat_columns({"title": title, **fields})
        now = self.db.now()
        values.setdefault("created_at", now)
        values.setdefault("updated_at", now)
        with self.db.tx():
            return self._insert(values)

    def _insert(self, values: dict[str, Any]) -> int:
        cols = ", ".join(values)
        marks = ", ".join(f":{c}" for c in values)
        return self.db.conn.execute(f"INSERT INTO chats ({cols}) VALUES ({marks})", values).lastrowid

    def update(self, chat_id: int, **fields: Any) -> None:
        """Change any of the create fields (title, model, settings, ...)."""
        values = chat_columns(fields)
        if not values:
            return
        sets = ", ".join(f"{c} = :{c}" for c in values)
        with self.db.tx() as conn:
            self.db.require_chat(chat_id)
            conn.execute(f"UPDATE chats SET {sets} WHERE id = :id", {**values, "id": chat_id})
            self.db.touch(chat_id)

    def update_settings(self, chat_id: int, **changes: Any) -> dict[str, Any]:
        """Set keys of the chat's settings (None removes one), the others kept, read and
        written in one transaction; the settings after the change."""
        with self.db.tx() as conn:
            self.db.require_chat(chat_id)
            raw = conn.execute("SELECT settings_json FROM chats WHERE id = ?", (chat_id,)).fetchone()[0]
            settings = json.loads(raw)
            for key, value in changes.items():
                if value is None:
                    settings.pop(key, None)
                else:
                    settings[key] = value
            values = chat_columns({"settings": settings})
            conn.execute("UPDATE chats SET settings_json = ? WHERE id = ?", (values["settings_json"], chat_id))
            self.db.touch(chat_id)
            return settings

    def rename(self, chat_id: int, title: str) -> None:
        self.update(chat_id, title=title)

    def set_pinned(self, chat_id: int, pinned: bool) -> None:
        self.update(chat_id, pinned=pinned)

    def delete(self, chat_id: int) -> None:
        with self.db.tx() as conn:
            self.db.require_chat(chat_id)
            shas = self.attachments.shas_of("SELECT id FROM messages WHERE chat_id = ?", (chat_id,))
            conn.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            doomed = self.attachments.drop_unused(shas)
        self.attachments.unlink(doomed)

    def list(self) -> list[ChatInfo]:
        """Every chat, pinned ones first, then most recently updated first."""
        return [chat_info(r) for r in self.db.rows(CHAT_SELECT + CHAT_ORDER)]

    def info(self, chat_id: int) -> ChatInfo:
        rows = self.db.rows(CHAT_SELECT + " WHERE c.id = ?", (chat_id,))
        if not rows:
            raise NotFoundError(f"chat {chat_id} does not exist")
        return chat_info(rows[0])

    def get(self, chat_id: int) -> Chat:
        """The chat with the messages it shows, in order."""
        with self.db.lock:
            info = self.info(chat_id)
            messages = self.messages.read(f"WHERE m.chat_id = ? AND {SHOWN}", (chat_id,))
        return Chat(**vars(info), messages=messages)

    def engine_messages(self, chat_id: int, *, include_system_prompt: bool = True) -> list[ChatMessage]:
        """The chat as engine input: the chat's system prompt (if any) then every message
        that is not still streaming, with images loaded from the image store."""
        chat = self.get(chat_id)
        out = []
        if include_system_prompt and chat.system_prompt:
            out.append(ChatMessage.text("system", chat.system_prompt))
        out.extend(self.messages.to_chat_message(m) for m in chat.messages if m.state != "streaming")
        return out

    def branch(self, chat_id: int, up_to_message_id: int | None = None, title: str | None = None) -> int:
        """A new chat with the same settings and a copy of the messages up to and including
        `up_to_message_id` (all of them when None), each reply with its versions. Images are
        shared, not copied."""
        with self.db.tx() as conn:
            info = self.info(chat_id)
            limit = None if up_to_message_id is None else self.db.message_position(up_to_message_id, chat_id)
            now = self.db.now()
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
                    " decode_tok_s, created_at, tool_json, reasoning, reasoning_s, reasoning_open)"
                    " SELECT ?, position, role, text,"
                    " CASE state WHEN 'streaming' THEN 'interrupted' ELSE state END,"
                    " CASE state WHEN 'streaming' THEN 'interrupted' ELSE finish_reason END,"
                    " prompt_tokens, generated_tokens, reused_tokens, ttft_s, prefill_tok_s,"
                    " decode_tok_s, created_at, tool_json, reasoning, reasoning_s,"
                    " CASE state WHEN 'streaming' THEN reasoning != '' AND text = '' ELSE reasoning_open END"
                    " FROM messages WHERE id = ?",
                    (new_id, src["id"]),
                ).lastrowid
                self.attachments.copy_rows(copy_id, src["id"])
                self.versions.copy_reply_versions(conn, copy_id, src["id"])
            return new_id

    def restore(self, chat_fields: dict[str, Any], messages: Sequence[dict[str, Any]]) -> int:
        """Create a whole chat in one transaction, keeping the given timestamps, states and
        stats (used by import). Each message dict has role, text and optionally images
        [(ImagePart, text_offset)], state, finish_reason, stats (GenerationStats), created_at,
        tool (calls or card), reasoning (with reasoning_s, reasoning_open), versions (dicts as
        Versions.of_reply gives them)."""
        values = chat_columns(chat_fields)
        now = self.db.now()
        values.setdefault("title", "Imported chat")
        values.setdefault("created_at", now)
        values.setdefault("updated_at", now)
        messages = list(messages)
        for i, msg in enumerate(messages):
            check_role_and_state(msg["role"], msg.get("state", "complete"), f"messages[{i}].")
        with self.db.lock:
            stored = [
                [(self.attachments.store_file(img), img.name, off) for img, off in msg.get("images", ())]
                for msg in messages
            ]
            with self.db.tx() as conn:
                chat_id = self._insert(values)
                for msg, images in zip(messages, stored):
                    state = msg.get("state", "complete")
                    message_id = self.messages.insert_row(
                        chat_id, msg["role"], msg.get("text", ""), images,
                        "interrupted" if state == "streaming" else state,
                        msg.get("finish_reason"), msg.get("stats"), float(msg.get("created_at", now)),
                    )
                    if msg.get("reasoning"):  # a reasoning model's thought (schema v6)
                        conn.execute("UPDATE messages SET reasoning = ?, reasoning_s = ?, reasoning_open = ?"
                                     " WHERE id = ?", (str(msg["reasoning"]), msg.get("reasoning_s"),
                                                       int(bool(msg.get("reasoning_open"))), message_id))
                    if msg.get("tool"):  # tool calls and cards (schema v5)
                        conn.execute("UPDATE messages SET tool_json = ? WHERE id = ?",
                                     (json.dumps(msg["tool"]), message_id))
                    for version in msg.get("versions", ()):  # the replies a regenerate kept
                        self.versions.insert_reply_version(conn, message_id, version)
                return chat_id
