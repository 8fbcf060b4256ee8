"""Whole or retrieved: a document goes into the prompt whole when its block fits the room the
context leaves after the conversation and the reply; otherwise it is cut into chunks (by page,
then heading, with overlap) kept in a per-chat SQLite FTS5 index, and a question brings in the
chunks BM25 ranks best, each with its file and page."""
from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..private_files import create_private_file
from .block import document_block
from .document import Document, DocumentError

CHUNK_WORDS = 160
OVERLAP_WORDS = 40
RETRIEVAL_TOKENS = 2048  # room kept for the excerpts when some document is retrieved
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#* *$")
WORD = re.compile(r"\w+")
TOKEN = re.compile(r"\S+\s*")
# Words too common to rank by (BM25 weighs them little anyway; dropping them keeps queries short).
STOPWORDS = frozenset(
    "a an and are as at be been but by can could did do does for from had has have how i if in into is it "
    "its me my of on or our she so than that the their them then there these they this to was we were what "
    "when where which who whom whose why will with would you your he his her".split())
SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, chunks INTEGER NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks USING fts5(
    text, heading, name UNINDEXED, page UNINDEXED, sha256 UNINDEXED,
    tokenize = 'porter unicode61 remove_diacritics 2');
"""


@dataclass(frozen=True)
class Budget:
    """The context's tokens and what is already spoken for in it."""

    context_tokens: int  # the model's context as loaded
    conversation_tokens: int  # the rendered conversation: system prompt, history, the question
    reply_tokens: int  # room kept for the answer (max_tokens)

    @property
    def room(self) -> int:
        return self.context_tokens - self.conversation_tokens - self.reply_tokens


@dataclass(frozen=True)
class Placement:
    document: Document
    mode: str  # "whole" or "retrieved"
    tokens: int  # its whole block's tokens


def place_documents(documents: Sequence[Document], count_tokens: Callable[[str], int], budget: Budget,
                    vision: bool = False, retrieval_tokens: int = RETRIEVAL_TOKENS) -> list[Placement]:
    """Each document whole or retrieved: all whole when their blocks fit the room together;
    otherwise, in attachment order, whole while they fit the room less `retrieval_tokens` kept
    for the excerpts of the rest, and the rest retrieved."""
    tokens = [count_tokens(document_block(d, vision)) for d in documents]
    if sum(tokens) <= budget.room:
        return [Placement(d, "whole", t) for d, t in zip(documents, tokens)]
    room, placed, whole = budget.room - retrieval_tokens, [], True
    for document, count in zip(documents, tokens):
        whole = whole and count <= room
        room -= count if whole else 0
        placed.append(Placement(document, "whole" if whole else "retrieved", count))
    return placed


@dataclass(frozen=True)
class Chunk:
    file: str
    page: int | None  # None for a document without pages
    heading: str  # the headings above it, outermost first, joined by " > "
    text: str


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading path, body) per run of text between Markdown heading lines."""
    out, path, lines = [], [], []
    for line in text.split("\n"):
        match = HEADING.match(line)
        if match is None:
            lines.append(line)
            continue
        out.append((" > ".join(h for _, h in path), "\n".join(lines)))
        level = len(match.group(1))
        path = [(lvl, h) for lvl, h in path if lvl < level] + [(level, match.group(2))]
        lines = [line]
    out.append((" > ".join(h for _, h in path), "\n".join(lines)))
    return [(heading, body) for heading, body in out if body.strip()]


def chunk_document(document: Document, words: int = CHUNK_WORDS, overlap: int = OVERLAP_WORDS) -> list[Chunk]:
    """A document's chunks: never across a page or a heading; windows of `words` words, each
    starting `words - overlap` words after the one before (whitespace and lines kept)."""
    if not 0 <= overlap < words:
        raise ValueError(f"overlap {overlap} must be at least 0 and less than the chunk's {words} words")
    chunks = []
    for page in document.pages:
        number = page.number if document.paged else None
        sections = [("", page.text)] if document.kind == "source" else _sections(page.text)
        for heading, body in sections:
            pieces = TOKEN.findall(body.strip())
            for start in range(0, max(len(pieces) - overlap, 1), words - overlap):
                text = "".join(pieces[start:start + words]).strip()
                if text:
                    chunks.append(Chunk(document.name, number, heading, text))
    return chunks


def fts_query(question: str) -> str:
    """The question as an FTS5 query: its distinct words, stopwords out, any may match (OR)."""
    words = dict.fromkeys(w for w in WORD.findall(question.lower()) if w not in STOPWORDS and len(w) > 1)
    return " OR ".join(f'"{w}"' for w in words)


@dataclass(frozen=True)
class Hit(Chunk):
    score: float = 0.0  # BM25 as SQLite gives it: lower is better


class DocumentIndex:
    """A chat's chunks in one SQLite file the caller names (made 0600); one row per document,
    keyed by its content's sha256, so a document attached twice is indexed once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            os.close(create_private_file(self.path))
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise DocumentError(f"{self.path}: the chat's document index cannot be opened ({exc}).") from exc

    def __enter__(self) -> "DocumentIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def add(self, document: Document, sha256: str) -> int:
        """Index a document's chunks (nothing if this content is there already); their count."""
        row = self._db.execute("SELECT chunks FROM documents WHERE sha256 = ?", (sha256,)).fetchone()
        if row is not None:
            return row[0]
        chunks = chunk_document(document)
        with self._db:
            self._db.executemany("INSERT INTO chunks (text, heading, name, page, sha256) VALUES (?, ?, ?, ?, ?)",
                                 [(c.text, c.heading, c.file, c.page, sha256) for c in chunks])
            self._db.execute("INSERT INTO documents VALUES (?, ?, ?)", (sha256, document.name, len(chunks)))
        return len(chunks)

    def remove(self, sha256: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM chunks WHERE sha256 = ?", (sha256,))
            self._db.execute("DELETE FROM documents WHERE sha256 = ?", (sha256,))

    def documents(self) -> list[tuple[str, str, int]]:
        """(sha256, name, chunks) of every indexed document, by name."""
        return self._db.execute("SELECT sha256, name, chunks FROM documents ORDER BY name").fetchall()

    def search(self, question: str, k: int = 5, sha256s: Sequence[str] | None = None) -> list[Hit]:
        """The `k` chunks BM25 ranks best for the question (the heading weighs half the text),
        among the documents `sha256s` names (all when None)."""
        query = fts_query(question)
        if not query or k <= 0:
            return []
        where, params = "chunks MATCH ?", [query]
        if sha256s is not None:
            where += f" AND sha256 IN ({', '.join('?' * len(sha256s))})"
            params += list(sha256s)
        rows = self._db.execute(
            f"SELECT name, page, heading, text, bm25(chunks, 1.0, 0.5) AS score FROM chunks WHERE {where} "
            "ORDER BY score LIMIT ?", (*params, k)).fetchall()
        return [Hit(name, page, heading, text, score) for name, page, heading, text, score in rows]
