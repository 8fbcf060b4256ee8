"""A reasoning model's reply through the one scheduler: the thought streams as ReasoningPiece and
lands in GenerationResult.reasoning, the answer alone is the text (and meets the stop strings);
a reply stopped while thinking keeps what was thought; a model that cannot think is untouched."""
from __future__ import annotations

import pytest

from tramontane.engine.api import ChatMessage, ReasoningPiece, SamplingParams

from support import FIXTURES
from support.engines import local_engine_fixture
from support.scripted import ScriptedLogits, script_logits
from support.thinking import thinking_tokenizer

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
engine = local_engine_fixture(MODEL, context_length=512)
HI = [ChatMessage.text("user", "hi")]


@pytest.fixture
def thinking(engine):
    original = engine.tokenizer
    engine.tokenizer = thinking_tokenizer(MODEL)
    yield engine
    engine.tokenizer = original


def _reply(engine, monkeypatch, ids, **params):
    script_logits(monkeypatch, ScriptedLogits(ids, engine.tokenizer.eos_id))
    pieces: list[str] = []
    result = engine.chat(HI, SamplingParams(temperature=0.0, max_tokens=params.pop("max_tokens", 60), **params),
                         on_piece=pieces.append)
    return result, pieces


def test_the_thought_streams_apart_and_the_answer_is_the_text(thinking, monkeypatch):
    tok = thinking.tokenizer
    think, end = tok.think_ids
    result, pieces = _reply(thinking, monkeypatch, [think, *tok.encode("Two and two."), end, *tok.encode("Four.")])
    assert result.reasoning == "Two and two." and result.text == "Four."
    assert "".join(p for p in pieces if isinstance(p, ReasoningPiece)) == "Two and two."
    assert "".join(p for p in pieces if not isinstance(p, ReasoningPiece)) == "Four."
    assert result.finish_reason == "stop"


def test_stop_strings_meet_the_answer_only(thinking, monkeypatch):
    tok = thinking.tokenizer
    think, end = tok.think_ids
    ids = [think, *tok.encode("maybe STOP here"), end, *tok.encode("yes STOP no")]
    result, _ = _reply(thinking, monkeypatch, ids, stop=["STOP"])
    assert result.reasoning == "maybe STOP here" and result.text == "yes " and result.finish_reason == "stop_string"


def test_a_reply_cut_while_thinking_keeps_the_thought(thinking, monkeypatch):
    tok = thinking.tokenizer
    think, _ = tok.think_ids
    words = tok.encode("a long thought that never ends " * 4)
    result, _ = _reply(thinking, monkeypatch, [think, *words], max_tokens=6)
    assert result.finish_reason == "length" and result.text == ""
    assert result.reasoning and tok.decode(words).startswith(result.reasoning)


def test_a_model_that_cannot_think_keeps_its_text_whole(engine, monkeypatch):
    assert not engine.tokenizer.can_think
    ids = [34, *engine.tokenizer.encode("plain"), 35]  # its slots 34/35 are unnamed control tokens
    result, pieces = _reply(engine, monkeypatch, ids)
    assert result.reasoning == "" and not any(isinstance(p, ReasoningPiece) for p in pieces)
    assert result.text == engine.tokenizer.decode(ids)
