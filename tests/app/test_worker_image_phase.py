"""Issue 35, item 3: images were read (minutes on a CPU for large photos) with the reply showing
only "writing… …". The worker now says how many images of the new turn the vision tower reads
before the prompt, and the pending bubble shows it until the prompt's own progress or the
first words."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, Slot  # noqa: E402

from tramontane.app.worker import new_images  # noqa: E402
from tramontane.engine.api import ChatMessage, ImagePart  # noqa: E402

from support.app_window import png_bytes  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def image(seed: int) -> ImagePart:
    return ImagePart(png_bytes(30, 20, seed), f"{seed}.png")


def test_only_the_new_turns_images_are_counted():
    history = [ChatMessage("user", ["a", image(1)]), ChatMessage("assistant", ["ok"]),
               ChatMessage("user", [image(2), "and", image(3)])]
    assert new_images(history) == 2
    assert new_images(history[:2]) == 0
    assert new_images([ChatMessage("user", ["plain"])]) == 0


class BubbleAtImages(QObject):
    def __init__(self, window):
        super().__init__()
        self.window = window
        self.seen: list[tuple[int, str, bool]] = []
        window.worker.imagesReading.connect(self.on_images)  # after the window's own slot

    @Slot(int, int)
    def on_images(self, _rid, count):
        bubble = self.window.view.streaming
        bar = bubble.prompt_bar if bubble is not None else None
        self.seen.append((count, bubble.status.text() if bubble else "",
                          bar is not None and not bar.isHidden() and bar.maximum() == 0))


def test_the_pending_bubble_says_the_images_are_being_read(qtbot, window, tmp_path):
    watch = BubbleAtImages(window)
    for seed in (1, 2):
        (tmp_path / f"{seed}.png").write_bytes(png_bytes(60, 40, seed))
    assert window.composer.add_files([str(tmp_path / "1.png"), str(tmp_path / "2.png")]) == 2
    window.composer.edit.setPlainText("What are these?")
    with qtbot.waitSignal(window.replyFinished, timeout=60000) as done:
        window.composer.send_button.click()
    assert watch.seen == [(2, "Reading 2 images…", True)]
    bubble = window.view.widgets[-1]
    assert bubble.message.id == done.args[0] and not bubble.status.text().startswith("Reading")

    window.composer.edit.setPlainText("And now, in words?")  # no new image: nothing to say
    with qtbot.waitSignal(window.replyFinished, timeout=60000):
        window.composer.send_button.click()
    assert len(watch.seen) == 1
