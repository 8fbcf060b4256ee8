"""Image files: an image's extension from its bytes, else its name."""
from __future__ import annotations

import pytest

from tramontane.app.store import image_extension
from support.store_data import JPG, PNG


@pytest.mark.parametrize("data,name,ext", [
    (PNG, "x", "png"), (JPG, "x.png", "jpg"), (b"GIF89a...", "", "gif"), (b"BM....", "", "bmp"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "", "webp"), (b"????", "photo.TIFF", "tiff"),
    (b"????", "noext", "bin"), (b"????", "evil.p/ng", "bin"),
])
def test_image_extension(data, name, ext):
    assert image_extension(data, name) == ext
