"""While a long prompt is read, the pending reply's bubble shows how far (the real window, the
tiny fixture model): the engine's progress (the batch scheduler's while the window serves,
LocalEngine's otherwise) comes through the worker's typed `promptProgress` signal, only for the
reply being written in the chat on screen, and is gone once words come.

    TRAMONTANE_SCREENSHOTS_DIR=/some/dir pytest tests/app/test_worker_prompt_progress.py

also saves the bubble during reading there (prompt-progress.png)."""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, Slot  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402

from tramontane.app.worker import ChatRequest  # noqa: E402
from tramontane.engine.api import ChatMessage, SamplingParams  # noqa: E402

from support.app_window import MODEL, close_window, make_window, send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

LONG = "Tell me everything about the winds that blow over the south of France, one by one. " * 12


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class BubbleWatch(QObject):
    """What the pending bubble shows at each progress signal (connected after the window, so
    the view has updated), and a picture of it in the middle of reading."""

    def __init__(self, window, shot: Path):
        super().__init__()
        self.window = window
        self.shot = shot
        self.seen: list[tuple[int, int, str, bool, int]] = []
        window.session.promptRead.connect(self.on_read)

    @Slot(int, int)
    def on_read(self, read, total):
        bubble = self.window.view.streaming
        if bubble is None:
            return
        bar = bubble.prompt_bar
        self.seen.append((read, total, bubble.status.text(), bar is not None and not bar.isHidden(),
                          bar.value() if bar is not None else -1))
        if 0 < read < total and not self.shot.exists():
            bubble.show()  # a message added in this turn of the event loop is shown at the next one
            assert bubble.grab().save(str(self.shot))


def test_the_pending_bubble_shows_the_prompt_being_read(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    window.session.param_overrides["max_tokens"] = 3
    shots = Path(os.environ.get("TRAMONTANE_SCREENSHOTS_DIR") or tmp_path)
    shot = shots / "prompt-progress.png"
    shot.unlink(missing_ok=True)
    try:
        # the window's server on: its reply is read by the batch scheduler, a chunk a step
        window.api_server.apply(True, free_port())
        qtbot.waitUntil(lambda: window.worker.batch_executor() is not None, timeout=10000)
        step = window.worker.batch_executor().scheduler.step_rows
        watch = BubbleWatch(window, shot)
        send(qtbot, window, LONG)
        total = watch.seen[-1][1]
        assert total > 2 * step
        assert [(r, t) for r, t, *_ in watch.seen] == [(min(r, total), total) for r in range(0, total + step, step)]
        for read, _, status, bar_shown, value in watch.seen[:-1]:
            assert status == f"Reading the prompt… {read:,} / {total:,} tokens"
            assert bar_shown and value == read
        read, _, status, bar_shown, _ = watch.seen[-1]  # all read: the words come next
        assert read == total and status == "writing…" and not bar_shown
        image = QImage(str(shot))
        assert not image.isNull() and image.width() > 200
        colours = {image.pixel(x, y) for x in range(0, image.width(), 3) for y in range(0, image.height(), 3)}
        assert len(colours) > 3  # drawn: text, bar, background
        reply = window.view.widgets[-1]
        assert reply.message.role == "assistant" and (reply.prompt_bar is None or reply.prompt_bar.isHidden())
    finally:
        close_window(window)


def test_without_the_server_the_engines_own_progress_comes_through_the_worker(qtbot, worker):
    class Seen(QObject):
        def __init__(self):
            super().__init__()
            self.progress, self.done = [], []
            worker.promptProgress.connect(self.on_progress)
            worker.finished.connect(self.on_finished)

        @Slot(int, int, int)
        def on_progress(self, rid, read, total):
            self.progress.append((rid, read, total))

        @Slot(int, object)
        def on_finished(self, rid, result):
            self.done.append(result)

    seen = Seen()
    with qtbot.waitSignal(worker.loaded, timeout=60000):
        worker.load(MODEL, None, "cpu")
    worker.chat(ChatRequest(7, [ChatMessage.text("user", LONG)], SamplingParams(max_tokens=2, temperature=0.0),
                            session_key="a", cancel=threading.Event()))
    qtbot.waitUntil(lambda: bool(seen.done), timeout=60000)
    n = seen.done[0].stats.prompt_tokens
    assert seen.progress and seen.progress[-1] == (7, n, n)  # LocalEngine's prefill, reported
    assert all(rid == 7 and 0 <= read <= total == n for rid, read, total in seen.progress)
