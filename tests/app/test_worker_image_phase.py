"""Issue 35, item 3: images were read (minutes on a CPU for large photos) with the reply showing
only "writing… …". The worker now says how many images of the new turn the vision tower reads
before the prompt, and the pending bubble shows it until the prompt's own progress or the
first words."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, Qt, Slot  # noqa: E402

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
        self.seen: list[tuple[int, int, str, int, int]] = []
        window.worker.imagesReading.connect(self.on_images)  # after the window's own slot

    @Slot(int, int, int)
    def on_images(self, _rid, done, total):
        bubble = self.window.view.streaming
        bar = bubble.prompt_bar if bubble is not None else None
        shown = bar is not None and not bar.isHidden()
        self.seen.append((done, total, bubble.status.text() if bubble else "",
                          bar.value() if shown else -1, bar.maximum() if shown else -1))


def test_the_pending_bubble_says_how_far_the_images_are_encoded(qtbot, window, tmp_path):
    """Issue 35, item 3: 'Encoding image 2 of 3…' with a bar at 1/3, image by image, before
    the prompt's own progress; the reply's engine call then finds them encoded (the tower's
    cache), so nothing is encoded twice."""
    watch = BubbleAtImages(window)
    paths = []
    for seed in (1, 2, 3):
        paths.append(tmp_path / f"{seed}.png")
        paths[-1].write_bytes(png_bytes(60 + 10 * seed, 40, seed))
    assert window.composer.add_files([str(p) for p in paths]) == 3
    window.composer.edit.setPlainText("What are these?")
    vision = window.worker.engine.vision
    misses = vision.cache_misses
    with qtbot.waitSignal(window.replyFinished, timeout=60000) as done:
        window.composer.send_button.click()
    assert watch.seen == [(0, 3, "Encoding image 1 of 3…", 0, 3), (1, 3, "Encoding image 2 of 3…", 1, 3),
                          (2, 3, "Encoding image 3 of 3…", 2, 3), (3, 3, "Encoding image 3 of 3…", 3, 3)]
    assert vision.cache_misses - misses == 3  # the engine's own call hit the tower's cache
    bubble = window.view.widgets[-1]
    assert bubble.message.id == done.args[0] and not bubble.status.text().startswith("Encoding")

    window.composer.edit.setPlainText("And now, in words?")  # no new image: nothing to say
    with qtbot.waitSignal(window.replyFinished, timeout=60000):
        window.composer.send_button.click()
    assert len(watch.seen) == 4


def test_stop_between_images_stops_before_the_rest_are_encoded(qtbot, window, tmp_path):
    """Stop while the first of three images is encoded: the others are not, and no empty
    "stopped" bubble stays."""
    paths = []
    for seed in (4, 5, 6):
        paths.append(tmp_path / f"{seed}.png")
        paths[-1].write_bytes(png_bytes(50, 30 + seed, seed))
    assert window.composer.add_files([str(p) for p in paths]) == 3
    window.composer.edit.setPlainText("Describe them")
    vision = window.worker.engine.vision
    misses = vision.cache_misses
    seen = []

    class StopAtFirst(QObject):
        @Slot(int, int, int)
        def on_images(self, _rid, done, total):
            seen.append((done, total))
            if done == 0:
                window.session.stop()  # sets the Event the worker reads between images

    stopper = StopAtFirst()  # run on the worker as it says so: the Stop comes before the next image
    window.worker.imagesReading.connect(stopper.on_images, Qt.ConnectionType.DirectConnection)
    with qtbot.waitSignal(window.session.busyChanged, timeout=60000, check_params_cb=lambda busy: not busy):
        window.composer.send_button.click()
    assert seen == [(0, 3)]
    assert vision.cache_misses == misses  # not one image encoded
    assert not [w for w in window.view.widgets if w.message.role == "assistant"]


def test_a_turn_with_a_new_image_runs_the_tower_once_and_replies_as_the_engine_alone(qtbot, worker):
    """Issue 35, item 3: the worker's progress phase encodes the new image (Engine.encode_images),
    then the reply's own engine call takes its features from the tower's content cache: one
    vision forward in the turn, not two, and the reply token for token a lone engine's."""
    import threading

    from tramontane.app.worker import ChatRequest
    from tramontane.engine.api import SamplingParams
    from tramontane.engine.runtime.local import LocalEngine
    from support.app_window import MMPROJ, MODEL

    def count_forwards(vision) -> list[int]:
        calls = []
        forward = vision.encode_images
        vision.encode_images = lambda pixels: calls.append(len(pixels)) or forward(pixels)
        return calls

    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    messages = [ChatMessage("user", ["What is this?", image(11)])]
    with qtbot.waitSignal(worker.loaded, timeout=30000):
        worker.load(MODEL, MMPROJ, "cpu")
    forwards = count_forwards(worker.engine.vision)
    seen = []
    worker.imagesReading.connect(lambda _rid, done, total: seen.append((done, total)))
    with qtbot.waitSignal(worker.finished, timeout=60000) as blocker:
        worker.chat(ChatRequest(3, messages, greedy, "img", threading.Event()))
    result = blocker.args[1]
    qtbot.waitUntil(lambda: seen == [(0, 1), (1, 1)], timeout=5000)  # the progress phase ran
    assert forwards == [1]

    direct = LocalEngine(MODEL, MMPROJ, device="cpu")
    try:
        alone = count_forwards(direct.vision)
        expect = direct.chat(messages, greedy)
    finally:
        direct.close()
    assert alone == [1]
    assert result.token_ids == expect.token_ids and result.text == expect.text
