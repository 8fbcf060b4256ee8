"""Finding chats by what they say: a case-insensitive substring of the title or of any version
of any message (an edited message's earlier texts, a regenerated reply's other replies, the
messages that followed a version not shown), through the FTS5 trigram index
(schema.setup_search) or, without it, a scan."""
from __future__ import annotations

from . import schema
from .chats import CHAT_ORDER, CHAT_SELECT, Chats
from .database import Database
from .rows import ChatInfo, chat_info

# Chats with a kept version holding the text: the version tables are only the edited and
# regenerated messages, few beside `messages`, so they are scanned.
_IN_VERSIONS = " OR ".join(
    f"c.id IN (SELECT m.chat_id FROM {table} v JOIN messages m ON m.id = v.message_id"
    " WHERE instr(tramontane_fold(v.text), :folded) > 0)"
    for table in ("message_versions", "reply_versions"))


class Search:
    def __init__(self, db: Database, chats: Chats, method: str):
        self.db = db
        self.chats = chats
        self.method = method  # 'fts5' or 'scan', as schema.setup_search found

    def chats_with(self, query: str) -> list[ChatInfo]:
        """Chats whose title or any version of a message contains `query` (case-insensitive
        substring), ordered like Chats.list. Message rows are matched through the FTS5 trigram
        index when `method == 'fts5'` and the query has at least 3 characters, else scanned."""
        query = query.strip()
        if not query:
            return self.chats.list()
        folded = schema.fold(query)
        if self.method == "fts5" and len(query) >= schema.TRIGRAM_MIN_CHARS:
            phrase = '"' + query.replace('"', '""') + '"'
            in_messages = (
                "c.id IN (SELECT m.chat_id FROM messages m WHERE m.id IN "
                "(SELECT rowid FROM message_search WHERE message_search MATCH :phrase))"
            )
        else:
            phrase = None
            in_messages = ("c.id IN (SELECT m.chat_id FROM messages m"
                           " WHERE instr(tramontane_fold(m.text), :folded) > 0)")
        sql = (
            CHAT_SELECT
            + f" WHERE instr(tramontane_fold(c.title), :folded) > 0 OR {in_messages} OR {_IN_VERSIONS}"
            + CHAT_ORDER
        )
        rows = self.db.rows(sql, {"folded": folded, "phrase": phrase})
        return [chat_info(r) for r in rows]
