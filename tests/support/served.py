"""This project's own OpenAI server on a loopback port, on the tiny model made to think (its
vocabulary's [THINK]/[/THINK], [ARGS], [CALL_ID]; the vision projector loaded), and the replies
a test scripts for it round by round: what a RemoteEngine bound to `serve` talks to."""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from support import FIXTURES
from support.scripted import ScriptedLogits
from support.thinking import thinking_tokenizer

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
CONTROL = ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]", "<SPECIAL_20>")


@contextlib.contextmanager
def thinking_server(context_length: int = 2048) -> Iterator:
    """The started OpenAIServer on the tiny model made to think, its projector loaded."""
    with local_server(MODEL, MMPROJ, context_length, thinking_tokenizer(MODEL)) as server:
        yield server


@contextlib.contextmanager
def local_server(model, mmproj=None, context_length: int = 2048, tokenizer=None) -> Iterator:
    """This project's OpenAI server on `model`, in process, on a loopback port (`.url` ends in
    /v1; `.engine` is its LocalEngine, whose tokenizer `tokenizer` replaces when given)."""
    from tramontane.engine.runtime.local import LocalEngine
    from tramontane.engine.server.executor import ThreadExecutor
    from tramontane.engine.server.http import OpenAIServer

    engine = LocalEngine(model, mmproj, device="cpu", context_length=context_length)
    if tokenizer is not None:
        engine.tokenizer = tokenizer
    executor = ThreadExecutor(engine)
    server = OpenAIServer(executor, port=0, ollama_port=None).start()
    server.engine = engine
    try:
        yield server
    finally:
        server.stop()
        executor.shutdown()
        engine.close()


class ScriptedReplies:
    """A logits processor for `script_logits`: the model's next replies in order (the last one
    repeats), each a sequence of pieces written exactly, then EOS; a control token's name stands
    for the token itself."""

    def __init__(self, tok, *replies: Sequence[str]):
        self.tok = tok
        self.scripts = [self._ids(r) for r in replies]
        self.count = 0
        self.current = None

    def _ids(self, pieces: Sequence[str]) -> list[int]:
        ids: list[int] = []
        for piece in pieces:
            ids += [self.tok.token_id(piece)] if piece in CONTROL else self.tok.encode(piece)
        return ids

    def __call__(self, generated, logits):
        if not generated:  # a new reply
            self.current = ScriptedLogits(self.scripts[min(self.count, len(self.scripts) - 1)], self.tok.eos_id)
            self.count += 1
        return self.current(generated, logits)
