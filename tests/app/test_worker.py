"""The engine worker on its own: a real QThread owning a real LocalEngine (tiny fixture model).

What the window relies on: engine calls run on the worker thread, results arrive on the UI
thread as typed signals, cancel works from the UI thread, every failure is a readable message.
"""
from __future__ import annotations

import threading
import weakref

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, QThread, Slot  # noqa: E402

from tramontane.app.worker import ChatRequest  # noqa: E402
from tramontane.engine.api import ChatMessage, ImagePart, SamplingParams  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402

from support.app_window import MMPROJ, MODEL  # noqa: E402

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def load(qtbot, worker, model=MODEL, mmproj=MMPROJ):
    with qtbot.waitSignal(worker.loaded, timeout=30000) as blocker:
        worker.load(model, mmproj, "cpu")
    return blocker.args[0]


def test_load_reports_progress_and_info_on_the_ui_thread(qtbot, worker):
    progress, threads = [], []
    ui_thread = threading.get_ident()

    class Receiver(QObject):  # a receiver living in the UI thread, like the window
        @Slot(float, str)
        def on_progress(self, frac, what):
            progress.append((frac, what))
            threads.append(threading.get_ident())

    receiver = Receiver()
    worker.loadProgress.connect(receiver.on_progress)
    info = load(qtbot, worker)
    assert info.has_vision and info.device == "cpu" and not info.remote
    assert info.model_path == str(MODEL) and info.mmproj_path == str(MMPROJ)
    assert info.context_size == 512 and info.memory
    # qtbot's waitSignal hears `loaded` directly on the worker thread; the queued progress
    # calls reach the UI thread's event loop right after.
    qtbot.waitUntil(lambda: progress and progress[-1][0] == 1.0, timeout=5000)
    fracs = [f for f, _ in progress]
    assert len(fracs) >= 2 and fracs == sorted(fracs) and fracs[-1] == 1.0
    assert set(threads) == {ui_thread}  # delivered (queued) to the UI thread
    assert worker.thread() != QThread.currentThread()


def test_chat_runs_on_the_worker_thread_and_matches_a_direct_engine(qtbot, worker):
    load(qtbot, worker)
    engine_threads = []
    original_chat = worker.engine.chat

    def spy(*args, **kwargs):
        engine_threads.append(threading.get_ident())
        return original_chat(*args, **kwargs)

    worker.engine.chat = spy
    pieces = []
    worker.piece.connect(lambda rid, text: pieces.append((rid, text)))
    messages = [ChatMessage.text("user", "Bonjour")]
    with qtbot.waitSignal(worker.finished, timeout=30000) as blocker:
        worker.chat(ChatRequest(7, messages, GREEDY, "s", threading.Event()))
    rid, result = blocker.args
    assert rid == 7 and engine_threads and engine_threads[0] != threading.get_ident()
    assert len(pieces) > 1 and all(r == 7 for r, _ in pieces)
    assert "".join(t for _, t in pieces) == result.text
    assert result.stats.generated_tokens == 16

    direct = LocalEngine(MODEL, None, device="cpu")
    try:
        expect = direct.chat(messages, GREEDY)
    finally:
        direct.close()
    assert result.text == expect.text and result.token_ids == expect.token_ids


def test_prepare_and_checkpoint_run_on_the_worker(qtbot, worker):
    load(qtbot, worker)
    calls = []
    main = threading.get_ident()

    def prepare():
        calls.append(("prepare", threading.get_ident()))
        return 42, [ChatMessage.text("user", "hi")], 99

    def checkpoint(message_id, text, thought):
        calls.append(("checkpoint", threading.get_ident(), message_id, text))
        assert thought == ""  # the tiny model does not think

    started = []
    worker.started.connect(lambda *args: started.append(args))
    with qtbot.waitSignal(worker.finished, timeout=30000) as blocker:
        worker.chat(ChatRequest(1, [], GREEDY, None, threading.Event(), prepare=prepare,
                                checkpoint=checkpoint))
    assert started == [(1, 42, 99)]
    assert calls[0][0] == "prepare" and calls[0][1] != main
    saved = [c for c in calls if c[0] == "checkpoint"]
    assert saved and all(c[1] != main and c[2] == 99 for c in saved)
    assert blocker.args[1].text.startswith(saved[-1][3])  # checkpoints are prefixes of the reply


def test_cancel_from_the_ui_thread_stops_at_once(qtbot, worker):
    load(qtbot, worker)
    cancel = threading.Event()
    ui = threading.get_ident()

    class Stopper(QObject):  # lives in the UI thread: its slot runs there
        count = 0

        @Slot(int, str)
        def on_piece(self, _rid, _text):
            assert threading.get_ident() == ui
            self.count += 1
            if self.count == 2:
                cancel.set()

    stopper = Stopper()
    worker.piece.connect(stopper.on_piece)
    params = SamplingParams(max_tokens=480, temperature=0.0, ignore_eos=True)
    with qtbot.waitSignal(worker.finished, timeout=30000) as blocker:
        worker.chat(ChatRequest(3, [ChatMessage.text("user", "go")], params, "s", cancel))
    result = blocker.args[1]
    assert result.finish_reason == "cancelled" and 2 <= result.stats.generated_tokens < 480


def test_failures_are_messages(qtbot, worker, tmp_path):
    with qtbot.waitSignal(worker.failed, timeout=10000) as blocker:
        worker.chat(ChatRequest(1, [ChatMessage.text("user", "x")], GREEDY, None, threading.Event()))
    assert "No model is loaded" in blocker.args[1]

    missing = tmp_path / "nowhere.gguf"
    with qtbot.waitSignal(worker.loadFailed, timeout=10000) as blocker:
        worker.load(missing, None, "cpu")
    assert "nowhere.gguf" in blocker.args[0]

    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model")
    with qtbot.waitSignal(worker.loadFailed, timeout=10000) as blocker:
        worker.load(text, None, "cpu")
    assert "notes.gguf" in blocker.args[0]

    # A projector that does not fit the model is refused in words.
    with qtbot.waitSignal(worker.loadFailed, timeout=30000) as blocker:
        worker.load(MODEL, MODEL, "cpu")
    assert blocker.args[0]

    load(qtbot, worker, mmproj=None)
    # An image sent to a model loaded without its projector.
    image_message = ChatMessage("user", [ImagePart(b"\x89PNG\r\n\x1a\n....", "x.png"), "hi"])
    with qtbot.waitSignal(worker.failed, timeout=30000) as blocker:
        worker.chat(ChatRequest(2, [image_message], GREEDY, None, threading.Event()))
    assert blocker.args[0] == 2 and "projector" in blocker.args[1]

    def broken_prepare():
        raise OSError("disk full")

    with qtbot.waitSignal(worker.failed, timeout=10000) as blocker:
        worker.chat(ChatRequest(5, [], GREEDY, None, threading.Event(), prepare=broken_prepare))
    assert blocker.args == [5, "Could not save the message: disk full"]


def test_unload_frees_the_engine(qtbot, worker):
    load(qtbot, worker)
    # what holds the memory: the model (weights, repacked copies) and its KV cache
    model, cache = weakref.ref(worker.engine.model), weakref.ref(worker.engine.pool)
    with qtbot.waitSignal(worker.unloaded, timeout=10000):
        worker.unload()
    assert worker.engine is None
    assert model() is None and cache() is None  # freed at unload, not at some later collection
    with qtbot.waitSignal(worker.failed, timeout=10000):
        worker.chat(ChatRequest(1, [ChatMessage.text("user", "x")], GREEDY, None, threading.Event()))


def test_thought_cut_reads_the_end_think_token_when_the_tokenizer_names_it():
    from types import SimpleNamespace

    from tramontane.app.worker import thought_cut
    from tramontane.engine.api import GenerationResult, GenerationStats

    thinking = SimpleNamespace(think_ids=(34, 35))  # Engine.think_ids
    stopped = GenerationStats(finish_reason="cancelled")
    assert thought_cut(thinking, GenerationResult("", [34, 7, 8], [], stopped))
    assert not thought_cut(thinking, GenerationResult("", [34, 7, 35], [], stopped))  # closed, then stopped
    server = SimpleNamespace(think_ids=None)  # ids not known: an answer or a reply that ended itself closed it
    assert thought_cut(server, GenerationResult("", [], [], stopped))
    assert not thought_cut(server, GenerationResult("Four.", [], [], stopped))
    assert not thought_cut(server, GenerationResult("", [], [], GenerationStats(finish_reason="stop")))

