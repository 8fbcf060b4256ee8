"""A reasoning model's constrained answer (issue 36 item 4): the grammar leaves the thought free
and applies from the token after [/THINK], fed only the answer's tokens."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("llguidance")

from tramontane.engine.runtime.grammar import AfterThought, GrammarConstraint, json_schema_grammar  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.thinking import thinking_tokenizer  # noqa: E402

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_the_thought_is_free_and_the_answer_is_the_grammars():
    tok = thinking_tokenizer(FIXTURES / "mistral3_tiny-f32.gguf")
    think, end = tok.think_ids
    grammar = json_schema_grammar(SCHEMA)
    wrapped = AfterThought(GrammarConstraint(tok, grammar), (think, end))
    plain = GrammarConstraint(tok, grammar)
    logits = torch.zeros(tok.vocab_size)
    first = wrapped([], logits)
    assert first[think] == 0 and torch.equal(torch.isinf(first).logical_not(),
                                              plain.allowed([]).clone().index_fill_(0, torch.tensor([think]), True))
    words = tok.encode("not json at all")
    assert torch.equal(wrapped([think, *words], logits), logits)  # still thinking: untouched
    answer = tok.encode('{"a"')
    after = wrapped([think, *words, end, *answer], logits)
    want = GrammarConstraint(tok, grammar).allowed(answer)
    assert torch.equal(torch.isfinite(after), want)
    assert torch.isinf(plain([], logits)[think])  # the grammar alone would refuse the thought
