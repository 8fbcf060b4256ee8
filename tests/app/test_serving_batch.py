"""The window's API server batched with the window's own replies, on the real engine worker with
the tiny fixture model: while serving, the worker holds a BatchExecutor; the window's reply goes
on its priority lane and starts within the steps the lane guarantees, whatever 8 API streams do;
its prompt reading is reported; its chats keep their KV; unloading or switching the model
while streams run stops the scheduler and tells the clients in words that name no file."""
from __future__ import annotations

import json
import math
import shlex
import socket
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")

from PySide6.QtCore import QObject, Slot  # noqa: E402

from tramontane.app.serving import WindowServer  # noqa: E402
from tramontane.app.worker import ChatRequest  # noqa: E402
from tramontane.engine.api import ChatMessage, SamplingParams  # noqa: E402

from support.scripted import ScriptedLogits, script_logits
from support import FIXTURES  # noqa: E402
from support.batch_runs import Recorder  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
STREAMS = 8
# the window's messages: different from their first word on, so that nothing of one is in the
# prefix cache for the other
NORTH = "North wind: describe how the tramontane blows over the hills of Roussillon in winter, " * 2
SOUTH = "South wind: describe how the marin brings the rain over the plains of Roussillon in spring, " * 2


class Replies(QObject):
    """The worker's signals as the window gets them (on the UI thread)."""

    def __init__(self, worker):
        super().__init__()
        self.results: dict[int, object] = {}
        self.failures: dict[int, str] = {}
        self.progress: dict[int, list[tuple[int, int]]] = {}
        self.loads = 0
        worker.finished.connect(self.on_finished)
        worker.failed.connect(self.on_failed)
        worker.promptProgress.connect(self.on_progress)
        worker.loaded.connect(self.on_loaded)

    @Slot(int, object)
    def on_finished(self, rid, result):
        self.results[rid] = result

    @Slot(int, str)
    def on_failed(self, rid, words):
        self.failures[rid] = words

    @Slot(int, int, int)
    def on_progress(self, rid, read, total):
        self.progress.setdefault(rid, []).append((read, total))

    @Slot(object)
    def on_loaded(self, _info):
        self.loads += 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def load(qtbot, worker, replies):
    before = replies.loads
    worker.load(MODEL, None, "cpu")
    qtbot.waitUntil(lambda: replies.loads == before + 1, timeout=60000)


@pytest.fixture
def served(qtbot, worker):
    """The worker with the tiny model loaded and the window's server on (its batch started):
    the worker's signals as the window gets them, and the server switch."""
    replies = Replies(worker)
    load(qtbot, worker, replies)
    serving = WindowServer(worker)
    serving.apply(True, 0)
    qtbot.waitUntil(lambda: worker.batch_executor() is not None, timeout=10000)
    yield replies, serving
    serving.stop()


def window_reply(qtbot, worker, replies, rid: int, text: str, history=(), max_tokens: int = 3):
    """The window's reply to `text` after `history` (ChatMessages)."""
    worker.chat(ChatRequest(rid, [*history, ChatMessage.text("user", text)],
                            SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                            session_key="chat", cancel=threading.Event()))
    qtbot.waitUntil(lambda: rid in replies.results or rid in replies.failures, timeout=60000)
    assert rid not in replies.failures, replies.failures[rid]
    return replies.results[rid]


class PriorityClock:
    """On the scheduler: the step count when the window's (priority) request was submitted and
    when its first words came, and the rows every step ran (a Recorder)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.marks: list[dict] = []
        inner = scheduler.submit

        def submit(prompt, params, on_piece=None, cancel=None, priority=False, *more):
            if priority:
                mark = {"submitted": scheduler.steps}
                self.marks.append(mark)

                def piece(text, inner_piece=on_piece):
                    mark.setdefault("first", scheduler.steps)
                    if inner_piece is not None:
                        inner_piece(text)
                on_piece = piece
            return inner(prompt, params, on_piece, cancel, priority, *more)

        scheduler.submit = submit
        self.recorder = Recorder(scheduler.model)

    def rows_to_first_token(self, mark) -> int:
        """Rows through the model from the window's submission to its first token: the step in
        flight when it came, then its own."""
        return sum(sum(step) for step in self.recorder.steps[mark["submitted"]:mark["first"]])

    def close(self):
        self.recorder.close()


def start_streams(url: str, n: int, errors: list, max_tokens: int = 480) -> list[threading.Thread]:
    def stream(i):
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)
        try:
            for _ in client.chat.completions.create(
                    model="x", messages=[{"role": "user", "content": f"Stream {i}: tell a long story."}],
                    max_tokens=max_tokens, temperature=0, stream=True, extra_body={"ignore_eos": True}):
                pass
        except Exception as exc:  # noqa: BLE001 - the test looks at them
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def test_the_windows_reply_starts_within_the_priority_lanes_steps_while_8_api_streams_run(qtbot, worker, served):
    replies, serving = served
    clock = None
    try:
        scheduler = worker.batch_executor().scheduler
        clock = PriorityClock(scheduler)

        idle = window_reply(qtbot, worker, replies, 1, NORTH)
        errors: list = []
        threads = start_streams(serving.server.url, STREAMS, errors)
        # all 8 streams decoding (none still reading its prompt): a step of 8 one-row groups
        qtbot.waitUntil(lambda: clock.recorder.steps and clock.recorder.steps[-1] == [1] * STREAMS, timeout=60000)
        loaded = window_reply(qtbot, worker, replies, 2, SOUTH)
        during = clock.recorder.steps[clock.marks[1]["first"] - 1]
        assert scheduler.active == STREAMS, errors  # the streams were still running around it
    finally:
        if clock is not None:
            clock.close()
        serving.stop()
    for t in threads:
        t.join(60)

    idle_mark, loaded_mark = clock.marks
    step_rows = scheduler.step_rows
    for result, mark in ((idle, idle_mark), (loaded, loaded_mark)):
        mark["read"] = result.stats.prompt_tokens - result.stats.reused_tokens  # rows of its own to read
        mark["reading_steps"] = math.ceil(mark["read"] / step_rows)
        mark["rows"] = clock.rows_to_first_token(mark)
    assert idle_mark["read"] > 40 and loaded_mark["read"] > 40
    # idle: its first token comes with the step that reads the last of its prompt, nothing else ran
    assert idle_mark["first"] - idle_mark["submitted"] == idle_mark["reading_steps"]
    assert idle_mark["rows"] == idle_mark["read"]
    # the lane's guarantee under 8 streams: the step in flight, then its prompt read alone
    assert loaded_mark["first"] - loaded_mark["submitted"] <= loaded_mark["reading_steps"] + 1
    assert during == [loaded_mark["read"] - (loaded_mark["reading_steps"] - 1) * step_rows]  # its chunk ran alone
    assert loaded_mark["rows"] <= loaded_mark["read"] + STREAMS  # at most the 8 decode rows in flight
    # TTFT in rows through the model per row of its own prompt (the machine is shared: not in
    # seconds), loaded against idle
    ratio = (loaded_mark["rows"] / loaded_mark["read"]) / (idle_mark["rows"] / idle_mark["read"])
    assert ratio <= 1.3, (loaded_mark, idle_mark)
    qtbot.waitUntil(lambda: worker.batch_executor() is None, timeout=30000)  # the switch off stops the scheduler


def test_the_windows_chats_keep_their_kv_and_report_prompt_reading_while_serving(qtbot, worker, served):
    replies, _ = served
    step_rows = worker.batch_executor().scheduler.step_rows
    long_text = "A long message about the winds of the south of France and their names. " * 12
    first = window_reply(qtbot, worker, replies, 1, long_text)
    n = first.stats.prompt_tokens
    assert n > 2 * step_rows and first.stats.reused_tokens == 0
    assert replies.progress[1] == [(min(read, n), n) for read in range(0, n + step_rows, step_rows)]
    # the next turn of the chat reuses its KV (the window's kept slot)
    history = [ChatMessage.text("user", long_text), ChatMessage.text("assistant", first.text)]
    second = window_reply(qtbot, worker, replies, 2, "And the east wind?", history)
    assert second.stats.reused_tokens >= n
    assert replies.progress[2][-1] == (second.stats.prompt_tokens - second.stats.reused_tokens,) * 2


def test_unloading_or_switching_while_streams_run_stops_the_batch_and_says_so_without_paths(qtbot, worker, served):
    replies, serving = served
    first = worker.batch_executor()
    scheduler = first.scheduler
    errors: list = []
    threads = start_streams(serving.server.url, 3, errors)
    qtbot.waitUntil(lambda: scheduler.active == 3, timeout=60000)
    load(qtbot, worker, replies)  # the same file again: a switch
    for t in threads:
        t.join(60)
    assert len(errors) == 3
    for exc in errors:
        words = str(exc)
        assert "unloaded or changed" in words and str(MODEL.parent) not in words and ".gguf" not in words
    second = worker.batch_executor()
    assert second is not None and second is not first and first.scheduler._thread is None
    # the new model serves, batched again
    client = openai.OpenAI(base_url=serving.server.url, api_key="x", max_retries=0, timeout=60)
    reply = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")

    worker.unload()
    qtbot.waitUntil(lambda: worker.batch_executor() is None, timeout=30000)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert info.value.status_code == 503 and ".gguf" not in str(info.value)


def test_the_tool_loop_runs_on_the_priority_lane_while_serving(qtbot, tmp_path, isolated, monkeypatch):
    pytest.importorskip("mcp")
    from PySide6.QtCore import Qt

    from tramontane.app.widgets.tool_card import ToolCard
    from tramontane.engine.mcp_tools import McpServerConfig

    from support.app_window import GREEDY, close_window, make_window

    server = Path(__file__).resolve().parents[1] / "support" / "mcp_test_server.py"
    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    try:
        window.session.param_overrides = dict(GREEDY, max_tokens=200)
        window.tools.apply_servers([McpServerConfig("ours", command=f"{shlex.quote(sys.executable)} "
                                                                     f"{shlex.quote(str(server))}",
                                                    timeout_s=3, disabled_tools=("crash", "fail", "hang"))])
        qtbot.mouseClick(window.tools_button, Qt.MouseButton.LeftButton)
        window.api_server.apply(True, free_port())
        qtbot.waitUntil(lambda: window.worker.batch_executor() is not None, timeout=10000)
        scheduler = window.worker.batch_executor().scheduler
        lanes = []
        inner = scheduler.submit

        def submit(prompt, params, on_piece=None, cancel=None, priority=False, *more):
            lanes.append(priority)
            return inner(prompt, params, on_piece, cancel, priority, *more)

        scheduler.submit = submit
        tok = window.worker.engine.tokenizer
        scripts = [[tok.token_id("[TOOL_CALLS]")] + tok.encode(json.dumps([{"name": "add", "arguments": {"a": 2, "b": 40}}])),
                   tok.encode("The sum is 42.")]
        script = {"replies": 0, "now": None}

        def hook(generated, logits):  # the model's two replies, each then EOS
            if not generated:
                script["now"] = ScriptedLogits(scripts[min(script["replies"], 1)], tok.eos_id)
                script["replies"] += 1
            return script["now"](generated, logits)

        script_logits(monkeypatch, hook)
        qtbot.keyClicks(window.composer.edit, "What is 2 + 40?")
        qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
        cards = lambda: [c for c in window.view.widgets if isinstance(c, ToolCard)]  # noqa: E731
        qtbot.waitUntil(lambda: bool(cards()) and bool(cards()[0].buttons), timeout=60000)
        with qtbot.waitSignal(window.replyFinished, timeout=60000):
            qtbot.mouseClick(cards()[0].buttons["once"], Qt.MouseButton.LeftButton)
        assert cards()[0].result.text() == "42"
        assert window.view.widgets[-1].message.text == "The sum is 42."
        assert lanes == [True, True]  # both rounds were the window's, on its lane
    finally:
        close_window(window)
