"""The chat database file: its schema, the forward migrations keyed on `PRAGMA user_version`,
the full-text search index, opening a connection and one write transaction."""
from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import StoreError

# Version 1 as first released. Never edit: old databases were created from exactly this.
SCHEMA_V1 = """
CREATE TABLE chats (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    title          TEXT NOT NULL,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL,
    model_path     TEXT,
    projector_path TEXT,
    remote_url     TEXT,
    remote_model   TEXT,
    system_prompt  TEXT NOT NULL DEFAULT '',
    settings_json  TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX chats_by_updated ON chats(updated_at);

CREATE TABLE messages (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id          INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    position         INTEGER NOT NULL,
    role             TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    text             TEXT NOT NULL DEFAULT '',
    state            TEXT NOT NULL DEFAULT 'complete'
                     CHECK (state IN ('complete', 'streaming', 'interrupted')),
    finish_reason    TEXT,
    prompt_tokens    INTEGER NOT NULL DEFAULT 0,
    generated_tokens INTEGER NOT NULL DEFAULT 0,
    ttft_s           REAL,
    decode_tok_s     REAL,
    created_at       REAL NOT NULL,
    UNIQUE (chat_id, position)
);

CREATE TABLE images (
    sha256     TEXT PRIMARY KEY,
    ext        TEXT NOT NULL,
    size       INTEGER NOT NULL,
    created_at REAL NOT NULL
);

CREATE TABLE message_images (
    message_id  INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    sha256      TEXT NOT NULL REFERENCES images(sha256),
    name        TEXT NOT NULL,
    text_offset INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id, idx)
);
CREATE INDEX message_images_by_sha ON message_images(sha256);

CREATE TABLE settings (
    key        TEXT PRIMARY KEY,
    value_json TEXT NOT NULL
);
"""

# v1 -> v2: pinned chats, and the KV-reuse / prefill numbers of each reply.
MIGRATE_V1_TO_V2 = """
ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN reused_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN prefill_tok_s REAL;
"""

# v2 -> v3: the replies a regenerate replaced, kept as versions of the reply (‹ 2/3 ›). Once a
# reply has been regenerated, every version of it (the shown one too, `shown` = 1) is a row
# here; the messages row holds a copy of the shown one, so the rest of the store reads as before.
MIGRATE_V2_TO_V3 = """
CREATE TABLE reply_versions (
    message_id       INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    idx              INTEGER NOT NULL,
    shown            INTEGER NOT NULL DEFAULT 0,
    text             TEXT NOT NULL,
    finish_reason    TEXT,
    prompt_tokens    INTEGER NOT NULL DEFAULT 0,
    generated_tokens INTEGER NOT NULL DEFAULT 0,
    reused_tokens    INTEGER NOT NULL DEFAULT 0,
    ttft_s           REAL,
    prefill_tok_s    REAL,
    decode_tok_s     REAL,
    created_at       REAL NOT NULL,
    PRIMARY KEY (message_id, idx)
);
"""

# v3 -> v4: edit and resend keeps what was there, as versions of the edited message (‹ 1/2 ›).
# `message_versions` holds each version's text (once a message has been edited, every version,
# the shown one too); the messages that followed a version not shown stay rows of `messages`,
# hidden: `tail_of` names the edited message, `tail_idx` the version they follow, and their
# position is minus their id (unique, and out of the way of the shown positions, which are
# >= 0); their order is their ids' order. Their replies keep their own reply_versions, and
# images stay referenced, so switching back restores everything.
MIGRATE_V3_TO_V4 = """
ALTER TABLE messages ADD COLUMN tail_of INTEGER REFERENCES messages(id) ON DELETE CASCADE;
ALTER TABLE messages ADD COLUMN tail_idx INTEGER;
CREATE INDEX messages_by_tail ON messages(tail_of);
CREATE TABLE message_versions (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    idx        INTEGER NOT NULL,
    shown      INTEGER NOT NULL DEFAULT 0,
    text       TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (message_id, idx)
);
"""

# v4 -> v5: tool use. An assistant message that called tools holds its calls, and a `tool`
# message the card of one call (tool, arguments, the user's answer, result, time, error), as
# JSON; the text of a tool message is the result the model was given.
MIGRATE_V4_TO_V5 = """
ALTER TABLE messages ADD COLUMN tool_json TEXT;
"""

# v5 -> v6: a reasoning model's thought ([THINK]...[/THINK], issue 36), apart from the answer in
# `text`: its text, how long the model thought (seconds, for "Thought for 12 s"), and whether it
# was cut off before [/THINK] (Stop while thinking: sent back without the [/THINK] it never
# wrote). On a reply and on each of its versions.
MIGRATE_V5_TO_V6 = """
ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN reasoning_s REAL;
ALTER TABLE messages ADD COLUMN reasoning_open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reply_versions ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
ALTER TABLE reply_versions ADD COLUMN reasoning_s REAL;
ALTER TABLE reply_versions ADD COLUMN reasoning_open INTEGER NOT NULL DEFAULT 0;
"""

# MIGRATIONS[n] brings a version-n database to version n + 1.
MIGRATIONS: dict[int, str] = {1: MIGRATE_V1_TO_V2, 2: MIGRATE_V2_TO_V3, 3: MIGRATE_V3_TO_V4,
                              4: MIGRATE_V4_TO_V5, 5: MIGRATE_V5_TO_V6}
SCHEMA_VERSION = 1 + len(MIGRATIONS)

# The search index is derived data, not part of the versioned schema: it is (re)built on
# open when FTS5 is available and dropped from use when it is not. The trigram tokenizer
# makes FTS5 match case-insensitive substrings, the same thing the fallback scan does.
_SEARCH_TRIGGERS = {
    "message_search_ai": """
        CREATE TRIGGER message_search_ai AFTER INSERT ON messages BEGIN
            INSERT INTO message_search(rowid, text) VALUES (new.id, new.text);
        END""",
    "message_search_ad": """
        CREATE TRIGGER message_search_ad AFTER DELETE ON messages BEGIN
            INSERT INTO message_search(message_search, rowid, text)
                VALUES ('delete', old.id, old.text);
        END""",
    "message_search_au": """
        CREATE TRIGGER message_search_au AFTER UPDATE OF text ON messages BEGIN
            INSERT INTO message_search(message_search, rowid, text)
                VALUES ('delete', old.id, old.text);
            INSERT INTO message_search(rowid, text) VALUES (new.id, new.text);
        END""",
}
TRIGRAM_MIN_CHARS = 3  # a trigram index cannot match shorter queries


def fts5_trigram_available() -> bool:
    """True when this Python's SQLite has FTS5 with the trigram tokenizer (SQLite >= 3.34)."""
    try:
        probe = sqlite3.connect(":memory:")
        try:
            probe.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='trigram')")
        finally:
            probe.close()
        return True
    except sqlite3.Error:
        return False


def fold(text: str | None) -> str:
    """Case folding for the substring search (SQL: tramontane_fold)."""
    return (text or "").lower()


def connect(db_path: Path) -> sqlite3.Connection:
    """Open the database in WAL mode with synchronous=FULL (each commit survives power loss)."""
    try:
        conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False, timeout=10.0)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_mode = WAL").fetchone()
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA user_version").fetchone()  # fails here on a non-database
    except sqlite3.Error as exc:
        raise StoreError(f"{db_path}: cannot open the chat database: {exc}") from exc
    conn.create_function("tramontane_fold", 1, fold, deterministic=True)
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection, db_path: Path) -> Iterator[sqlite3.Connection]:
    """One write transaction; takes the write lock up front (BEGIN IMMEDIATE). An SQLite
    error (disk full, I/O error...) becomes a StoreError naming the database."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield conn
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise StoreError(f"{db_path}: {exc}") from exc
        raise


def migrate(conn: sqlite3.Connection, db_path: Path) -> None:
    """Bring the database to SCHEMA_VERSION in one transaction, after copying an older one
    to `<name>.v<N>.bak`. Refuses newer versions and foreign databases."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{db_path}: schema version {version} is newer than this Tramontane "
            f"understands ({SCHEMA_VERSION}); update Tramontane to open it"
        )
    if version == SCHEMA_VERSION:
        return
    if version == 0 and _has_tables(conn):
        raise StoreError(f"{db_path}: not a Tramontane chat database (no schema version)")
    if version > 0:  # keep the old file until the user decides it is not needed
        backup = db_path.with_name(f"{db_path.name}.v{version}.bak")
        try:
            dest = sqlite3.connect(backup)
            try:
                conn.backup(dest)
            finally:
                dest.close()
        except sqlite3.Error as exc:
            raise StoreError(f"{backup}: cannot back up the database before migrating: {exc}") from exc
    try:
        with transaction(conn, db_path):
            if version == 0:
                _executescript(conn, SCHEMA_V1)
                version = 1
            while version < SCHEMA_VERSION:
                _executescript(conn, MIGRATIONS[version])
                version += 1
            conn.execute(f"PRAGMA user_version = {version}")
    except StoreError as exc:
        cause = exc.__cause__ or exc
        raise StoreError(f"{db_path}: migrating to schema {SCHEMA_VERSION} failed: {cause}") from cause


def setup_search(conn: sqlite3.Connection, db_path: Path) -> str:
    """Returns 'fts5' (trigram index on message text) or 'scan' (substring scan)."""
    existing = {r["name"] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    if not fts5_trigram_available():
        # Triggers into an FTS table this SQLite cannot load would break every write;
        # without them the index goes stale and is rebuilt by the next FTS5-able open.
        with transaction(conn, db_path):
            for name in _SEARCH_TRIGGERS:
                conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        return "scan"
    if existing.issuperset(_SEARCH_TRIGGERS):
        return "fts5"
    with transaction(conn, db_path):
        conn.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS message_search USING fts5("
            "text, content='messages', content_rowid='id', tokenize='trigram')"
        )
        for name, ddl in _SEARCH_TRIGGERS.items():
            conn.execute(f"DROP TRIGGER IF EXISTS {name}")
            conn.execute(ddl)
        conn.execute("INSERT INTO message_search(message_search) VALUES ('rebuild')")
    return "fts5"


def _executescript(conn: sqlite3.Connection, script: str) -> None:
    # sqlite3.executescript would COMMIT first; run statement by statement instead so
    # the whole migration stays one transaction.
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):  # also right for BEGIN ... END; bodies
            conn.execute(statement)
            statement = ""
    if statement.strip():  # a last statement without its semicolon
        conn.execute(statement)


def _has_tables(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()
    return row[0] > 0
