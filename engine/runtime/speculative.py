"""Speculative decoding, the parts beside the step loop: drafts from the sequence's own tokens
(prompt lookup), the draft length that follows measured acceptance, the speculative-sampling
rule over a sequence's k+1 target rows, and whether a draft model's vocabulary fits a target's.

A step of a speculating sequence: the drafter proposes up to `AdaptiveDraftLength.length()`
tokens, the target reads them as extra rows after the sequence's last token (k+1 rows, one pass
over the weights), `processed_rows` turns those logits into what the plain loop would have
sampled from at each row, and `verify_greedy` / `verify_sampled` keep a prefix of the drafts
plus one token of the target's own. Greedy output is then token for token the plain output;
sampled output has the plain output's distribution (Leviathan et al. 2023, Chen et al. 2023).
"""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import torch

from ..api import EngineError, SamplingParams
from ..gguf import Metadata, open_gguf
from ..mistral3.tokenizer import TokenizerError, _read_vocabulary, _vocabulary
from .generate import _draw, apply_processors, process_logits, sample

# ----------------------------------------------------------------------------- prompt lookup

# Suffix lengths tried, longest first: a longer match is more often a real repeat, a shorter one
# finds a repeat sooner after it starts. Measured on held-out standard-library sources in the
# tiny tekken vocabulary (bench/train_pair.py's text, each size alone, one-token drafts): the
# draft is the text's real next token 73 % of the time for n = 4, 68 % for 3, 58 % for 2, but
# only 34 % for 1, which drafts at 76 % of positions (a lone ",", "(" or space): 1 is left out,
# those drafts would mostly be verified for nothing.
NGRAM_SIZES = (4, 3, 2)


class PromptLookup:
    """Drafts for one sequence from its own tokens (prompt, then accepted output): the tokens
    that followed the latest earlier occurrence of its last n tokens, for the longest n in
    `sizes` that occurred before.

    The index maps each n-gram to the position after its latest occurrence and is updated as
    tokens are appended (`extend`: O(len(sizes)) a token), so a draft costs O(k + len(sizes))
    whatever the sequence's length. Only accepted tokens go in: a rejected draft never does."""

    def __init__(self, ids: Sequence[int] = (), sizes: Sequence[int] = NGRAM_SIZES):
        if not sizes or min(sizes) < 1:
            raise ValueError(f"n-gram sizes must be positive, got {tuple(sizes)}")
        self.sizes = tuple(sorted(set(int(n) for n in sizes), reverse=True))
        self.ids: list[int] = []
        self._follower: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.extend(ids)

    def extend(self, ids: Sequence[int]) -> None:
        """Append tokens to the sequence (and to the index)."""
        seq, follower = self.ids, self._follower
        for token in ids:
            end = len(seq)  # the new token's position: each n-gram ending just before it is followed by it
            seq.append(int(token))
            for n in self.sizes:
                if end >= n:
                    follower[n][tuple(seq[end - n:end])] = end

    def draft(self, k: int) -> list[int]:
        """Up to k tokens to verify after the sequence; [] when no suffix occurred before."""
        seq, length = self.ids, len(self.ids)
        if k <= 0:
            return []
        for n in self.sizes:
            if length < n:
                continue
            start = self._follower[n].get(tuple(seq[length - n:]))
            if start is not None:
                # start < length; past the end the continuation repeats itself with period
                # length - start (a run "ab ab ab" drafts "ab ab" on)
                out: list[int] = []
                for m in range(k):
                    pos = start + m
                    out.append(seq[pos] if pos < length else out[pos - length])
                return out
        return []


# ----------------------------------------------------------------------------- draft length

@dataclass(frozen=True)
class SpeculationCost:
    """What a step that verifies k drafted tokens costs, in units of a plain one-row step:
    `verify[k]` for the target's k+1 rows (verify[0] = 1; measured, e.g. bench/spec.py (a) or
    the scheduler's own step times), plus `draft_token` per drafted token (a draft model's
    decode step relative to the target's; 0 for prompt lookup). Past the table the last
    measured step per row is extrapolated."""

    verify: tuple[float, ...]
    draft_token: float = 0.0

    def __post_init__(self):
        if len(self.verify) < 2 or abs(self.verify[0] - 1.0) > 1e-9:
            raise ValueError(f"verify costs start with 1.0 for one row and hold at least k = 1, got {self.verify}")
        if any(b < a for a, b in zip(self.verify, self.verify[1:])) or self.draft_token < 0:
            raise ValueError(f"step costs cannot fall with more rows, got {self.verify}, draft {self.draft_token}")

    @classmethod
    def from_timings(cls, seconds_by_rows: dict[int, float], max_tokens: int,
                     draft_token: float = 0.0) -> "SpeculationCost":
        """Relative costs from measured step times {rows: seconds} (rows 1 required), linearly
        interpolated between measured row counts (and extrapolated from the last two)."""
        if 1 not in seconds_by_rows or seconds_by_rows[1] <= 0:
            raise ValueError("the one-row step time is needed")
        rows = sorted(seconds_by_rows)
        times = [max(seconds_by_rows[r], seconds_by_rows[1]) for r in rows]
        if len(rows) == 1:
            raise ValueError("at least one multi-row step time is needed")
        wanted = np.arange(1, max_tokens + 2)
        inside = np.interp(wanted, rows, times)
        slope = (times[-1] - times[-2]) / (rows[-1] - rows[-2])
        beyond = times[-1] + slope * (wanted - rows[-1])
        t = np.where(wanted > rows[-1], beyond, inside)
        t = np.maximum.accumulate(t / t[0])
        return cls(tuple(float(x) for x in t), draft_token)

    def beside(self, base: int) -> "SpeculationCost":
        """The same machine's costs for k drafts added to a step of `base` decoding rows, in units
        of that step: verify[base - 1 + k] / verify[base - 1] (this table's rows are counted from one)."""
        if base <= 1:
            return self
        first = self._verify(base - 1)
        return SpeculationCost(tuple(self._verify(base - 1 + k) / first for k in range(len(self.verify))),
                               self.draft_token)

    def _verify(self, k: int) -> float:
        if k < len(self.verify):
            return self.verify[k]
        per_row = self.verify[-1] - self.verify[-2]
        return self.verify[-1] + per_row * (k - len(self.verify) + 1)

    def step(self, k: int) -> float:
        return self._verify(k) + k * self.draft_token


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a step yields on average when each drafted token is accepted with probability
    `acceptance` given those before it: 1 + a + a^2 + ... + a^k."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


class StepTimes:
    """This machine's decode steps, measured: seconds of a step with only decode rows (its pass
    and its draws) by the step's row count, the fastest of the last `window` of each (a busy
    machine only ever adds time to a step, so the fastest is its own cost; a median of
    millisecond steps swings with whatever else runs). What verifying k drafts beside `base` decoding rows
    costs is then t(base + k) / t(base), not a guess: on a CPU whose multi-row matmuls are
    compute-bound a drafted row costs almost a step, on a GPU almost nothing. Steps that read a
    prompt are not decode steps and are left out; a row count is used once `least` are known."""

    def __init__(self, window: int = 9, least: int = 3):
        self.window, self.least = window, least
        self._seen: dict[int, deque] = {}
        # the tables worked out from the current fastest times, by (base, prior): a step asks for
        # them every time, and they change only when one of those times does
        self._costs: dict[tuple[int, SpeculationCost], SpeculationCost] = {}
        self._costs_from: dict[int, float] = {}

    def record(self, rows: int, seconds: float) -> None:
        if rows >= 1 and seconds > 0:
            self._seen.setdefault(rows, deque(maxlen=self.window)).append(seconds)

    def seconds(self) -> dict[int, float]:
        """{rows: seconds} of the row counts measured often enough."""
        return {rows: min(times) for rows, times in self._seen.items() if len(times) >= self.least}

    def cost(self, base: int, prior: SpeculationCost) -> SpeculationCost:
        """The verify costs beside `base` decoding rows, from the steps measured at `base` rows and
        above (interpolated between them, extrapolated past the last); `prior`'s (a table from one
        row, so taken beside `base`) until `base` and one wider step have both been measured. The
        draft token's cost is prior's."""
        seconds = self.seconds()
        if seconds != self._costs_from:
            self._costs, self._costs_from = {}, seconds
        key = (base, prior)
        if key not in self._costs:
            measured = {rows - base + 1: t for rows, t in seconds.items() if rows >= base}
            self._costs[key] = prior.beside(base) if 1 not in measured or len(measured) < 2 else \
                SpeculationCost.from_timings(measured, len(prior.verify) - 1, prior.draft_token)
        return self._costs[key]


class AdaptiveDraftLength:
    """The draft length of one sequence, step by step: the k that maximises tokens per unit of
    cost (`expected_tokens(a, k) / cost.step(k)`) at the measured acceptance a, or 0 (a plain
    step) once none is predicted to pay at all; off, it starts again when some k is predicted
    to gain `min_gain` (a margin, so noise in the estimate does not toggle it).

    Acceptance is estimated per drafted token (accepted ones over accepted ones plus the first
    rejection), with counts that decay by `memory` at each verification: ~10 verifications'
    worth, enough that a draft accepted half the time is not switched off by a bad run, few
    enough that a repeat starting or ending shows within a few steps. While off, a probe of `probe_tokens` drafts every
    `probe_every` plain steps (doubling after each probe that does not pay, up to 8x) keeps the
    extra cost under `budget` / 2, for the whole batch: a probe makes the step of all `batch`
    sequences dearer, and each of them probes, so each probes `batch` times less often; the rest
    of the budget is the few steps the estimate takes to fall when the sequence stops paying."""

    def __init__(self, cost: SpeculationCost, max_tokens: int = 8, *, budget: float = 0.03,
                 min_gain: float = 0.03, memory: float = 0.9, prior: tuple[float, float] = (1.0, 2.0)):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.cost = self.prior = cost  # prior: the costs assumed until measured (retune)
        self.batch = 1  # sequences decoding in the step (retune)
        self.max_tokens = max_tokens
        self.min_gain = min_gain
        self.memory = memory
        self.accepted, self.trials = prior  # decayed counts of accepted drafts and of drafts tried
        self.probe_tokens = min(2, max_tokens)
        self.budget = budget
        self.probe_every = self._probe_every(cost)
        self._backoff = 1
        self._until_probe = 0
        self._verified = False  # no verification recorded yet
        self._k = self._best_length(1.0 + min_gain)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.trials if self.trials > 0 else 0.0

    def _best_length(self, least_gain: float) -> int:
        # tokens a unit of cost for the whole step: the other batch - 1 rows' tokens wait for
        # this sequence's drafts too (batch 1: this sequence's tokens / the step's cost)
        a, b = self.acceptance, self.batch
        gains = [(b - 1 + expected_tokens(a, k)) / (b * self.cost.step(k)) for k in range(1, self.max_tokens + 1)]
        best = int(np.argmax(gains))
        return best + 1 if gains[best] >= least_gain else 0

    @property
    def counts(self) -> tuple[float, float]:
        """The decayed (accepted, tried) counts: what a next sequence may start from."""
        return self.accepted, self.trials

    def start_from(self, accepted: float, tried: float) -> None:
        """Begin with another sequence's counts in place of the prior."""
        if not 0 <= accepted <= tried:
            raise ValueError(f"accepted {accepted} of {tried} tried")
        self.accepted, self.trials = accepted, tried
        self._k = self._best_length(1.0 + self.min_gain)

    def _probe_every(self, cost: SpeculationCost) -> int:
        return max(1, math.ceil(self.batch * (cost.step(self.probe_tokens) - 1.0) / (self.budget / 2)))

    def retune(self, cost: SpeculationCost, batch: int = 1) -> None:
        """Before a step: the costs as measured now (StepTimes) and how many sequences decode in
        it; a length that no longer pays is switched off, as a verification that does not pay."""
        self.cost, self.batch = cost, max(1, batch)
        self.probe_every = self._probe_every(cost)
        if self._k:
            self._k = self._best_length(1.0)
            if not self._k and self._verified:  # one that never tried yet still probes at once
                self._until_probe = self.probe_every * self._backoff

    def length(self) -> int:
        """How many tokens to draft this step (0: a plain step)."""
        if self._k:
            return self._k
        return self.probe_tokens if self._until_probe <= 0 else 0

    def record(self, drafted: int, accepted: int) -> None:
        """After each step of the sequence: how many tokens were drafted and verified (possibly
        fewer than length() said; 0 for a plain step) and how many of them were accepted."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafted tokens")
        if drafted == 0:
            self._until_probe -= 1  # a plain step; a probe with nothing to draft stays due
            return
        was_on = bool(self._k)
        self._verified = True
        tried = accepted + (1 if accepted < drafted else 0)
        self.accepted = self.accepted * self.memory + accepted
        self.trials = self.trials * self.memory + tried
        self._k = self._best_length(1.0 if was_on else 1.0 + self.min_gain)
        if self._k:
            self._backoff = 1
        elif not was_on:  # a probe that did not pay: wait longer for the next one
            self._backoff = min(self._backoff * 2, 8)
        if not self._k:
            self._until_probe = self.probe_every * self._backoff


# ----------------------------------------------------------------------------- verification

class Verdict(NamedTuple):
    """What a verification keeps: the first `accepted` drafted tokens, then `token` (the target's
    correction of the first rejected draft, or its next token after all of them)."""

    accepted: int
    token: int


_GREEDY = SamplingParams(temperature=0.0)


def processed_rows(logits: torch.Tensor, params: SamplingParams, generated: Sequence[int],
                   drafts: Sequence[int], seen: torch.Tensor | None = None) -> torch.Tensor:
    """The target's rows (n <= len(drafts)+1, vocab) made into what the plain loop samples from:
    row i as after `generated + drafts[:i]` (the request's logits processors, a grammar
    included, then process_logits with the drafted tokens counted as seen by the repetition
    penalty). Sampling: probabilities; greedy: the processed logits. Rows stop after the first
    one that forbids its drafted token (that draft is rejected whatever the draw; a grammar is
    never fed a token it refused). `seen` is not changed. The caller rolls back a grammar to
    the accepted tokens afterwards."""
    if logits.dim() != 2 or logits.shape[0] < 1:
        raise ValueError(f"target rows must be (rows, vocab), got {tuple(logits.shape)}")
    history = list(generated)
    seen_here = seen.clone() if seen is not None else None
    out = []
    for i in range(min(logits.shape[0], len(drafts) + 1)):
        row = process_logits(apply_processors(params, history, logits[i]), params, seen_here)
        out.append(row if params.greedy else torch.softmax(row, dim=-1))
        if i == len(drafts) or not bool(row[drafts[i]] > float("-inf")):
            break
        history.append(int(drafts[i]))
        if seen_here is not None:
            seen_here[int(drafts[i])] = True
    return torch.stack(out)


def verify_greedy(rows: torch.Tensor, drafts: Sequence[int]) -> Verdict:
    """Greedy acceptance: drafts are kept while each equals its row's argmax, by the plain loop's
    own argmax (generate.sample: first maximum, NaN refused), so the tokens are the plain
    output's. `rows`: processed logits (processed_rows); only rows up to the first mismatch are read."""
    for i, drafted in enumerate(drafts):
        if i >= rows.shape[0]:
            raise ValueError(f"{rows.shape[0]} target rows cannot verify draft {i + 1} of {len(drafts)}")
        token = sample(rows[i], _GREEDY)
        if token != drafted:
            return Verdict(i, token)
    if rows.shape[0] <= len(drafts):
        raise ValueError(f"{rows.shape[0]} target rows for {len(drafts)} drafts: the last row is missing")
    return Verdict(len(drafts), sample(rows[len(drafts)], _GREEDY))


def verify_sampled(target_probs: torch.Tensor, drafts: Sequence[int], draft_probs: torch.Tensor | None,
                   generator: torch.Generator | None) -> Verdict:
    """The speculative-sampling rule. target_probs p: (n, vocab), row i the target's
    distribution after drafts[:i] (processed_rows; n = len(drafts)+1, or fewer when a row
    forbids its draft). draft_probs q: (len(drafts), vocab), the distributions the drafts were
    drawn from, or None for drafts that were certain (prompt lookup, a greedy draft model:
    one-hot q). Draft i is kept with probability min(1, p_i(x)/q_i(x)); the first one refused
    is replaced by a draw from norm(max(0, p_i - q_i)); after all of them, a draw from the
    last row. The kept tokens are distributed as the target's own draws."""
    k = len(drafts)
    if k == 0:
        return Verdict(0, draw(target_probs[0], generator))
    m = min(k, target_probs.shape[0])
    device = target_probs.device
    index = torch.arange(m, device=device)
    ids = torch.tensor([int(t) for t in drafts[:m]], dtype=torch.long, device=device)
    p_x = target_probs[index, ids]
    q_x = draft_probs[index, ids].to(p_x.dtype) if draft_probs is not None else torch.ones_like(p_x)
    u = torch.rand(m, generator=generator, device=device, dtype=p_x.dtype)
    refused = (u * q_x >= p_x).tolist()  # u < p/q, without dividing by a q of 0
    first = next((i for i, r in enumerate(refused) if r), None)
    if first is None:
        if m < k or target_probs.shape[0] <= k:
            raise ValueError(f"{target_probs.shape[0]} target rows for {k} drafts: the last row is missing")
        return Verdict(k, draw(target_probs[k], generator))
    p = target_probs[first]
    if draft_probs is None:
        residual = p.clone()
        residual[ids[first]] = 0.0
    else:
        residual = (p - draft_probs[first].to(p.dtype)).clamp_(min=0.0)
    if not bool(residual.sum() > 0):  # p == q (to rounding): a refusal had probability ~0
        residual = p
    return Verdict(first, draw(residual, generator))


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One index of an unnormalised (vocab,) distribution, by the plain loop's draw."""
    token = int(_draw(probs, generator))
    if token >= probs.shape[-1]:  # u * total rounded up to the total: the last token with mass
        token = int(torch.nonzero(probs > 0)[-1])
    return token


# ----------------------------------------------------------------------------- draft model's vocabulary

class DraftModelError(EngineError):
    """A draft model that cannot draft for the loaded model (one sentence naming both files)."""


def draft_vocabulary_mismatch(target: str | os.PathLike, draft: str | os.PathLike) -> str | None:
    """Why `draft`'s tokens cannot stand for `target`'s, or None when they can: the two
    vocabularies must agree on every non-control token, its id and its bytes. Control tokens
    may differ in name (a v7 file's `<SPECIAL_34>` is a later file's `[THINK]`): the draft only
    proposes ids, and the target decides every one. Reads the two files' tokenizer data only."""
    a, b = _token_bytes(target), _token_bytes(draft)
    names = f"{os.fspath(draft)} cannot draft for {os.fspath(target)}"
    if len(a.tokens) != len(b.tokens):
        return f"{names}: their vocabularies hold {len(b.tokens)} and {len(a.tokens)} tokens"
    control_differs = a.is_control != b.is_control
    length_differs = np.diff(a.offsets) != np.diff(b.offsets)
    first = _first_byte_difference(a, b, int(np.argmax(length_differs)) if length_differs.any() else len(a.tokens))
    candidates = [i for i in (first, int(np.argmax(control_differs)) if control_differs.any() else None,
                              int(np.argmax(length_differs)) if length_differs.any() else None) if i is not None]
    if not candidates:
        return None
    i = min(candidates)
    return f"{names}: token {i} is {_describe(b, i)} in the draft and {_describe(a, i)} in the target"


@dataclass
class _TokenBytes:
    tokens: Sequence[str]
    is_control: np.ndarray
    offsets: np.ndarray
    blob: np.ndarray

    def bytes_of(self, i: int) -> bytes:
        return self.blob[self.offsets[i]:self.offsets[i + 1]].tobytes()


def _token_bytes(path: str | os.PathLike) -> _TokenBytes:
    """The file's tokens as the tokenizer reads them (tokenizer.py's own readers), without
    building the BPE model or touching a weight."""
    source = os.fspath(path)

    def fail(msg: str) -> TokenizerError:
        return TokenizerError(f"{source}: {msg}")

    with open_gguf(path) as gf:
        tokens, types, _merges = _vocabulary(Metadata(gf.kv, source, TokenizerError), fail)
        vocab = _read_vocabulary(tokens, types, fail)
    return _TokenBytes(tokens, vocab.is_control, vocab.offsets, np.frombuffer(bytes(vocab.blob), dtype=np.uint8))


def _first_byte_difference(a: _TokenBytes, b: _TokenBytes, before: int) -> int | None:
    """The first id < `before` whose bytes differ (ids before `before` have equal lengths, so
    their bytes sit at the same offsets in both blobs)."""
    end = int(a.offsets[before])
    differ = np.flatnonzero(a.blob[:end] != b.blob[:end])
    if differ.size == 0:
        return None
    return int(np.searchsorted(a.offsets, differ[0], side="right") - 1)


def _describe(v: _TokenBytes, i: int) -> str:
    if v.is_control[i]:
        return f"the control token {v.tokens[i]!r}"
    return f"the text {v.bytes_of(i)!r}"


def check_draft_vocabulary(target: str | os.PathLike, draft: str | os.PathLike) -> None:
    """Raise DraftModelError with the reason when `draft` cannot draft for `target`."""
    reason = draft_vocabulary_mismatch(target, draft)
    if reason is not None:
        raise DraftModelError(reason)


__all__ = ["NGRAM_SIZES", "PromptLookup", "SpeculationCost", "expected_tokens", "AdaptiveDraftLength",
           "Verdict", "processed_rows", "verify_greedy", "verify_sampled", "draw", "DraftModelError",
           "draft_vocabulary_mismatch", "check_draft_vocabulary"]
