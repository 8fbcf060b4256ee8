"""A tiny random model made to write a chosen reply through the whole stack: the tests' stand-in
for a model that says what a test needs (tool calls, a given text), with nothing of it in the
shipped code."""
from __future__ import annotations

from typing import Callable, Sequence

import torch


class ScriptedLogits:
    """A logits processor: the reply is `ids` then EOS, whatever the model says (every other
    logit -inf)."""

    def __init__(self, ids: Sequence[int], eos_id: int):
        self.ids = [int(t) for t in ids]
        self.eos_id = eos_id

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        step = len(generated)
        want = self.ids[step] if step < len(self.ids) else self.eos_id
        forced = torch.full_like(logits, float("-inf"))
        forced[want] = 0.0
        return forced


def script_logits(monkeypatch, processor: Callable[[list[int], torch.Tensor], torch.Tensor]) -> None:
    """Every token the one scheduler draws (window, CLI, server) sees `processor(generated, logits)`
    first, before the request's own processors (a grammar) and the sampling chain; logprobs stay
    those of the model's own logits."""
    import dataclasses

    from tramontane.engine.runtime import batch

    real = getattr(batch.draw_token, "unscripted", batch.draw_token)  # a second script replaces the first

    def draw(logits, params, tokenizer, generated, generator, seen, logprobs):
        scripted = dataclasses.replace(params, logits_processors=(processor, *params.logits_processors))
        return real(logits, scripted, tokenizer, generated, generator, seen, logprobs)

    draw.unscripted = real
    monkeypatch.setattr(batch, "draw_token", draw)
