"""Attached images and documents in the database: the `images` and `message_images` rows beside
the files images.py keeps. Files are written before their rows are committed and unlinked only
after the rows are gone (see store.py's account of crashes). A document is kept exactly as an
image is, content-addressed, its ext marked (rows.DOCUMENT_EXT_PREFIX, "doc.pdf"), so it is
branched, exported and deleted with its chat by the same code."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ...engine.api import DocumentPart, ImagePart
from .database import Database
from .errors import StoreError
from .images import ImageFiles, image_extension
from .rows import DOCUMENT_EXT_PREFIX, StoredImage

# An image or document written to the folder, ready for its row: (sha256, ext, size in bytes).
StoredFile = tuple[str, str, int]


def document_extension(name: str) -> str:
    """A stored document's ext: the marker and the name's suffix ("doc.pdf"; "doc.bin" without one)."""
    suffix = Path(name).suffix.lower().lstrip(".")
    return DOCUMENT_EXT_PREFIX + (suffix if suffix.isalnum() and len(suffix) <= 8 else "bin")


class Attachments:
    """The images of one data dir: files by content, and which message holds which."""

    def __init__(self, db: Database, images_dir: Path):
        self.db = db
        self.files = ImageFiles(images_dir)

    def path(self, sha256: str, ext: str) -> Path:
        return self.files.path(sha256, ext)

    def read(self, sha256: str, ext: str) -> bytes:
        return self.files.read(sha256, ext)

    def store_file(self, image: ImagePart | DocumentPart) -> StoredFile:
        """Write the image or document file (if new) before its row exists."""
        if not isinstance(image, (ImagePart, DocumentPart)):
            raise StoreError(f"attachment: expected ImagePart or DocumentPart, got {type(image).__name__}")
        document = isinstance(image, DocumentPart)
        if not image.data:
            raise StoreError(f"{'document' if document else 'image'} {image.name!r}: empty")
        sha = image.sha256
        known = self.db.conn.execute("SELECT ext FROM images WHERE sha256 = ?", (sha,)).fetchone()
        if known and known["ext"].startswith(DOCUMENT_EXT_PREFIX) != document:
            kind = "a document" if document else "an image"
            raise StoreError(f"{image.name}: these bytes are stored already as {'an image' if document else 'a document'}; "
                             f"they cannot be attached as {kind} too")
        ext = known["ext"] if known else document_extension(image.name) if document else image_extension(image.data, image.name)
        self.files.write(image, ext)
        return sha, ext, len(image.data)

    def insert_rows(self, message_id: int, text: str, stored: Sequence[tuple[StoredFile, str, int]],
                    created_at: float) -> None:
        """Inside a transaction: a new message's image references, each (file, name, offset)."""
        conn = self.db.conn
        for idx, ((sha, ext, size), name, offset) in enumerate(stored):
            conn.execute(
                "INSERT OR IGNORE INTO images (sha256, ext, size, created_at) VALUES (?, ?, ?, ?)",
                (sha, ext, size, created_at),
            )
            conn.execute(
                "INSERT INTO message_images (message_id, idx, sha256, name, text_offset)"
                " VALUES (?, ?, ?, ?, ?)",
                (message_id, idx, sha, name, max(0, min(int(offset), len(text)))),
            )

    def copy_rows(self, to_message_id: int, from_message_id: int) -> None:
        """Inside a transaction: a copied message shares its source's images (branch)."""
        self.db.conn.execute(
            "INSERT INTO message_images (message_id, idx, sha256, name, text_offset)"
            " SELECT ?, idx, sha256, name, text_offset FROM message_images WHERE message_id = ?",
            (to_message_id, from_message_id),
        )

    def of_messages(self, message_ids: Sequence[int]) -> dict[int, list[StoredImage]]:
        """Each message's images in their order (messages without any are left out)."""
        images: dict[int, list[StoredImage]] = {}
        if not message_ids:
            return images
        marks = ",".join("?" * len(message_ids))
        for r in self.db.rows(
            "SELECT mi.message_id, mi.sha256, mi.name, mi.text_offset, i.ext"
            " FROM message_images mi JOIN images i USING (sha256)"
            f" WHERE mi.message_id IN ({marks}) ORDER BY mi.message_id, mi.idx",
            list(message_ids),
        ):
            images.setdefault(r["message_id"], []).append(
                StoredImage(r["sha256"], r["ext"], r["name"], r["text_offset"],
                            self.path(r["sha256"], r["ext"]))
            )
        return images

    def shas_of(self, message_ids_sql: str, params: Sequence[Any]) -> set[str]:
        """The images the messages `message_ids_sql` (an SQL select of ids) refer to."""
        rows = self.db.conn.execute(
            f"SELECT DISTINCT sha256 FROM message_images WHERE message_id IN ({message_ids_sql})", params
        )
        return {r["sha256"] for r in rows}

    def drop_unused(self, shas: set[str]) -> list[Path]:
        """Inside a transaction, after deleting messages: forget images no message uses;
        returns their files, for `unlink` once the transaction is committed."""
        conn = self.db.conn
        doomed = []
        for sha in shas:
            if conn.execute("SELECT 1 FROM message_images WHERE sha256 = ? LIMIT 1", (sha,)).fetchone():
                continue
            row = conn.execute("SELECT ext FROM images WHERE sha256 = ?", (sha,)).fetchone()
            conn.execute("DELETE FROM images WHERE sha256 = ?", (sha,))
            if row:
                doomed.append(self.path(sha, row["ext"]))
        return doomed

    def unlink(self, paths: list[Path]) -> None:
        self.files.unlink(paths)

    def remove_unreferenced_files(self) -> None:
        """On open: files a crash left without their row go."""
        known = {f"{r['sha256']}.{r['ext']}" for r in self.db.conn.execute("SELECT sha256, ext FROM images")}
        self.files.remove_unknown(known)
