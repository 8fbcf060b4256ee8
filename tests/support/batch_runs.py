"""Helpers of the batch scheduler's tests: greedy settings, a request run alone (the reference),
random prompts, a spy on what each batch step held, and speculation that drafts every step."""
from __future__ import annotations

import torch

from tramontane.engine.api import SamplingParams
from tramontane.engine.mistral3.chat_format import EncodedPrompt
from tramontane.engine.runtime import batch
from tramontane.engine.runtime.speculative import AdaptiveDraftLength


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def alone(engine, prompt: EncodedPrompt, params: SamplingParams):
    """The request by itself, from an empty slot (the prefix cache's blocks are the same KV)."""
    engine.forget_session("alone")
    return engine.generate_from(prompt, params)


def random_prompts(engine, lengths, seed=0) -> list[EncodedPrompt]:
    g = torch.Generator().manual_seed(seed)
    bos = engine.tokenizer.bos_id
    return [EncodedPrompt([bos] + torch.randint(1000, engine.tokenizer.vocab_size, (n - 1,), generator=g).tolist())
            for n in lengths]


class Recorder:
    """Wraps forward_batch to see what each step held: (rows per group)."""

    def __init__(self, model):
        self.steps: list[list[int]] = []
        self._inner = model.forward_batch

        def spy(embeds, groups, logits_of):
            self.steps.append([n for _, _, n in groups])
            return self._inner(embeds, groups, logits_of)

        model.forward_batch = spy
        self.model = model

    def close(self):
        del self.model.forward_batch


class PrefillSpy:
    """Records a turn's passes through the scheduler's forward (model.forward_batch): the first
    one's start position, rows and the logits of its last row (the prompt's, when it is read in
    one pass)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self._orig = engine.model.forward_batch

    def __enter__(self):
        def spy(embeds, groups, logits_of):
            out = self._orig(embeds, groups, logits_of)
            _, start, n = groups[-1]
            self.calls.append((start, n, out[-1].detach().clone() if len(out) else None))
            return out

        self.engine.model.forward_batch = spy
        return self

    def __exit__(self, *exc):
        del self.engine.model.forward_batch  # the method again

    @property
    def prefill(self):
        return self.calls[0]


class FixedDraftLength(AdaptiveDraftLength):
    """Every step drafts spec_tokens, whatever the measured costs: for tests whose subject is
    verification, not when drafting pays."""

    def length(self) -> int:
        return self.max_tokens

    def retune(self, cost, batch=1) -> None:
        pass


def draft_every_step(monkeypatch) -> None:
    monkeypatch.setattr(batch, "AdaptiveDraftLength", FixedDraftLength)
