"""Sampled speculation keeps the target's distribution (issue 38): with temperature (0.8, 1.0) and
top-p, the first three tokens of many seeded replies, drafted by a draft model or by prompt
lookup, are compared by a chi-square test with the joint distribution computed directly from the
target model's own logits (Mistral3Text.logits without a cache, then temperature and nucleus
written out here in float64), not by the scheduler's sampling path. A deliberately biased rule
(a draft kept whenever the target allows it) fails the same test.

The target is the tiny fixture with its output head scaled by 6: the fixture's own logits are
nearly flat over its 2048 tokens (top probability ~1 %), which would need millions of samples
to tell a bias; scaled, a next token has a handful of likely values, greedy drafts are accepted
a third to two thirds of the time, and 3000 replies give ~50-100 cells of the joint (t0, t1, t2)
with an expected count of 5 or more (the rest pooled in one cell); 10-83 cells by case. The draft model is the
unscaled fixture: the same argmax at every position, a different file and distribution."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tramontane.engine.api import SamplingParams
from tramontane.engine.mistral3.chat_format import EncodedPrompt
from tramontane.engine.runtime import batch
from tramontane.engine.runtime.batch import BatchScheduler
from tramontane.engine.runtime.draft import DraftModel
from tramontane.engine.runtime.generate import process_logits
from tramontane.engine.runtime.local import LocalEngine

from support import FIXTURES
from support.batch_runs import draft_every_step, random_prompts

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
REPLIES = 3000
DEPTH = 3  # t0 (from the prompt's row), t1 and t2 (from verification rows once drafting starts)
MIN_EXPECTED = 5.0  # a cell's expected count for it to stand alone (the chi-square rule of thumb)
SIGNIFICANCE = 1e-3  # a correct sampler fails one run in a thousand; the seeds are fixed, so never flaky
HEAD_SCALE = 6.0
SLOTS = 64


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from gguf import GGUFReader

    from support.gguf_edit import rewrite_gguf

    head = next(t for t in GGUFReader(MODEL).tensors if t.name == "output.weight")
    peaked = rewrite_gguf(MODEL, tmp_path_factory.mktemp("spec") / "peaked.gguf",
                          replace_tensors={"output.weight": np.array(head.data, dtype=np.float32) * HEAD_SCALE})
    eng = LocalEngine(peaked, device="cpu", context_length=256)
    # a draft KV pool for the 64 sequences of a step (an engine's own holds one context's positions)
    eng.draft = DraftModel.load(MODEL, peaked, positions=SLOTS * 64)
    yield eng
    eng.draft.close()
    eng.close()


@pytest.fixture(autouse=True)
def _draft_every_step(monkeypatch):
    """The rule under test is verification's, not when drafting pays (64 sequences a step on
    this machine's measured costs would switch it off)."""
    draft_every_step(monkeypatch)


# ----------------------------------------------------------------------------- the reference

def target_probs(model, ids: list[int], temperature: float, top_p: float) -> np.ndarray:
    """The target's next-token distribution after `ids`: its logits from one uncached forward,
    softmax at `temperature`, then the nucleus (a token stays while the tokens more likely than
    it hold less than top_p), renormalised. float64."""
    logits = model.logits(ids).double().cpu().numpy() / temperature
    p = np.exp(logits - logits.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]  # mass of the tokens ahead of each
        assert np.all(np.abs(before - top_p) > 1e-6), "a token sits on the nucleus' edge: float32 may differ"
        keep = np.zeros_like(p, dtype=bool)
        keep[order[before < top_p]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return p


def joint_cells(model, prompt: list[int], temperature: float, top_p: float, n: int) -> dict[tuple, float]:
    """{(t0, .., t_{DEPTH-1}): probability} for every sequence of DEPTH tokens whose expected
    count in n replies is at least MIN_EXPECTED (prefixes below it are not expanded: their mass
    is the pooled cell's)."""
    cells: dict[tuple, float] = {}

    def walk(prefix: tuple, mass: float) -> None:
        p = target_probs(model, prompt + list(prefix), temperature, top_p)
        for t in np.flatnonzero(p * mass * n >= MIN_EXPECTED):
            m = mass * float(p[t])
            if len(prefix) + 1 == DEPTH:
                cells[prefix + (int(t),)] = m
            else:
                walk(prefix + (int(t),), m)

    walk((), 1.0)
    return cells


def chi_square(samples: list[tuple], cells: dict[tuple, float]) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of the samples' counts over `cells` plus the
    pooled rest, against n * probability."""
    n = len(samples)
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    observed = [counts.get(c, 0) for c in cells]
    expected = [n * p for p in cells.values()]
    rest = n * (1.0 - sum(cells.values()))
    if rest >= MIN_EXPECTED:
        observed.append(n - sum(observed))
        expected.append(rest)
    else:  # too little pooled mass for a cell: fold it into the last one
        observed[-1] += n - sum(observed)
        expected[-1] += rest
    o, e = np.array(observed, dtype=np.float64), np.array(expected, dtype=np.float64)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(o) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p_value


# ----------------------------------------------------------------------------- the runs

def lookup_prompt(engine, temperature: float, top_p: float) -> list[int]:
    """A prompt after which prompt lookup drafts for nearly every likely first token: it holds,
    for each such token t, the prompt's last two tokens, t and the target's greedy two tokens
    after t (so the 3-gram (a, b, t) occurred, followed by drafts the target often keeps)."""
    model = engine.model
    base = random_prompts(engine, [10], seed=38)[0].ids
    prompt = list(base)
    for _ in range(3):  # the segments change the first token's distribution: settle on them
        p = target_probs(model, prompt, temperature, top_p)
        likely = [int(t) for t in np.argsort(-p)[:8] if p[t] > 0.01]
        segments = []
        for t in likely:
            after = model.logits(prompt + [t]).argmax().item()
            after2 = model.logits(prompt + [t, after]).argmax().item()
            segments += [base[-2], base[-1], t, after, after2]
        prompt = base[:-2] + segments + base[-2:]
    return prompt


def sample_replies(engine, prompt: list[int], mode: str, temperature: float, top_p: float):
    """REPLIES seeded replies of DEPTH tokens, SLOTS sequences a step through the one scheduler:
    (their tokens, drafted, accepted)."""
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=SLOTS, priority_slots=0,
                           context_length=256, step_rows=512)
    sched.draft_model = engine.draft
    futures = [sched.submit(EncodedPrompt(list(prompt)),
                            SamplingParams(max_tokens=DEPTH, temperature=temperature, top_p=top_p, seed=seed,
                                           ignore_eos=True, speculation=mode, spec_tokens=2))
               for seed in range(REPLIES)]
    while sched.step():
        pass
    results = [f.result(timeout=0) for f in futures]
    sched.close()
    return ([tuple(r.token_ids) for r in results], sum(r.stats.drafted_tokens for r in results),
            sum(r.stats.accepted_tokens for r in results))


def prompt_for(engine, mode: str, temperature: float, top_p: float) -> list[int]:
    if mode == "ngram":
        return lookup_prompt(engine, temperature, top_p)
    return random_prompts(engine, [12], seed=1)[0].ids


CASES = [("draft", 0.8, 1.0), ("draft", 1.0, 0.9), ("ngram", 1.0, 1.0), ("ngram", 0.8, 0.9)]


@pytest.mark.parametrize("mode,temperature,top_p", CASES)
def test_sampled_speculation_has_the_targets_distribution(engine, mode, temperature, top_p):
    prompt = prompt_for(engine, mode, temperature, top_p)
    cells = joint_cells(engine.model, prompt, temperature, top_p, REPLIES)
    samples, drafted, accepted = sample_replies(engine, prompt, mode, temperature, top_p)
    stat, df, p_value = chi_square(samples, cells)
    print(f"{mode} T={temperature} top_p={top_p}: chi2 {stat:.1f}, df {df}, p {p_value:.3g}, "
          f"accepted {accepted} of {drafted} drafted")
    # the test reaches the verification rows: most replies drafted, a good share kept
    assert drafted >= REPLIES and accepted >= 0.2 * drafted
    assert df >= 8  # cells enough to see a bias in any of the first three tokens (9 for the most peaked case)
    assert p_value > SIGNIFICANCE, f"chi2 {stat:.1f} on {df} degrees of freedom (p {p_value:.3g})"


def _keep_allowed_drafts(monkeypatch):
    """A biased acceptance rule: a drafted token is kept whenever the target's processed row
    allows it (nonzero probability), instead of only when the target's draw is that token."""
    real_verify, real_draw = BatchScheduler._verify, batch.draw_token
    state: dict = {}

    def verify(self, s, logits, at, drafts):
        state.update(drafts=drafts, base=len(s.generated))
        try:
            real_verify(self, s, logits, at, drafts)
        finally:
            state.clear()

    def draw(logits, params, tokenizer, generated, generator, seen, logprobs):
        j = len(generated) - state["base"] if state else -1
        if 0 <= j < len(state.get("drafts", ())):
            d = state["drafts"][j]
            if bool(process_logits(logits, params)[d] > float("-inf")):
                forced = torch.full_like(logits, float("-inf"))
                forced[d] = 0.0
                logits = forced
        return real_draw(logits, params, tokenizer, generated, generator, seen, logprobs)

    monkeypatch.setattr(BatchScheduler, "_verify", verify)
    monkeypatch.setattr(batch, "draw_token", draw)


@pytest.mark.parametrize("mode,temperature,top_p", [CASES[1], CASES[3]])
def test_a_rule_that_keeps_drafts_too_often_fails_the_test(engine, monkeypatch, mode, temperature, top_p):
    prompt = prompt_for(engine, mode, temperature, top_p)
    cells = joint_cells(engine.model, prompt, temperature, top_p, REPLIES)
    _keep_allowed_drafts(monkeypatch)
    samples, drafted, accepted = sample_replies(engine, prompt, mode, temperature, top_p)
    stat, df, p_value = chi_square(samples, cells)
    print(f"biased {mode} T={temperature} top_p={top_p}: chi2 {stat:.1f}, df {df}, p {p_value:.3g}, "
          f"accepted {accepted} of {drafted} drafted")
    assert accepted >= 0.5 * drafted  # the bias did act (every first draft kept)
    assert p_value < SIGNIFICANCE
