"""A chat's messages: adding them (with their images), reading them with their images and
versions, editing, deleting, cutting a chat short, and turning them into engine input."""
from __future__ import annotations

from typing import Sequence

from ...engine.api import ChatMessage, GenerationStats, ImagePart
from .attachments import Attachments, StoredFile
from .database import WITH_HIDDEN, Database
from .errors import NotFoundError, StoreError
from .rows import Message, check_role_and_state, split_parts, stat_values, to_chat_message
from .rows import message as message_from_row


class Messages:
    def __init__(self, db: Database, attachments: Attachments):
        self.db = db
        self.attachments = attachments

    def add(
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
        return self.insert(
            chat_id, role, text, list(zip(images, image_offsets)), state, finish_reason, stats, created_at
        )

    def add_chat_message(self, chat_id: int, message: ChatMessage) -> int:
        """Append an engine ChatMessage, keeping where its images sit among its text parts."""
        text, images = split_parts(message.parts)
        return self.insert(chat_id, message.role, text, images, "complete", None, None, None)

    def insert(
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
        """Append a message in its own transaction, its image files written first."""
        check_role_and_state(role, state)
        if not isinstance(text, str):
            raise StoreError(f"message text: expected str, got {type(text).__name__}")
        with self.db.lock:
            # Files first, rows second: a crash in between leaves only an orphan file.
            stored = [(self.attachments.store_file(img), img.name, off) for img, off in images]
            with self.db.tx():
                self.db.require_chat(chat_id)
                now = self.db.now()
                message_id = self.insert_row(
                    chat_id, role, text, stored, state, finish_reason, stats,
                    created_at if created_at is not None else now,
                )
                self.db.touch(chat_id, now)
                return message_id

    def insert_row(
        self,
        chat_id: int,
        role: str,
        text: str,
        stored_images: list[tuple[StoredFile, str, int]],
        state: str,
        finish_reason: str | None,
        stats: GenerationStats | None,
        created_at: float,
    ) -> int:
        """Inside a transaction: one message row, at the end of its chat, and its image references."""
        message_id = self.db.conn.execute(
            "INSERT INTO messages (chat_id, position, role, text, state, finish_reason,"
            " prompt_tokens, generated_tokens, reused_tokens, ttft_s, prefill_tok_s,"
            " decode_tok_s, created_at) VALUES (?, (SELECT coalesce(max(position), -1) + 1"
            " FROM messages WHERE chat_id = ?), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (chat_id, chat_id, role, text, state, finish_reason,
             *stat_values(stats or GenerationStats()), created_at),
        ).lastrowid
        self.attachments.insert_rows(message_id, text, stored_images, created_at)
        return message_id

    def get(self, message_id: int) -> Message:
        found = self.read("WHERE m.id = ?", (message_id,))
        if not found:
            raise NotFoundError(f"message {message_id} does not exist")
        return found[0]

    def edit(self, message_id: int, text: str) -> None:
        """Replace a finished message's text (edit-and-resend edits, then truncates after)."""
        with self.db.tx() as conn:
            msg = self.get(message_id)
            if msg.state == "streaming":
                raise StoreError(f"message {message_id} is still streaming; finish it before editing")
            conn.execute("UPDATE messages SET text = ? WHERE id = ?", (text, message_id))
            self.db.touch(msg.chat_id)

    def delete(self, message_id: int) -> None:
        with self.db.tx() as conn:
            msg = self.get(message_id)
            shas = self.attachments.shas_of(WITH_HIDDEN.format("SELECT ?"), (message_id,))
            conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            doomed = self.attachments.drop_unused(shas)
            self.db.touch(msg.chat_id)
        self.attachments.unlink(doomed)

    def truncate_after(self, message_id: int, *, inclusive: bool = False) -> int:
        """Delete every message after `message_id` in its chat (and it too when `inclusive`);
        for regenerate and edit-and-resend. Returns how many messages went."""
        with self.db.tx() as conn:
            msg = self.get(message_id)
            cut = msg.position if inclusive else msg.position + 1
            where = "chat_id = ? AND position >= ?"
            shas = self.attachments.shas_of(WITH_HIDDEN.format(f"SELECT id FROM messages WHERE {where}"),
                                            (msg.chat_id, cut))
            count = conn.execute(f"DELETE FROM messages WHERE {where}", (msg.chat_id, cut)).rowcount
            doomed = self.attachments.drop_unused(shas)
            self.db.touch(msg.chat_id)
        self.attachments.unlink(doomed)
        return count

    def read(self, where: str, params: Sequence) -> list[Message]:
        """The messages `where` selects (SQL on `messages m`), in chat order, each with its
        images and how many versions it has and which one is shown."""
        with self.db.lock:
            rows = self.db.rows(f"SELECT m.* FROM messages m {where} ORDER BY m.chat_id, m.position", params)
            ids = [r["id"] for r in rows]
            images = self.attachments.of_messages(ids)
            versions = self._version_counts(ids)
        messages = [message_from_row(r, images.get(r["id"], [])) for r in rows]
        for m in messages:
            if m.id in versions:
                n, shown = versions[m.id]
                # While a new version is written none is shown: it will be the last one.
                m.versions, m.version = (n + 1, n) if shown < 0 else (n, shown)
        return messages

    def _version_counts(self, message_ids: list[int]) -> dict[int, tuple[int, int]]:
        """message id -> (versions kept, index of the shown one or -1), edits and regenerates."""
        if not message_ids:
            return {}
        marks = ",".join("?" * len(message_ids))
        return {r["message_id"]: (r["n"], r["shown"]) for table in ("reply_versions", "message_versions")
                for r in self.db.rows(
                    "SELECT message_id, count(*) AS n, coalesce(max(CASE WHEN shown THEN idx END), -1) AS shown"
                    f" FROM {table} WHERE message_id IN ({marks}) GROUP BY message_id", message_ids)}

    def to_chat_message(self, message: Message) -> ChatMessage:
        return to_chat_message(message, self.attachments.read)
