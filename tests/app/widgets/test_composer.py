"""app/widgets/composer.py on its own: Enter sends and Shift+Enter breaks the line, images are
checked from their header before anything is decoded (each refusal one sentence naming the
file), a dropped .gguf is offered as a model, a pasted image is attached, Send and Stop swap
while a reply runs, and the message goes out with its images and leaves an empty composer."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QMimeData, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402

from support.app_window import png_bytes, png_with_idat  # noqa: E402
from tramontane.app.widgets.composer import AttachmentError, Composer, check_image  # noqa: E402
from tramontane.engine.api import ImagePart  # noqa: E402


@pytest.fixture
def composer(qtbot):
    c = Composer()
    qtbot.addWidget(c)
    c.set_vision(True)
    c.show()
    return c


def test_enter_sends_and_shift_enter_breaks_the_line(qtbot, composer):
    sent = []
    composer.sendRequested.connect(lambda text, images: sent.append((text, images)))
    qtbot.keyClicks(composer.edit, "first")
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(composer.edit, "second")
    assert sent == []
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    assert sent == [("first\nsecond", [])]


def test_images_are_refused_from_their_header_with_the_files_name(composer):
    with pytest.raises(AttachmentError, match=r"^empty\.png: the file is empty$"):
        check_image(b"", "empty.png")
    with pytest.raises(AttachmentError, match=r"^notes\.png: not an image"):
        check_image(b"just some text", "notes.png")
    huge = png_with_idat(30000, 30000, b"")  # a header claiming 900 megapixels, no pixels behind it
    with pytest.raises(AttachmentError, match=r"^bomb\.png: 30000×30000 pixels is too large"):
        check_image(huge, "bomb.png")
    assert check_image(png_bytes(20, 10), "ok.png") == (20, 10)
    assert not composer.add_image(ImagePart(huge, "bomb.png"))
    assert composer.message.text().startswith("bomb.png: ") and composer.images == []


def test_no_vision_says_why_and_a_duplicate_is_not_attached_twice(composer):
    composer.set_vision(False, "This model reads text only: load one with a projector.")
    assert not composer.add_image(ImagePart(png_bytes(16, 16), "cat.png"))
    assert composer.message.text() == "This model reads text only: load one with a projector."
    composer.set_vision(True)
    assert composer.add_image(ImagePart(png_bytes(16, 16), "cat.png"))
    assert not composer.add_image(ImagePart(png_bytes(16, 16), "same-cat.png"))
    assert composer.message.text() == "same-cat.png: already attached" and len(composer.chips) == 1


def test_files_a_model_is_offered_and_the_other_refusals_are_joined(qtbot, composer, tmp_path):
    (tmp_path / "photo.png").write_bytes(png_bytes(24, 16, seed=1))
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.png").write_text("no picture here")
    offered = []
    composer.modelFileOffered.connect(offered.append)
    added = composer.add_files([str(tmp_path / n) for n in ("photo.png", "model.gguf", "folder", "notes.png")])
    assert added == 1 and [im.name for im in composer.images] == ["photo.png"]
    assert offered == [str(tmp_path / "model.gguf")]
    lines = composer.message.text().splitlines()
    assert lines[0] == "folder: is a folder, not a file" and lines[1].startswith("notes.png: not an image")


def test_a_pasted_image_is_attached_as_png(composer):
    mime = QMimeData()
    image = QImage(12, 8, QImage.Format.Format_RGB32)
    image.fill(0x336699)
    mime.setImageData(image)
    assert composer.add_mime(mime) == 1
    assert composer.images[0].name == "pasted.png" and check_image(composer.images[0].data, "p") == (12, 8)
    urls = QMimeData()
    urls.setUrls([QUrl("https://example.invalid/cat.png")])
    assert composer.add_mime(urls) == 0 and composer.message.text() == "Only files and images can be attached"


def test_send_with_images_then_accepted_empties_and_busy_swaps_the_buttons(qtbot, composer):
    sent = []
    composer.sendRequested.connect(lambda text, images: sent.append((text, [im.name for im in images])))
    composer.add_image(ImagePart(png_bytes(16, 16, seed=2), "a.png"))
    composer.edit.setPlainText("what is this?")
    composer.set_busy(True)
    assert composer.stop_button.isVisible() and not composer.send_button.isVisible()
    composer.submit()
    assert sent == []  # a reply is running: nothing is sent
    composer.set_busy(False, can_regenerate=True)
    assert composer.send_button.isVisible() and composer.regenerate_button.isEnabled()
    composer.submit()
    assert sent == [("what is this?", ["a.png"])]
    composer.accepted()
    assert composer.edit.toPlainText() == "" and composer.images == [] and not composer.chip_box.isVisible()
    composer.submit()  # nothing to send
    assert len(sent) == 1


def test_a_note_is_not_shown_in_the_error_colour(qtbot, window):
    """How a reply's documents were read ('searched (too long to read whole)') is a note, not a
    failure: it was shown red like a refused file, and with a light-theme red in the dark theme."""
    from PySide6.QtGui import QPalette

    label = window.composer.message

    def colour():
        label.ensurePolished()
        return label.palette().color(QPalette.ColorRole.WindowText).name()

    for scheme in ("light", "dark"):
        window.appearance.set_theme(scheme)
        qtbot.wait(50)
        window.composer.show_message("report.pdf: searched (too long to read whole)", error=False)
        note = colour()
        window.composer.show_message("report.pdf: the file is encrypted")
        error = colour()
        assert note != error, (scheme, note)
        window.composer.show_message("report.pdf: read whole", error=False)
        assert colour() == note
