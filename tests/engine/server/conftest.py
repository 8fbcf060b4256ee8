"""Fixtures shared by the server's tests."""
from __future__ import annotations

import pytest

from support.scripted import script_logits
from support.served import ScriptedReplies


@pytest.fixture
def script(served, monkeypatch):
    """script(*pieces): the model's next replies write exactly these pieces, then EOS (a control
    token's name, e.g. "[TOOL_CALLS]", stands for the token). `served` is the test module's."""

    def set_reply(*pieces: str) -> None:
        script_logits(monkeypatch, ScriptedReplies(served.engine.tokenizer, pieces))

    return set_reply
