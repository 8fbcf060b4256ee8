"""What the store's tests put in a chat: small image bytes of two kinds, a conversation with one
image per question, and the image files a data dir holds."""
from __future__ import annotations

from tramontane.app.store import Store
from tramontane.engine.api import ImagePart

PNG = b"\x89PNG\r\n\x1a\n" + b"png-body"
JPG = b"\xff\xd8\xff\xe0" + b"jpeg-body"


def image_files(s: Store) -> set[str]:
    return {p.name for p in s.images_dir.glob("*/*")}


def conversation(s: Store, chat: int, turns: int) -> list[int]:
    """`turns` questions, each with an image of its own, and their answers; their ids."""
    ids = []
    for i in range(turns):
        ids.append(s.add_message(chat, "user", f"question {i}", [ImagePart(PNG + bytes([i]), f"q{i}.png")]))
        ids.append(s.add_message(chat, "assistant", f"answer {i}"))
    return ids
