"""Hostile input through the real window: images dropped into the composer and GGUF files
opened as models. Each gives one clear message naming the file; the window stays responsive
and the open chat is unchanged."""
from __future__ import annotations

import time
import zlib

import pytest

pytest.importorskip("pytestqt")

from gguf import GGUFValueType as T  # noqa: E402
from PySide6.QtCore import QTimer  # noqa: E402

from support.app_window import MMPROJ, MODEL, drop_files, png_with_idat, send, wait_for_load  # noqa: E402
from support.gguf_edit import rewrite_gguf  # noqa: E402
from support.rss import peak_since, reset_peak  # noqa: E402

pytestmark = [pytest.mark.usefixtures("isolated"),
              pytest.mark.filterwarnings("ignore:Function.*QDrag.*Event:DeprecationWarning")]


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims width × height but carries almost no pixel data."""
    return png_with_idat(width, height, zlib.compress(b"\0" * 64))


def black_strip(width: int, height: int) -> bytes:
    """A real, fully decodable black RGB PNG (the issue's 1 × 5,000,000 strip is ~20 KB)."""
    row = b"\0" * (1 + 3 * width)
    return png_with_idat(width, height, zlib.compress(row * height, 9))


def chat_snapshot(window) -> list[tuple]:
    chat = window.store.get_chat(window.session.current_chat_id)
    return [(m.role, m.text, m.state, [im.sha256 for im in m.images]) for m in chat.messages]


class Heartbeat:
    """Counts timer ticks on the UI thread: a frozen window stops counting."""

    def __init__(self):
        self.ticks = 0
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    def _tick(self):
        self.ticks += 1

    def stop(self):
        self.timer.stop()


# name -> (file bytes, words the message must hold)
REFUSED_AT_DROP = {
    "bomb.png": (png_header(50_000, 50_000), "too large"),
    "strip-over-limit.png": (png_header(1, 89_478_486), "too large"),
    "notes.png": (b"this is a text file with a picture's name\n", "not an image"),
    "empty.png": (b"", "empty"),
    "zero-width.png": (png_with_idat(0, 10, zlib.compress(b"")), "not an image"),  # Pillow refuses a 0-pixel side
    "pdf.jpg": (b"%PDF-1.4\n" + b"0" * 300, "not an image"),
}


def test_hostile_images_dropped_are_refused_and_the_chat_is_unchanged(qtbot, window, tmp_path):
    send(qtbot, window, "hello")
    before = chat_snapshot(window)
    beat = Heartbeat()
    try:
        for name, (data, words) in REFUSED_AT_DROP.items():
            path = tmp_path / name
            path.write_bytes(data)
            drop_files(window.composer, [path])
            message = window.composer.message.text()
            assert window.composer.images == [], name
            assert window.composer.message.isVisible() and name in message and words in message, (name, message)
            assert message.count("\n") == 0, message  # one message, not a traceback
        qtbot.waitUntil(lambda: beat.ticks >= 5, timeout=5000)
    finally:
        beat.stop()
    assert chat_snapshot(window) == before
    assert window.composer.send_button.isEnabled() and window.isVisible()


def test_the_issues_strip_is_read_within_bounded_memory(qtbot, window, tmp_path):
    """A 1 × 5,000,000 black PNG (the issue's file) used to take the preprocessing past 2 GB;
    dropped and sent here, the reply arrives and the process grows by well under that."""
    path = tmp_path / "strip.png"
    path.write_bytes(black_strip(1, 5_000_000))
    drop_files(window.composer, [path])
    assert [im.name for im in window.composer.images] == ["strip.png"]
    base = reset_peak()
    send(qtbot, window, "what is this?")
    grown = peak_since(base)
    assert grown < 600 << 20, f"{grown / 2**20:.0f} MiB"
    messages = window.store.get_chat(window.session.current_chat_id).messages
    assert [m.role for m in messages] == ["user", "assistant"] and messages[0].images
    assert messages[1].state == "complete"


def test_a_small_undecodable_image_is_refused_at_the_drop(qtbot, window, tmp_path):
    """A truncated PNG passes the header check; a small one is decoded at once and refused
    with the engine's message, before it can join the chat (where every later turn would
    fail on it)."""
    send(qtbot, window, "hello")
    before = chat_snapshot(window)
    path = tmp_path / "cut.png"
    path.write_bytes(black_strip(300, 200)[:60])
    drop_files(window.composer, [path])
    message = window.composer.message.text()
    assert window.composer.images == [] and "cut.png" in message and "truncated" in message, message
    assert chat_snapshot(window) == before


def test_a_large_undecodable_image_is_taken_off_before_it_joins_the_chat(qtbot, window, tmp_path):
    """A large one is decoded off the UI thread; a send pressed meanwhile waits for the check,
    and does not go out when the picture is taken off."""
    send(qtbot, window, "hello")
    before = chat_snapshot(window)
    path = tmp_path / "big-cut.png"
    path.write_bytes(black_strip(2000, 1500)[:80])
    drop_files(window.composer, [path])
    assert len(window.composer.images) == 1  # header fine: attached while it is checked
    window.composer.edit.setPlainText("and this?")
    window.composer.submit()
    qtbot.waitUntil(lambda: not window.composer.checking, timeout=10000)
    message = window.composer.message.text()
    assert window.composer.images == [] and "big-cut.png" in message and "truncated" in message, message
    assert window.session.pending is None and window.composer.edit.toPlainText() == "and this?"
    assert chat_snapshot(window) == before
    send(qtbot, window, " again")  # the next turn works
    assert chat_snapshot(window)[: len(before)] == before


def test_a_send_pressed_while_a_good_image_is_checked_goes_out_after(qtbot, window, tmp_path):
    path = tmp_path / "fine.png"
    path.write_bytes(black_strip(2000, 1500))
    drop_files(window.composer, [path])
    assert window.composer.checking
    window.composer.edit.setPlainText("look")
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        window.composer.submit()
    messages = window.store.get_chat(window.session.current_chat_id).messages
    assert [m.role for m in messages] == ["user", "assistant"] and len(messages[0].images) == 1


HOSTILE_MODELS = {
    "blocks.gguf": ({"mistral3.block_count": (2**31, T.UINT64)}, "mistral3.block_count"),
    "eps.gguf": ({"mistral3.attention.layer_norm_rms_epsilon": ("abc", T.STRING)},
                 "mistral3.attention.layer_norm_rms_epsilon"),
    "bos.gguf": ({"tokenizer.ggml.bos_token_id": (float("nan"), T.FLOAT32)}, "tokenizer.ggml.bos_token_id"),
    "template.gguf": ({"tokenizer.ggml.tokens": (1.5, T.FLOAT32)}, "tokenizer.ggml.tokens"),
}


def test_hostile_models_are_refused_and_the_chat_is_unchanged(qtbot, window, tmp_path):
    send(qtbot, window, "hello")
    chat_id = window.session.current_chat_id
    before = chat_snapshot(window)
    beat = Heartbeat()
    try:
        for name, (edit, key) in HOSTILE_MODELS.items():
            path = rewrite_gguf(MODEL, tmp_path / name, set_kv=edit)
            t0 = time.perf_counter()
            window.model_loading.load_model(str(path))
            wait_for_load(qtbot, window)
            assert time.perf_counter() - t0 < 10
            assert window.session.engine_info is None
            shown = window.model_bar.model_label.text() + window.model_bar.model_label.toolTip()
            assert name in shown, shown
            assert key in window.session.notices[chat_id], window.session.notices[chat_id]
            assert "Traceback" not in window.session.notices[chat_id]
        ticks = beat.ticks
        qtbot.waitUntil(lambda: beat.ticks >= ticks + 5, timeout=5000)
    finally:
        beat.stop()
    assert window.session.current_chat_id == chat_id and chat_snapshot(window) == before
    # The window goes on: the good model loads again and the chat continues.
    window.model_loading.load_model(str(MODEL), str(MMPROJ))
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    send(qtbot, window, "back again")
    assert chat_snapshot(window)[: len(before)] == before


def test_a_hostile_projector_is_refused_naming_its_key(qtbot, window, tmp_path):
    send(qtbot, window, "hello")
    before = chat_snapshot(window)
    path = rewrite_gguf(MMPROJ, tmp_path / "mmproj-bad.gguf",
                        set_kv={"clip.vision.block_count": (2**40, T.UINT64)})
    window.model_loading.load_model(str(MODEL), str(path))
    wait_for_load(qtbot, window)
    notice = window.session.notices.get(window.session.current_chat_id, "")
    assert "mmproj-bad.gguf" in notice and "clip.vision.block_count" in notice, notice
    assert chat_snapshot(window) == before


def test_hostile_files_in_the_models_folder(qtbot, window, tmp_path):
    """The model manager lists a file whose header keys are broken as unreadable, with the
    key in its tooltip, and will not load it; a file whose header reads but whose counts are
    hostile loads into one message. The open chat is unchanged either way."""
    send(qtbot, window, "hello")
    chat_id = window.session.current_chat_id
    before = chat_snapshot(window)
    folder = tmp_path / "models" / "org__Tiny-GGUF"
    folder.mkdir(parents=True)
    rewrite_gguf(MODEL, folder / "name.gguf", set_kv={"general.name": ([1, 2], T.ARRAY, T.UINT8)})
    rewrite_gguf(MODEL, folder / "blocks.gguf", set_kv={"mistral3.block_count": (2**31, T.UINT64)})
    window.dialogs.open_model_manager(tab=2)
    dialog = window.dialogs.model_manager
    table = dialog.local_table
    qtbot.waitUntil(lambda: table.rowCount() >= 2, timeout=10000)  # and the model loaded lately
    rows = {table.item(r, 0).text(): r for r in range(table.rowCount())}
    broken = rows["name.gguf"]
    assert table.item(broken, 3).text() == "unreadable"
    assert "'general.name' should be a string, found array of 2 uint8" in table.item(broken, 0).toolTip()
    table.selectRow(broken)
    assert not dialog.local_load.isEnabled()
    table.selectRow(rows["blocks.gguf"])
    assert dialog.local_load.isEnabled()
    dialog.local_load.click()
    qtbot.waitUntil(lambda: window.model_loading.checking_model is None and window.session.loading is None
                    and window.session.engine_info is None, timeout=30000)
    assert "mistral3.block_count" in window.session.notices[chat_id] and "blocks.gguf" in window.session.notices[chat_id]
    assert window.session.current_chat_id == chat_id and chat_snapshot(window) == before
