"""Issue 35, item 3: each attached image shows what it costs in prompt tokens, and the images
together what the context has left (a 8000x6000 photo took ~2,350 of 4,096 tokens unsaid).
The count is checked against mistral-common's image encoder and the loaded engine's own
prompt."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from tramontane.app.widgets.composer import image_tokens_of  # noqa: E402
from tramontane.engine.api import ChatMessage, ImagePart  # noqa: E402

from support.app_window import png_bytes  # noqa: E402

REAL = (1540, 14, 2)  # Mistral-Small-3.1's projector: image_size, patch_size, merge


@pytest.mark.parametrize("size", [(8000, 6000), (1540, 1540), (640, 480), (1, 5000), (3079, 10), (28, 28)])
def test_the_chip_count_is_mistral_commons(size):
    mc_image = pytest.importorskip("mistral_common.tokens.tokenizers.image")
    from PIL import Image
    from mistral_common.protocol.instruct.chunk import ImageChunk

    encoder = mc_image.ImageEncoder(mc_image.ImageConfig(image_patch_size=14, max_image_size=1540, spatial_merge_size=2),
                                    mc_image.SpecialImageIDs(img=10, img_break=12, img_end=13))
    cols, rows = encoder._image_to_num_tokens(type("Sized", (), {"size": size})())  # reads .size only
    assert image_tokens_of(size, REAL) == rows * (cols + 1)
    if size[0] * size[1] <= 1 << 20:  # small enough to encode whole: its token list itself
        assert image_tokens_of(size, REAL) == len(encoder(ImageChunk(image=Image.new("RGB", size))).tokens)
    assert image_tokens_of(size, None) is None


def test_chips_show_their_cost_and_what_the_context_has_left(qtbot, window, tmp_path):
    composer = window.composer
    engine = window.worker.engine
    photo, strip = tmp_path / "photo.png", tmp_path / "strip.png"
    photo.write_bytes(png_bytes(200, 150))
    strip.write_bytes(png_bytes(30, 90, seed=1))
    assert composer.add_files([str(photo), str(strip)]) == 2
    text_only = engine.count_tokens([ChatMessage("user", ["look"])])
    for chip, path in zip(composer.chips, (photo, strip)):
        with_image = engine.count_tokens([ChatMessage("user", ["look", ImagePart(path.read_bytes(), path.name)])])
        assert chip.tokens == with_image - text_only  # what the prompt really takes
        assert chip.cost.text() == f"{chip.tokens:,} tokens" and not chip.cost.isHidden()
    total = sum(c.tokens for c in composer.chips)
    size = window.session.engine_info.context_size
    assert composer.images_cost.text() == f"2 images: {total:,} tokens of the {size:,} the context has left"
    assert composer.images_cost.objectName() == "statusLine"

    composer.set_context_room(total - 1)  # a chat that has used most of it
    assert composer.images_cost.text().endswith(f", more than the {total - 1:,} the context has left")
    assert composer.images_cost.objectName() == "errorLine"
    composer.remove_chip(composer.chips[0])
    assert composer.images_cost.text().startswith(f"1 image: {composer.chips[0].tokens:,} tokens")

    composer.set_image_geometry(None)  # e.g. a server's model: its tower is not ours to count
    assert composer.chips[0].cost.isHidden() and composer.images_cost.isHidden()
