"""Finding chats by what they say: a case-insensitive substring of the title or of a message,
through the FTS5 trigram index (schema.setup_search) or, without it, a scan."""
from __future__ import annotations

from . import schema
from .chats import CHAT_ORDER, CHAT_SELECT, Chats
from .database import SHOWN, Database
from .rows import ChatInfo, chat_info


class Search:
    def __init__(self, db: Database, chats: Chats, method: str):
        self.db = db
        self.chats = chats
        self.method = method  # 'fts5' or 'scan', as schema.setup_search found

    def chats_with(self, query: str) -> list[ChatInfo]:
        """Chats whose title or any message contains `query` (case-insensitive substring),
        ordered like Chats.list. Uses the FTS5 trigram index when `method == 'fts5'` and the
        query has at least 3 characters, else a scan of every message."""
        query = query.strip()
        if not query:
            return self.chats.list()
        folded = schema.fold(query)
        if self.method == "fts5" and len(query) >= schema.TRIGRAM_MIN_CHARS:
            phrase = '"' + query.replace('"', '""') + '"'
            in_messages = (
                f"c.id IN (SELECT m.chat_id FROM messages m WHERE {SHOWN} AND m.id IN "
                "(SELECT rowid FROM message_search WHERE message_search MATCH :phrase))"
            )
        else:
            phrase = None
            in_messages = (
                f"c.id IN (SELECT m.chat_id FROM messages m WHERE {SHOWN} "
                "AND instr(tramontane_fold(m.text), :folded) > 0)"
            )
        sql = (
            CHAT_SELECT
            + f" WHERE instr(tramontane_fold(c.title), :folded) > 0 OR {in_messages}"
            + CHAT_ORDER
        )
        rows = self.db.rows(sql, {"folded": folded, "phrase": phrase})
        return [chat_info(r) for r in rows]
