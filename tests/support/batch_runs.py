"""Helpers of the batch scheduler's tests: greedy settings, a request run alone (the reference),
random prompts, and a spy on what each batch step held."""
from __future__ import annotations

import torch

from tramontane.engine.api import SamplingParams
from tramontane.engine.mistral3.chat_format import EncodedPrompt


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def alone(engine, prompt: EncodedPrompt, params: SamplingParams):
    """The request by itself, in a fresh KV session."""
    engine.forget_session("alone")
    engine._activate(None)
    return engine.generate_from(prompt, params, session_key=f"alone-{id(prompt)}")


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
