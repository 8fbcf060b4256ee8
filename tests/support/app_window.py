"""Driving the real main window in tests: build/close it on the tiny fixture model, type and send,
drop files, make PNGs, count streamed pieces."""
from __future__ import annotations

import struct
import time
import zlib

from PySide6.QtCore import QMimeData, QObject, QPoint, QPointF, Qt, QTimer, QUrl, Slot
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from tramontane.app.store import Store
from tramontane.app.window import MainWindow

from support import FIXTURES
MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0, seed=None)


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A real, decodable RGB PNG (varied pixels so two seeds give different images)."""
    rows = b"".join(b"\x00" + bytes(((x * 7 + y * 13 + seed * 31) % 256) for x in range(width * 3))
                    for y in range(height))
    return png_with_idat(width, height, zlib.compress(rows))


def png_with_idat(width: int, height: int, idat: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def drop_files(widget, paths) -> QDropEvent:
    """What a drag from a file manager delivers: DragEnter, DragMove, then the QDropEvent
    (Qt only hands a Drop to a widget that accepted the drag)."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    enter = QDragEnterEvent(QPoint(20, 20), *args)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted(), "the widget refused the drag"
    QApplication.sendEvent(widget, QDragMoveEvent(QPoint(20, 20), *args))
    event = QDropEvent(QPointF(20, 20), *args)
    QApplication.sendEvent(widget, event)
    return event


class PieceCounter(QObject):
    """Counts the pieces as the UI thread receives them (a QObject slot, like the window's;
    a plain lambda would be called on the worker thread)."""

    def __init__(self, window, then=None):
        super().__init__()
        self.pieces: list[str] = []
        self.then = then
        window.worker.piece.connect(self.on_piece)

    @Slot(int, str)
    def on_piece(self, _rid: int, text: str) -> None:
        self.pieces.append(text)
        if self.then is not None:
            self.then()


class UiGaps:
    """The gaps between the ticks of a 5 ms timer on the UI thread: a long gap is the UI
    blocked for that long."""

    def __init__(self):
        self.gaps: list[float] = []
        self.last = time.perf_counter()
        self.timer = QTimer()
        self.timer.setInterval(5)
        self.timer.timeout.connect(self.tick)

    def tick(self) -> None:
        now = time.perf_counter()
        self.gaps.append(now - self.last)
        self.last = now

    def restart(self) -> None:
        """Forget the gaps so far and count from now."""
        self.gaps.clear()
        self.last = time.perf_counter()


def isolate(tmp_path, monkeypatch) -> None:
    """No test window touches the user's data or models folder, or the network."""
    monkeypatch.setenv("TRAMONTANE_DATA_DIR", str(tmp_path / "unused-default-data"))
    monkeypatch.setenv("TRAMONTANE_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def make_window(qtbot, data_dir, *, load=True, mmproj=True, autoload=False):
    store = Store(data_dir)
    window = MainWindow(store, autoload=autoload)
    window._test_store = store
    qtbot.addWidget(window)
    window.show()
    window.session.param_overrides = dict(GREEDY, max_tokens=12, ignore_eos=True)
    if load:
        window.model_loading.load_model(str(MODEL), str(MMPROJ) if mmproj else "")
        qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    return window


def wait_for_load(qtbot, window) -> None:
    """Until the window has its answer to a picked model: the file checked and the load over,
    loaded or refused."""
    qtbot.waitUntil(lambda: window.model_loading.checking_model is None and window.session.loading is None,
                    timeout=30000)


def load_and_wait(qtbot, window, model, mmproj="") -> None:
    """Pick `model` (and `mmproj`) as the user does and wait for the answer (wait_for_load)."""
    window.model_loading.load_model(str(model), str(mmproj) if mmproj else "")
    wait_for_load(qtbot, window)


def close_window(window) -> None:
    window.close()
    window._test_store.close()


class PromptRecorder:
    """The EncodedPrompts the local engine generates from, reply by reply (worker thread)."""

    def __init__(self, engine):
        self.engine, self.prompts = engine, []
        generate_from = engine.generate_from

        def recording(prompt, *args, **kwargs):
            self.prompts.append(prompt)
            return generate_from(prompt, *args, **kwargs)
        engine.generate_from = recording

    @property
    def ids(self) -> list[list[int]]:
        return [list(p.ids) for p in self.prompts]

    def text(self, reply: int = -1) -> str:
        return self.engine.tokenizer.decode(list(self.prompts[reply].ids))


def wait_read(qtbot, window, timeout_ms: int = 30000) -> None:
    """Until the composer has read (or refused) every document and image attached."""
    qtbot.waitUntil(lambda: not window.composer.checking, timeout=timeout_ms)


def send(qtbot, window, text: str) -> int:
    """Type `text` into the composer, press Enter and wait for the reply; its message id."""
    edit = window.composer.edit
    edit.setFocus()
    qtbot.keyClicks(edit, text)
    with qtbot.waitSignal(window.replyFinished, timeout=30000) as blocker:
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    return blocker.args[0]


def open_stored_chat(window, title: str, question: str, answer: str, images=()) -> int:
    """A stored chat of one question and its answer, listed and opened in the window; its id."""
    chat = window.store.create_chat(title)
    window.store.add_message(chat, "user", question, images)
    window.store.add_message(chat, "assistant", answer)
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat)
    return chat


def pick_server(qtbot, window, fake):
    """Add `fake` (a FakeVLLM serving "served-model") as the server "lab" and pick its model in
    the window's model box, waiting for it to load; the model box."""
    window.store.set_setting("remote_servers", [
        {"name": "lab", "base_url": fake.url, "api_key": "", "default_model": "served-model",
         "models": ["served-model"]}])
    combo = window.model_bar.model_combo
    combo.reload()
    with qtbot.waitSignal(window.modelLoaded, timeout=10000):
        combo.setCurrentIndex(combo.findText("served-model — lab"))
    return combo
