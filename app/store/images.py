"""Content-addressed image files: each attached image stored once, as images/aa/<sha256>.<ext>.

Only files here; which message uses which image is in the database (store.py). Files are
written durably before the row that refers to them is committed and unlinked only after
the row is gone, so a crash leaves at most an unreferenced file, which `remove_unknown`
clears on the next open.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from ...engine.api import ImagePart
from ...engine.private_files import create_private_file, make_private_dir
from .errors import StoreError

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


def image_extension(data: bytes, name: str = "") -> str:
    """File extension for image bytes: from the magic number, else the name's suffix."""
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    suffix = Path(name).suffix.lower().lstrip(".")
    if suffix.isalnum() and len(suffix) <= 5:
        return suffix
    return "bin"


def write_durably(path: Path, data: bytes) -> None:
    """Write a file so that it is either absent or complete, even after a crash."""
    make_private_dir(path.parent)
    tmp = path.with_name(f".tmp-{os.getpid()}-{threading.get_ident()}-{path.name}")
    with os.fdopen(create_private_file(tmp), "wb") as f:  # 0600: a photo is the user's alone
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if os.name != "nt":  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class ImageFiles:
    """The images folder of a data dir."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, sha256: str, ext: str) -> Path:
        return self.root / sha256[:2] / f"{sha256}.{ext}"

    def read(self, sha256: str, ext: str) -> bytes:
        path = self.path(sha256, ext)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise StoreError(f"{path}: cannot read stored image: {exc.strerror or exc}") from exc

    def write(self, image: ImagePart, ext: str) -> None:
        """Store the image's bytes under its sha256 unless a complete copy is there already."""
        path = self.path(image.sha256, ext)
        if path.is_file() and path.stat().st_size == len(image.data):
            return
        try:
            write_durably(path, image.data)
        except OSError as exc:
            raise StoreError(f"{path}: cannot store image {image.name!r}: {exc.strerror or exc}") from exc

    @staticmethod
    def unlink(paths: list[Path]) -> None:
        # After the commit: if we crash before this, the next open removes the orphans.
        for path in paths:
            path.unlink(missing_ok=True)
            try:
                path.parent.rmdir()  # only succeeds when the shard folder is now empty
            except OSError:
                pass

    def remove_unknown(self, known: set[str]) -> None:
        """Delete every file whose name (`<sha256>.<ext>`) is not in `known`."""
        if not self.root.is_dir():
            return
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for file in sub.iterdir():
                if file.name not in known:
                    file.unlink(missing_ok=True)
