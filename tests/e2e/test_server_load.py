"""A bounded loopback load on the window's server: 8 clients x 25 requests (streaming and not)
through the window's own engine worker, while the window chats. Every request is answered
correctly or refused with 503, none is lost or mixed with another's tokens, the window's chat
keeps its KV, growing conversations prefill only their new tokens, the server stays up."""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("pytestqt")
openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")

from PySide6.QtCore import QObject, Slot  # noqa: E402

from tramontane.app.serving import WindowServer  # noqa: E402
from tramontane.app.worker import ChatRequest, EngineWorker  # noqa: E402
from tramontane.engine.api import ChatMessage, SamplingParams  # noqa: E402
from tramontane.engine.mistral3.chat_format import EncodedPrompt, encode_chat  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.openai_api import RequestLimits  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
NAME = "mistral3_tiny-f32"
CLIENTS, REQUESTS, TOKENS = 8, 25, 6
PARAMS = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)


def as_openai(messages: list[ChatMessage]) -> list[dict]:
    return [{"role": m.role, "content": m.text_content} for m in messages]


class Receiver(QObject):
    """Lives on the UI thread, like the window: the worker's signals arrive here queued."""

    def __init__(self, worker: EngineWorker):
        super().__init__()
        self.loaded, self.finished = [], {}
        worker.loaded.connect(self.on_loaded)
        worker.finished.connect(self.on_finished)

    @Slot(object)
    def on_loaded(self, info):
        self.loaded.append(info)

    @Slot(int, object)
    def on_finished(self, request_id, result):
        self.finished[request_id] = result


@pytest.fixture
def window_server(qtbot):
    worker = EngineWorker()
    worker.start()
    worker.receiver = Receiver(worker)
    worker.load(MODEL, None, "cpu")
    qtbot.waitUntil(lambda: bool(worker.receiver.loaded), timeout=60000)
    serving = WindowServer(worker, RequestLimits(max_queue=6))  # short: some requests meet a full queue
    serving.apply(True, 0)
    assert serving.running, serving.status
    yield worker, serving
    serving.stop()
    worker.stop()


def test_eight_clients_and_the_window_share_the_engine(qtbot, window_server):
    worker, serving = window_server
    reference = LocalEngine(MODEL, None, device="cpu")
    # Per client: a first turn, and the second turn that resends it with the reply.
    turns, unsampled = {}, {}
    for c in range(CLIENTS):
        first = [ChatMessage.text("user", f"Client {c} asks about topic number {c * 7}.")]
        r1 = reference.chat(first, PARAMS, session_key=f"ref{c}")
        second = first + [ChatMessage.text("assistant", r1.text), ChatMessage.text("user", f"More on {c}, please.")]
        r2 = reference.chat(second, PARAMS, session_key=f"ref{c}")
        turns[c] = [(first, r1), (second, r2)]
        # If the server never answered its first turn (refused), the reply in the second is text
        # the engine may not have sampled (another client's identical reply it did sample counts):
        # then it is tokenized from the text, as mistral-common does.
        unsampled[c] = reference.generate_from(EncodedPrompt(encode_chat(reference.tokenizer, second, None).ids),
                                               PARAMS, session_key=f"text{c}")
    window_turns = [ChatMessage.text("user", "The window's own question.")]
    window_want = []
    for k in range(3):
        r = reference.chat(window_turns, PARAMS, session_key="window")
        window_want.append(r)
        window_turns = window_turns + [ChatMessage.text("assistant", r.text), ChatMessage.text("user", f"Turn {k + 2}?")]
    reference.close()

    outcomes: dict[int, list] = {c: [] for c in range(CLIENTS)}
    failures: list[str] = []

    def client(c: int) -> None:
        api = openai.OpenAI(base_url=serving.server.url, api_key="x", max_retries=0, timeout=120)
        answered_first = False
        for i in range(REQUESTS):
            messages, want = turns[c][i % 2]
            stream = (c + i) % 2 == 0
            try:
                if stream:
                    chunks = list(api.chat.completions.create(
                        model=NAME, messages=as_openai(messages), max_tokens=TOKENS, temperature=0, stream=True,
                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
                    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
                    usage = chunks[-1].usage
                else:
                    r = api.chat.completions.create(model=NAME, messages=as_openai(messages), max_tokens=TOKENS,
                                                    temperature=0, extra_body={"ignore_eos": True})
                    text, usage = r.choices[0].message.content, r.usage
            except openai.APIStatusError as exc:
                outcomes[c].append(("refused", exc.status_code))
                time.sleep(0.02)  # a polite client waits a little (Retry-After says 1 s)
                continue
            except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it below
                failures.append(f"client {c} request {i}: {type(exc).__name__}: {exc}")
                continue
            outcomes[c].append(("answered", i))
            if i % 2 == 1 and not answered_first:
                # its reply read as text, or as the ids another client's identical reply was sampled as
                want = next((w for w in (want, unsampled[c])
                             if w.text == text and len(w.prompt_token_ids) == usage.prompt_tokens), want)
            if text != want.text:
                failures.append(f"client {c} request {i}: got {text!r}, want {want.text!r}")
            if usage.prompt_tokens != len(want.prompt_token_ids) or usage.completion_tokens != TOKENS:
                failures.append(f"client {c} request {i}: usage {usage}")
            if i % 2 == 1 and answered_first:
                first_prompt = len(turns[c][0][1].prompt_token_ids)
                if usage.prompt_tokens_details.cached_tokens < first_prompt:
                    failures.append(f"client {c} request {i}: only {usage.prompt_tokens_details.cached_tokens} "
                                    f"cached tokens, its first turn had {first_prompt}")
            answered_first = answered_first or i % 2 == 0

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    # Meanwhile the window chats three turns in its own session, through the same worker.
    window_got = []
    messages = [ChatMessage.text("user", "The window's own question.")]
    for k in range(3):
        worker.chat(ChatRequest(1000 + k, list(messages), PARAMS, "42", threading.Event()))
        qtbot.waitUntil(lambda k=k: 1000 + k in worker.receiver.finished, timeout=120000)
        result = worker.receiver.finished[1000 + k]
        window_got.append(result)
        messages = messages + [ChatMessage.text("assistant", result.text), ChatMessage.text("user", f"Turn {k + 2}?")]
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)

    assert not failures, "\n".join(failures[:10])
    assert all(len(outcomes[c]) == REQUESTS for c in range(CLIENTS))  # none lost
    refused = [o for c in outcomes for o in outcomes[c] if o[0] == "refused"]
    assert all(status == 503 for _, status in refused)
    answered = CLIENTS * REQUESTS - len(refused)
    print(f"{answered} answered, {len(refused)} refused with 503")
    assert all(any(o[0] == "answered" for o in outcomes[c]) for c in range(CLIENTS))
    qtbot.waitUntil(lambda: serving.served == answered, timeout=10000)  # counted on the UI thread
    assert serving.status.endswith(f"· {answered} replies") and NAME in serving.status
    # The window's chat: the same replies as alone, and its KV survived the server's requests.
    assert [r.text for r in window_got] == [r.text for r in window_want]
    for k in (1, 2):
        assert window_got[k].stats.reused_tokens >= len(window_got[k - 1].prompt_token_ids)
    # The server is still up.
    api = openai.OpenAI(base_url=serving.server.url, api_key="x", max_retries=0)
    assert api.models.list().data[0].id == NAME
