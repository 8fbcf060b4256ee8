"""Attached images: stored once by content, collected with the last message using them."""
from __future__ import annotations

import hashlib

import pytest

from tramontane.app.store import StoreError
from tramontane.engine.api import ImagePart
from support.store_data import JPG, PNG, image_files


def test_images_stored_once_by_content_and_collected(store):
    chat = store.create_chat()
    m1 = store.add_message(chat, "user", "a", [ImagePart(PNG, "one.png")])
    m2 = store.add_message(chat, "user", "b", [ImagePart(PNG, "same-bytes.png"), ImagePart(JPG, "two.jpg")])
    sha_png, sha_jpg = hashlib.sha256(PNG).hexdigest(), hashlib.sha256(JPG).hexdigest()
    png_path = store.images_dir / sha_png[:2] / f"{sha_png}.png"
    assert png_path.read_bytes() == PNG
    assert image_files(store) == {f"{sha_png}.png", f"{sha_jpg}.jpg"}
    assert [(i.name, i.sha256) for i in store.get_message(m2).images] == [
        ("same-bytes.png", sha_png), ("two.jpg", sha_jpg)]
    store.delete_message(m1)
    assert png_path.exists()  # m2 still refers to it
    store.delete_message(m2)
    assert image_files(store) == set()
    assert store.db.rows("SELECT count(*) AS n FROM images")[0]["n"] == 0
    with pytest.raises(StoreError, match="empty"):
        store.add_message(chat, "user", "x", [ImagePart(b"", "void.png")])
