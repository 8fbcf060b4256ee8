"""Sampling, and the rules of the one generation loop (runtime/batch.py's scheduler): a token's draw,
why a reply stops, its stats.

The sampling steps are small pure functions on one logits vector (vocab,), with the same
semantics as transformers' logits processors, applied in HF's order: repetition penalty,
then temperature, top-k, top-p, min-p, then a draw with a seeded `torch.Generator` on the
logits' device (greedy = argmax when temperature <= 0).
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np
import torch

from ...kernels import cpu_native
from ..api import EngineError, FinishReason, GenerationStats, SamplingParams, TokenLogprob

# ----------------------------------------------------------------------------- sampling

def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF RepetitionPenaltyLogitsProcessor: for every token already seen (prompt + output),
    negative logits are multiplied by `penalty`, positive ones divided by it.
    `seen` is a bool mask (vocab,) or a tensor of token ids."""
    if penalty == 1.0:
        return logits
    if penalty <= 0:
        raise EngineError(f"repetition penalty must be positive, got {penalty}")
    if seen.dtype != torch.bool:
        mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        mask[seen.to(device=logits.device, dtype=torch.long)] = True
        seen = mask
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise EngineError(f"temperature must be > 0 to sample (use 0 for greedy), got {temperature}")
    return logits if temperature == 1.0 else logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits (ties with the k-th are kept, as in HF); 0 = off."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose mass exceeds top_p
    (HF TopPLogitsWarper: drop tokens whose ascending cumulative mass is <= 1 - top_p;
    the most likely token always stays). top_p >= 1 = off."""
    if top_p >= 1.0:
        return logits
    ascending = _ascending(logits)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)  # HF's very numbers: same values, same order
    # the dropped ones are a prefix (the cumulative mass never decreases); the largest always stays
    n_drop = (cumulative <= (1 - top_p)).sum(dim=-1, keepdim=True).clamp(max=logits.shape[-1] - 1)
    # HF drops by sorted position, so of tokens tied with the smallest kept value it keeps those
    # its sort happened to put last; here the whole tie stays
    return logits.masked_fill(logits < ascending.gather(-1, n_drop), float("-inf"))


def _ascending(logits: torch.Tensor) -> torch.Tensor:
    """The values sorted ascending along the last axis, without the order (nothing needs it).
    On the CPU numpy's vectorised sort: 3 ms on the 131072-token vocabulary against torch.sort's
    11 ms with indices; the values are the same whichever sort made them."""
    if logits.is_cpu and logits.dtype == torch.float32 and not logits.requires_grad:
        return torch.from_numpy(np.sort(logits.contiguous().numpy(), axis=-1))
    return torch.sort(logits, descending=False).values


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p x the top token's (HF MinPLogitsWarper)."""
    if min_p <= 0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    drop = probs < min_p * probs.amax(dim=-1, keepdim=True)
    drop.scatter_(-1, probs.argmax(dim=-1, keepdim=True), False)  # the top token always stays
    return logits.masked_fill(drop, float("-inf"))


def process_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The whole chain before the draw (float32). Greedy only applies the penalty."""
    logits = logits.float()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    if params.greedy:
        return logits
    logits = apply_temperature(logits, params.temperature)
    logits = top_k_filter(logits, params.top_k)
    logits = top_p_filter(logits, params.top_p)
    return min_p_filter(logits, params.min_p)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           seen: torch.Tensor | None = None) -> int:
    """One token id from a logits vector (vocab,)."""
    logits = process_logits(logits, params, seen)
    if params.greedy:
        if logits.is_cpu and logits.dim() == 1 and cpu_native.AVAILABLE:
            token, bad = cpu_native.argmax(logits)  # one pass, not argmax + isnan + any (~0.2 ms)
            if bad:
                raise InvalidLogitsError(_INVALID_LOGITS)
            return token
        token = torch.argmax(logits)
    else:
        token = _draw(torch.softmax(logits, dim=-1), generator)
    token, bad = torch.stack((token, torch.isnan(logits).any().long())).tolist()
    if bad:  # one host sync for both answers
        raise InvalidLogitsError(_INVALID_LOGITS)
    if token == logits.shape[-1]:  # u * total rounded up to the total: the last token not filtered out
        token = int(torch.nonzero(logits > float("-inf"))[-1])
    return int(token)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index of a (vocab,) distribution: the inverse of its cumulative sum at one uniform
    number, as torch.multinomial does (on the CPU torch accumulates a float cumsum in double and rounds
    each partial sum, so a token's share is off by at most one float32 step, ~6e-8). One random
    number a draw, not one per token: the exponential race this replaced spent 2.5 ms of a 3.7 ms
    draw filling 131072 of them. No device-side assert on NaN on CUDA (torch.multinomial's): the
    caller's isnan check says what went wrong. A filtered token (probability 0) spans no
    interval, so it never comes out."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(1, dtype=cdf.dtype, generator=generator, device=cdf.device)
    return torch.searchsorted(cdf, u * cdf[-1], right=True)[0]


class InvalidLogitsError(EngineError):
    """The model produced NaN logits (callers add which model file)."""


_INVALID_LOGITS = ("the model produced invalid logits (NaN): the weights may be corrupt, or the "
                   "compute dtype overflowed")


def check_params(params: SamplingParams) -> None:
    """Clear errors for values the user typed (CLI / settings), before any work."""
    problems = []
    if params.max_tokens < 0:
        problems.append(f"max_tokens must be >= 0, got {params.max_tokens}")
    if params.top_k < 0:
        problems.append(f"top_k must be >= 0 (0 = off), got {params.top_k}")
    if not 0.0 < params.top_p <= 1.0:
        problems.append(f"top_p must be in (0, 1], got {params.top_p}")
    if not 0.0 <= params.min_p <= 1.0:
        problems.append(f"min_p must be in [0, 1], got {params.min_p}")
    if params.repetition_penalty <= 0:
        problems.append(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
    if params.temperature != params.temperature:  # NaN
        problems.append("temperature is NaN")
    elif params.temperature < 0 or params.temperature == float("inf"):
        problems.append(f"temperature must be a finite number >= 0 (0 = greedy), got {params.temperature}")
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_TOP_LOGPROBS:
        problems.append(f"top logprobs must be 0..{MAX_TOP_LOGPROBS}, got {params.logprobs}")
    if params.seed is not None and not -(1 << 63) <= params.seed < 1 << 64:  # what torch's generator takes
        problems.append(f"seed must fit in 64 bits, got {params.seed}")
    if params.speculation not in ("off", "ngram", "draft"):
        problems.append(f"speculation must be off, ngram or draft, got {params.speculation!r}")
    if not 1 <= params.spec_tokens <= 16:
        problems.append(f"spec_tokens must be 1..16, got {params.spec_tokens}")
    if problems:
        raise EngineError("bad sampling settings: " + "; ".join(problems))


# ----------------------------------------------------------------------------- stop strings

class StopStringFilter:
    """Holds back text that could be the start of a stop string, so that a stop string never
    reaches the user: `feed(piece)` returns what is safe to show and whether a stop was hit
    (the text is then cut just before it)."""

    def __init__(self, stops: Sequence[str] | str):
        if isinstance(stops, str):  # one stop string, not a sequence of one-character stops
            stops = [stops]
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.shown = 0
        self.stopped = False

    def feed(self, piece: str, final: bool = False) -> str:
        self.text += piece
        if self.stopped:
            return ""
        search_from = max(0, self.shown - self.longest)
        hits = [i for i in (self.text.find(s, search_from) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True
            return self._show(len(self.text))
        if final:
            return self._show(len(self.text))
        return self._show(len(self.text) - self._held())

    def _held(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        held = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), held, -1):
                if self.text.endswith(s[:k]):
                    held = k
                    break
        return held

    def _show(self, end: int) -> str:
        end = max(end, self.shown)
        out = self.text[self.shown:end]
        self.shown = end
        return out


# ----------------------------------------------------------------------------- per-token extras

MAX_TOP_LOGPROBS = 20

def apply_processors(params: SamplingParams, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
    for processor in params.logits_processors:
        logits = processor(generated, logits)
    return logits


def token_logprob(logits: torch.Tensor, token: int, top: int, tokenizer=None) -> TokenLogprob:
    """The token's log-probability under the model's own distribution (raw logits, before the
    sampling settings and any grammar), and the `top` most likely tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1)

    def entry(token_id: int, value: float, alternatives=()) -> TokenLogprob:
        if tokenizer is None or not hasattr(tokenizer, "piece"):
            return TokenLogprob(token_id, value, alternatives)
        return TokenLogprob(token_id, value, alternatives, tokenizer.piece(token_id),
                            tokenizer.token_bytes(token_id))

    alternatives = ()
    if top > 0:
        values, ids = torch.topk(logp, min(top, logp.shape[-1]))
        alternatives = tuple(entry(i, v) for i, v in zip(ids.tolist(), values.tolist()))
    return entry(token, float(logp[token]), alternatives)


def seen_mask(history: Sequence[int], vocab: int, device: torch.device | str) -> torch.Tensor:
    """The repetition penalty's bool mask (vocab,): the tokens that occur in `history`."""
    seen = torch.zeros(vocab, dtype=torch.bool, device=device)
    if history:
        seen[torch.tensor(list(history), dtype=torch.long, device=device).clamp_(0, vocab - 1)] = True
    return seen


def draw_token(logits: torch.Tensor, params: SamplingParams, tokenizer, generated: list[int],
               generator: torch.Generator | None, seen: torch.Tensor | None,
               logprobs: list[TokenLogprob] | None) -> int | None:
    """One decode step's token after `logits` (the logits processors, then the draw), shared by
    generate() and the batch scheduler. None at EOS (unless params.ignore_eos): the reply ends
    there. Otherwise the token is appended to `generated`, marked in `seen`, and its logprob
    (of the raw logits) appended to `logprobs`, where those are kept."""
    raw = logits
    if params.logits_processors:
        logits = apply_processors(params, generated, logits)
    token = sample(logits, params, generator, seen)
    if token == getattr(tokenizer, "eos_id", None) and not params.ignore_eos:
        return None
    if logprobs is not None:
        logprobs.append(token_logprob(raw, token, params.logprobs, tokenizer))
    generated.append(token)
    if seen is not None:
        seen[token] = True
    return token


# ----------------------------------------------------------------------------- one rule for every loop

def stop_reason(token: int | None, stop: StopStringFilter, n_generated: int, params: SamplingParams,
                cancel: threading.Event | None, cache) -> FinishReason | None:
    """Why a reply ends after the token just drawn (its piece already fed to `stop`), or None
    while it goes on: EOS, a stop string, max_tokens, a cancel, a full context. The one rule of
    generate() and of the batch scheduler."""
    if token is None:
        return "stop"
    if stop.stopped:
        return "stop_string"
    if n_generated >= params.max_tokens:
        return "length"
    if cancel is not None and cancel.is_set():
        return "cancelled"
    if cache.length >= cache.capacity:  # context full
        return "length"
    return None


def reply_stats(n_prompt: int, reused: int, n_generated: int, cache, reason: FinishReason, t0: float,
                t_first: float | None, t_last: float | None, n_sampled: int) -> GenerationStats:
    """A reply's stats: its prompt (`reused` of its tokens from the cache), time to the first
    token from t0, prefill and decode rates (every caller computes them here)."""
    stats = GenerationStats(prompt_tokens=n_prompt, reused_tokens=reused, prefilled_tokens=n_prompt - reused,
                            generated_tokens=n_generated, context_used=cache.length,
                            context_size=cache.capacity, finish_reason=reason)
    if t_first is not None:
        stats.ttft_s = t_first - t0
        stats.prefill_tok_s = (n_prompt - reused) / max(stats.ttft_s, 1e-9)
        if n_sampled > 1:
            stats.decode_tok_s = (n_sampled - 1) / max(t_last - t_first, 1e-9)
    return stats


__all__ = ["InvalidLogitsError", "apply_repetition_penalty", "apply_temperature", "top_k_filter", "top_p_filter", "min_p_filter",
           "process_logits", "sample", "make_generator", "check_params", "StopStringFilter",
           "apply_processors", "token_logprob",
           "seen_mask", "draw_token", "MAX_TOP_LOGPROBS", "stop_reason", "reply_stats"]
