"""Speculative decoding's parts beside the loop (runtime/speculative.py): prompt lookup against a
brute-force search, the adaptive draft length in simulated runs (its cost on text that never
repeats, its gain where drafts are accepted), the acceptance rule (greedy exactly the plain argmax;
sampled output keeping the target's distribution, chi-square against the exact joint law, and the
same test catching a wrong rule), and the draft model's vocabulary check on GGUF files."""
from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

from tramontane.engine.api import SamplingParams
from tramontane.engine.gguf import GGUFError
from tramontane.engine.mistral3.tokenizer import TokenizerError
from tramontane.engine.runtime import generate
from tramontane.engine.runtime.generate import InvalidLogitsError, apply_processors, process_logits, seen_mask
from tramontane.engine.runtime.speculative import (
    AdaptiveDraftLength, DraftModelError, PromptLookup, SpeculationCost, StepTimes, Verdict, check_draft_vocabulary,
    draft_vocabulary_mismatch, expected_tokens, processed_rows, verify_greedy, verify_sampled)

from support import FIXTURES

# ----------------------------------------------------------------------------- prompt lookup


def brute_force_draft(seq: list[int], k: int, sizes) -> list[int]:
    """The latest earlier occurrence of the longest suffix, by scanning; continued periodically."""
    for n in sorted(sizes, reverse=True):
        if len(seq) < n:
            continue
        suffix = seq[len(seq) - n:]
        for start in range(len(seq) - n - 1, -1, -1):  # occurrence seq[start:start+n], followed by start+n
            if seq[start:start + n] == suffix:
                ext = list(seq)
                for m in range(k):
                    ext.append(ext[start + n + m])
                return ext[len(seq):]
    return []


@pytest.mark.parametrize("sizes", [(4, 3, 2), (3, 1), (2,)])
def test_prompt_lookup_is_the_latest_longest_match(sizes):
    rng = np.random.default_rng(0)
    for trial in range(60):
        vocab = int(rng.integers(2, 9))
        seq = rng.integers(0, vocab, size=int(rng.integers(0, 60))).tolist()
        lookup = PromptLookup(seq[:len(seq) // 2], sizes)  # built in two pieces: the index is incremental
        lookup.extend(seq[len(seq) // 2:])
        for k in (1, 3, 8):
            assert lookup.draft(k) == brute_force_draft(seq, k, sizes), (seq, k)


def test_prompt_lookup_prefers_longer_and_later_matches():
    # "5 1 2" is followed by 9 earlier; the latest "1 2" is followed by 7; the suffix is "5 1 2"
    lookup = PromptLookup([5, 1, 2, 9, 9, 1, 2, 7, 3, 5, 1, 2])
    assert lookup.draft(2) == [9, 9]
    assert PromptLookup([1, 2, 7, 1, 2, 8, 1, 2]).draft(1) == [8]  # the latest of equal length
    assert PromptLookup([1, 2, 3, 4]).draft(4) == []
    assert PromptLookup([6, 6, 6]).draft(3) == [6, 6, 6]  # a run continues itself
    assert PromptLookup([1, 2, 1, 2]).draft(0) == []


def test_prompt_lookup_step_cost_does_not_grow_with_the_sequence():
    rng = np.random.default_rng(1)
    short, long = PromptLookup(rng.integers(0, 50, 200).tolist()), PromptLookup(rng.integers(0, 50, 200_000).tolist())

    def per_step(lookup) -> float:
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for token in range(300):
                lookup.draft(8)
                lookup.extend([token % 50])
            best = min(best, time.perf_counter() - t)
        return best

    assert per_step(long) < 5 * per_step(short)  # a scan of 200k tokens would be ~1000x


# ----------------------------------------------------------------------------- draft length

CPU_LIKE = SpeculationCost(tuple(1.0 + 0.05 * k for k in range(9)))  # 5 % a row
GPU_LIKE = SpeculationCost(tuple(1.0 + 0.01 * k for k in range(9)))
COMPUTE_BOUND = SpeculationCost(tuple(1.0 + 0.6 * k for k in range(9)))
DRAFT_MODEL = SpeculationCost(tuple(1.0 + 0.03 * k for k in range(9)), draft_token=0.12)


def simulate(controller: AdaptiveDraftLength, accepts, steps: int) -> tuple[float, int]:
    """(cost in plain steps, tokens made) of `steps` steps; accepts(step, k) -> accepted count."""
    cost, tokens = 0.0, 0
    for step in range(steps):
        k = controller.length()
        accepted = accepts(step, k) if k else 0
        cost += controller.cost.step(k)
        tokens += accepted + 1
        controller.record(k, accepted)
    return cost, tokens


@pytest.mark.parametrize("cost", [CPU_LIKE, GPU_LIKE, COMPUTE_BOUND, DRAFT_MODEL], ids=["cpu", "gpu", "compute", "draft"])
@pytest.mark.parametrize("steps", [100, 2000])
def test_drafts_that_never_agree_cost_under_three_percent(cost, steps):
    spent, tokens = simulate(AdaptiveDraftLength(cost), lambda step, k: 0, steps)
    assert spent / tokens <= 1.03


@pytest.mark.parametrize("cost", [CPU_LIKE, GPU_LIKE, DRAFT_MODEL], ids=["cpu", "gpu", "draft"])
@pytest.mark.parametrize("acceptance", [0.5, 0.8, 0.95])
def test_drafts_that_agree_get_near_the_best_fixed_length(cost, acceptance):
    rng = np.random.default_rng(2)

    def bernoulli(step, k):
        hits = rng.random(k) < acceptance
        return int(np.argmin(hits)) if not hits.all() else k

    spent, tokens = simulate(AdaptiveDraftLength(cost), bernoulli, 4000)
    best = max(expected_tokens(acceptance, k) / cost.step(k) for k in range(1, 9))
    assert tokens / spent >= 0.9 * best


def test_a_repeat_turns_speculation_on_and_its_end_turns_it_off():
    controller = AdaptiveDraftLength(CPU_LIKE)
    copying = lambda step, k: k if 400 <= step < 600 else 0  # noqa: E731
    lengths = []
    for step in range(800):
        k = controller.length()
        lengths.append(k)
        controller.record(k, copying(step, k) if k else 0)
    on = [step for step in range(400, 600) if lengths[step] == 8]
    assert on and on[0] < 400 + 3 * controller.probe_every * 8  # at the latest a backed-off probe
    assert sum(lengths[600 + 20:]) < 200 * 2 * 0.25  # off again after a few steps, but for probes
    assert all(k == 8 for k in lengths[on[0] + 2:600])


def test_drafted_fewer_or_none_is_recorded():
    controller = AdaptiveDraftLength(CPU_LIKE)
    with pytest.raises(ValueError):
        controller.record(2, 3)
    for _ in range(30):
        controller.record(controller.length(), 0)
    assert controller.length() == 0
    while controller.length() == 0:
        controller.record(0, 0)
    probe = controller.length()
    controller.record(0, 0)  # the drafter had nothing: the probe stays due
    assert controller.length() == probe


def test_costs_from_step_timings():
    cost = SpeculationCost.from_timings({1: 0.02, 3: 0.024, 5: 0.026}, max_tokens=8, draft_token=0.1)
    assert cost.verify[0] == 1.0 and cost.verify[2] == pytest.approx(1.2) and cost.verify[4] == pytest.approx(1.3)
    assert cost.verify[1] == pytest.approx(1.1) and cost.verify[8] == pytest.approx(1.3 + 4 * 0.05)
    assert cost.step(3) == pytest.approx(1.25 + 0.3)
    assert cost.step(12) == pytest.approx(cost.verify[8] + 4 * 0.05 + 1.2)
    with pytest.raises(ValueError):
        SpeculationCost((1.0, 0.9))
    assert expected_tokens(0.5, 2) == pytest.approx(1.75) and expected_tokens(1.0, 4) == 5


# ----------------------------------------------------------------------------- greedy acceptance

def test_greedy_keeps_drafts_while_they_are_the_argmax():
    rng = torch.Generator().manual_seed(3)
    rows = torch.randn(6, 50, generator=rng)
    best = rows.argmax(dim=-1).tolist()
    assert verify_greedy(rows, best[:5]) == Verdict(5, best[5])
    for wrong_at in range(5):
        drafts = list(best[:5])
        drafts[wrong_at] = (drafts[wrong_at] + 1) % 50
        assert verify_greedy(rows, drafts) == Verdict(wrong_at, best[wrong_at])
    assert verify_greedy(rows[:1], []) == Verdict(0, best[0])
    with pytest.raises(ValueError):
        verify_greedy(rows[:3], best[:3])  # the bonus row is missing


def test_greedy_ties_and_nan_as_the_plain_loop():
    row = torch.tensor([0.0, 3.0, 1.0, 3.0])
    greedy = SamplingParams(temperature=0.0)
    assert verify_greedy(row[None], []).token == generate.sample(row, greedy) == 1
    assert verify_greedy(torch.stack([row, row]), [3]) == Verdict(0, 1)
    with pytest.raises(InvalidLogitsError):
        verify_greedy(torch.tensor([[0.0, float("nan")]]), [])


def test_processed_rows_are_the_plain_chain_after_each_draft():
    vocab = 40
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(4))
    banned = 13

    def no_thirteen_at_odd_lengths(generated, row):  # a stand-in for a grammar: reads the history
        return row.masked_fill(torch.arange(vocab) == banned, float("-inf")) if len(generated) % 2 else row

    params = SamplingParams(temperature=0.7, top_k=9, top_p=0.9, min_p=0.02, repetition_penalty=1.3,
                            logits_processors=(no_thirteen_at_odd_lengths,))
    generated = [5, 3, 3, 13]
    wanted, drafts = [], []
    for i in range(5):  # the plain chain row by row, each draft the row's likeliest token
        history = generated + drafts
        wanted.append(process_logits(apply_processors(params, history, logits[i]), params,
                                     seen_mask(history, vocab, "cpu")))
        drafts.append(int(wanted[-1].argmax()))
    drafts.pop()
    seen = seen_mask(generated, vocab, "cpu")
    rows = processed_rows(logits, params, generated, drafts, seen)
    assert rows.shape == (5, vocab)
    for i in range(5):
        assert torch.equal(rows[i], torch.softmax(wanted[i], dim=-1))
    assert torch.equal(seen, seen_mask(generated, vocab, "cpu"))  # the caller's mask untouched
    assert (rows[1::2, banned] == 0).all()

    stopped = processed_rows(logits, params, generated, [drafts[0], banned, 2], seen)  # row 1 forbids its draft
    assert stopped.shape[0] == 2 and stopped[1, banned] == 0 and stopped[0, drafts[0]] > 0
    assert verify_sampled(stopped, [drafts[0], banned, 2], None, torch.Generator().manual_seed(0)).accepted <= 1
    greedy = processed_rows(logits, SamplingParams(temperature=0.0), [], [1, 2])
    assert torch.equal(greedy, logits[:3])


def speculative_greedy(model, prompt: list[int], n: int, k: int, drafts_of) -> list[int]:
    """A test-only loop: each step reads the pending token and `drafts_of(out, k)` as extra rows
    of one forward, keeps what verify_greedy keeps and cuts the KV cache back to it."""
    from tramontane.engine.runtime.decoder import new_cache

    cache = new_cache(model, len(prompt) + n + k + 2, capture_graphs=False)
    model.logits(prompt[:-1], 0, cache)  # the prompt but its last token: each step reads that
    out, pending = [], prompt[-1]
    while len(out) < n:
        drafts = drafts_of(out, k)
        start = cache.length
        rows = model.logits([pending] + drafts, start, cache, all_logits=True)
        verdict = verify_greedy(processed_rows(rows, SamplingParams(temperature=0.0), out, drafts), drafts)
        cache.truncate(start + 1 + verdict.accepted)  # the pending token and the kept drafts
        out += drafts[:verdict.accepted] + [verdict.token]
        pending = verdict.token
    return out[:n]


PROMPT = [1, 1050, 1200, 1300, 1050, 1200, 1300, 1050, 1200]


def noisy_copy(plain: list[int]):
    """Drafts from the plain output itself, every third token wrong: each k sees accepted,
    refused and bonus tokens."""
    return lambda out, k: [t if (len(out) + j) % 3 else (t + 1) % 2048
                           for j, t in enumerate(plain[len(out):len(out) + k])]


def lookup_drafts(prompt: list[int]):
    def drafts_of(out, k):
        return PromptLookup(prompt + out).draft(k)
    return drafts_of


def test_greedy_speculation_is_the_plain_output_on_a_model(float32_cpu_path):
    from support.fixture_models import greedy_tokens
    from tramontane.engine.mistral3.text import Mistral3Text

    model = Mistral3Text.load(FIXTURES / "mistral3_tiny-f32.gguf", device="cpu")
    plain = greedy_tokens(model, PROMPT, 40)
    for k in range(1, 9):
        assert speculative_greedy(model, PROMPT, 40, k, lookup_drafts(PROMPT)) == plain, k
        assert speculative_greedy(model, PROMPT, 40, k, noisy_copy(plain)) == plain, k


@pytest.mark.cpu_variants
def test_greedy_speculation_on_the_native_kernels(cpu_variant):
    """The same on a Q4_K_M file through the native CPU kernels: k+1 rows of one pass give the
    argmax one row at a time gives."""
    from support.fixture_models import greedy_tokens
    from tramontane.engine.mistral3.text import Mistral3Text

    model = Mistral3Text.load(FIXTURES / "mistral3_q256-Q4_K_M.gguf", device="cpu")
    plain = greedy_tokens(model, PROMPT, 40)
    for k in (1, 4, 8):
        assert speculative_greedy(model, PROMPT, 40, k, noisy_copy(plain)) == plain, (cpu_variant, k)


# ----------------------------------------------------------------------------- sampled acceptance

V, OUT_LEN = 4, 3


def conditional_tables(seed: int, depth: int, adversarial: bool) -> tuple[dict, dict]:
    """p(.|prefix) and q(.|prefix) for every prefix up to `depth` tokens over V tokens: p with
    one or two zeros (a top-k filtered row), q putting most of its mass where p has least (and
    on p's zeros) when adversarial."""
    rng = np.random.default_rng(seed)
    p, q = {}, {}
    for length in range(depth + 1):
        for prefix in itertools.product(range(V), repeat=length):
            row = rng.dirichlet(np.ones(V))
            row[rng.choice(V, size=int(rng.integers(1, 3)), replace=False)] = 0.0
            p[prefix] = torch.tensor(row / row.sum(), dtype=torch.float64)
            other = (1.0 - p[prefix].numpy()) ** 6 + 1e-3 if adversarial else rng.dirichlet(np.ones(V))
            q[prefix] = torch.tensor(other / other.sum(), dtype=torch.float64)
    return p, q


def sampled_counts(p, q, k: int, draws: int, rule, seed: int, one_hot: bool = False) -> np.ndarray:
    """How often each first-OUT_LEN-tokens sequence comes out of repeated verification."""
    gen = torch.Generator().manual_seed(seed)
    counts = np.zeros(V ** OUT_LEN, dtype=np.int64)
    for _ in range(draws):
        out: list[int] = []
        while len(out) < OUT_LEN:
            drafts, q_rows = [], []
            for _ in range(k):
                row = q[tuple(out + drafts)]
                if one_hot:  # a certain draft: always the target's least likely token
                    drafts.append(int(torch.argmin(p[tuple(out + drafts)])))
                else:
                    q_rows.append(row)
                    drafts.append(int(torch.multinomial(row, 1, generator=gen)))
            p_rows = torch.stack([p[tuple(out + drafts[:i])] for i in range(k + 1)])
            verdict = rule(p_rows, drafts, None if one_hot else torch.stack(q_rows), gen)
            out += drafts[:verdict.accepted] + [verdict.token]
        counts[np.ravel_multi_index(out[:OUT_LEN], (V,) * OUT_LEN)] += 1
    return counts


def exact_law(p) -> np.ndarray:
    law = np.zeros(V ** OUT_LEN)
    for seq in itertools.product(range(V), repeat=OUT_LEN):
        law[np.ravel_multi_index(seq, (V,) * OUT_LEN)] = np.prod([float(p[seq[:i]][seq[i]]) for i in range(OUT_LEN)])
    return law


def chi_square_p_value(counts: np.ndarray, law: np.ndarray) -> float:
    """Pearson's test over the cells of positive probability (a zero-probability cell that ever
    occurs is its own failure)."""
    assert counts[law == 0].sum() == 0, "a sequence of probability 0 came out"
    expected = law[law > 0] * counts.sum()
    observed = counts[law > 0]
    stat = float(((observed - expected) ** 2 / expected).sum())
    df = int((law > 0).sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def naive_rule(p_rows, drafts, q_rows, gen):
    """Wrong on purpose: after a refusal, a draw from p itself instead of max(0, p - q)."""
    verdict = verify_sampled(p_rows, drafts, q_rows, gen)
    if verdict.accepted < len(drafts):
        return Verdict(verdict.accepted, int(torch.multinomial(p_rows[verdict.accepted], 1, generator=gen)))
    return verdict


@pytest.mark.parametrize("k,adversarial", [(1, True), (3, True), (3, False)])
def test_sampled_output_keeps_the_target_distribution(k, adversarial):
    p, q = conditional_tables(seed=10 + k, depth=OUT_LEN + k, adversarial=adversarial)
    counts = sampled_counts(p, q, k, draws=4000, rule=verify_sampled, seed=k)
    assert chi_square_p_value(counts, exact_law(p)) > 1e-3


def test_sampled_with_certain_drafts_keeps_the_target_distribution():
    p, q = conditional_tables(seed=20, depth=OUT_LEN + 2, adversarial=True)
    counts = sampled_counts(p, q, 2, draws=4000, rule=verify_sampled, seed=5, one_hot=True)
    assert chi_square_p_value(counts, exact_law(p)) > 1e-3


def test_the_chi_square_test_catches_a_wrong_rule():
    p, q = conditional_tables(seed=13, depth=OUT_LEN + 3, adversarial=True)
    counts = sampled_counts(p, q, 3, draws=2000, rule=naive_rule, seed=3)
    assert chi_square_p_value(counts, exact_law(p)) < 1e-6


def test_sampled_edge_cases():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    assert verify_sampled(p, [1], None, gen).accepted == 1  # p(x) = 1: always kept
    assert verify_sampled(p, [0], None, gen) == Verdict(0, 1)  # p(x) = 0: never kept, the residual is p
    same = torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
    for _ in range(50):  # q == p: every draft kept
        assert verify_sampled(same, [2], same[:1], gen).accepted == 1
    assert verify_sampled(p[:1], [], None, gen) == Verdict(0, 1)
    with pytest.raises(ValueError):
        verify_sampled(same[:1], [2], same[:1], gen)  # all kept, but no row for the next token


# ----------------------------------------------------------------------------- draft model's vocabulary

TINY = FIXTURES / "mistral3_tiny-f32.gguf"


def test_the_same_vocabulary_is_compatible():
    assert draft_vocabulary_mismatch(TINY, FIXTURES / "mistral3_tiny-q8_0.gguf") is None
    assert draft_vocabulary_mismatch(TINY, FIXTURES / "mistral3_q256-Q4_K_M.gguf") is None
    check_draft_vocabulary(TINY, FIXTURES / "ministral3_tiny-f32.gguf")


def _tokens(path):
    from gguf import GGUFReader

    reader = GGUFReader(path)
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    return tokens, list(types)


def test_control_tokens_may_differ_in_name(tmp_path):
    from support.gguf_edit import rewrite_gguf
    from support.tekken_versions import LATER_CONTROLS

    tokens, _ = _tokens(TINY)
    assert all(tokens[i].startswith("<SPECIAL_") for i in LATER_CONTROLS)
    for i, name in LATER_CONTROLS.items():
        tokens[i] = name
    later = rewrite_gguf(TINY, tmp_path / "v13.gguf", set_kv={"tokenizer.ggml.tokens": tokens})
    assert draft_vocabulary_mismatch(TINY, later) is None
    assert draft_vocabulary_mismatch(later, TINY) is None


def test_a_different_ordinary_token_is_refused(tmp_path):
    from support.gguf_edit import rewrite_gguf

    tokens, types = _tokens(TINY)
    i, j = 1500, 1700
    tokens[i], tokens[j] = tokens[j], tokens[i]  # same set of texts, two ids swapped
    swapped = rewrite_gguf(TINY, tmp_path / "swapped.gguf", set_kv={"tokenizer.ggml.tokens": tokens})
    reason = draft_vocabulary_mismatch(TINY, swapped)
    assert reason is not None and reason.startswith(f"{swapped} cannot draft for {TINY}: token {i} is the text ")
    with pytest.raises(DraftModelError, match="token 1500"):
        check_draft_vocabulary(TINY, swapped)

    tokens, types = _tokens(TINY)
    types[1200] = 3  # an ordinary token made a control token of the same text
    control = rewrite_gguf(TINY, tmp_path / "control.gguf", set_kv={"tokenizer.ggml.token_type": types})
    reason = draft_vocabulary_mismatch(TINY, control)
    assert reason is not None and "token 1200 is the control token" in reason and "in the draft and the text" in reason


def test_a_different_size_or_a_broken_file_is_said(tmp_path):
    big = FIXTURES / "tekken_240911_tokenizer.gguf"
    assert draft_vocabulary_mismatch(big, TINY) == (
        f"{TINY} cannot draft for {big}: their vocabularies hold 2048 and 131072 tokens")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFError, match=str(junk)):
        draft_vocabulary_mismatch(TINY, junk)
    mmproj = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
    with pytest.raises(TokenizerError, match=str(mmproj)):
        draft_vocabulary_mismatch(TINY, mmproj)


# ----------------------------------------------------------------------------- measured costs

def test_step_times_give_this_machines_verify_costs():
    times = StepTimes(window=5, least=3)
    prior = SpeculationCost(tuple(1.0 + 0.06 * k for k in range(9)))
    for t1, t3 in [(0.012, 0.024), (0.011, 0.021), (0.5, 0.020), (0.010, 5.0), (0.013, 0.022)]:
        times.record(1, t1)  # stalls only add time: the fastest of each is its cost
        times.record(3, t3)
    times.record(1, 0.001)
    for _ in range(5):
        times.record(1, 0.010)  # the window forgets a step older than its last 5
    times.record(5, 0.03)  # seen once: not used yet
    cost = times.cost(1, prior)
    assert cost.verify[2] == pytest.approx(2.0) and cost.verify[1] == pytest.approx(1.5)
    assert cost.verify[4] == pytest.approx(3.0)  # extrapolated from 1 and 3 rows
    beside = times.cost(2, prior)  # two rows never measured: the prior, counted from a step of two
    assert beside.verify[3] == pytest.approx(prior.verify[4] / prior.verify[1])
    assert prior.beside(1) is prior
    assert times.cost(1, DRAFT_MODEL).draft_token == DRAFT_MODEL.draft_token


def test_step_costs_are_worked_out_again_only_when_a_fastest_time_changes(monkeypatch):
    times = StepTimes(window=5)
    for rows, t in ((1, 0.010), (2, 0.015), (3, 0.020)):
        for _ in range(3):
            times.record(rows, t)
    made = []
    real = SpeculationCost.from_timings.__func__

    def counted(cls, *args, **kw):
        made.append(args)
        return real(cls, *args, **kw)

    monkeypatch.setattr(SpeculationCost, "from_timings", classmethod(counted))
    first = times.cost(1, DRAFT_MODEL)
    times.record(1, 0.012)  # slower than the fastest: the same costs
    assert times.cost(1, DRAFT_MODEL) is first and len(made) == 1
    times.cost(2, DRAFT_MODEL)  # another base is a table of its own
    assert len(made) == 2
    times.record(2, 0.011)  # a faster two-row step: worked out again
    assert times.cost(1, DRAFT_MODEL).verify[1] == pytest.approx(1.1) and len(made) == 3


def test_a_drafted_row_that_costs_a_step_switches_drafting_off():
    controller = AdaptiveDraftLength(CPU_LIKE)
    for _ in range(5):
        controller.record(controller.length(), controller.length())  # every draft accepted
    assert controller.length() == 8
    step_bound = SpeculationCost(tuple(1.0 + 1.1 * k for k in range(9)))  # a row costs more than a step
    controller.retune(step_bound)
    assert controller.length() == 0
    spent, tokens = simulate(controller, lambda step, k: k, 400)  # probes only, and they lose
    assert spent / tokens <= 1.03


def test_the_probes_of_eight_sequences_together_cost_the_batch_under_three_percent():
    """Beside 7 others, each sequence's probe makes the step of all 8 dearer: eight sequences off
    for a reply's 300 steps, each probing on its own schedule (arrivals staggered), cost the batch
    under 3 %, where alone each would have probed every few dozen steps."""
    dear = SpeculationCost(tuple(1.0 + 0.3 * k for k in range(17)))  # the table beside the 8 rows
    alone = AdaptiveDraftLength(dear)
    alone.record(2, 0)
    assert alone.probe_every * 7 < 300  # alone: probes 40, 120 and 280 steps on (backing off)
    batch = [AdaptiveDraftLength(dear) for _ in range(8)]
    for i, c in enumerate(batch):
        c.retune(dear, batch=8)
        c.record(2, 0)  # tried and lost: off, its next probe due later
        for _ in range(i * 5):  # arrivals staggered
            c.record(0, 0)
    spent, steps = 0.0, 300
    for _ in range(steps):
        ks = [c.length() for c in batch]
        spent += dear.step(sum(ks))
        for c, k in zip(batch, ks):
            c.record(k, 0)
            c.retune(dear, batch=8)
    assert spent / steps <= 1.03


def test_beside_other_sequences_a_draft_must_pay_for_their_wait_too():
    """Alone, drafts accepted a third of the time pay on 6 % a row; beside 7 other decoding sequences
    the step's extra cost delays their tokens too, and the same drafts do not pay."""
    cheap = SpeculationCost(tuple(1.0 + 0.06 * k for k in range(9)))
    alone, beside = AdaptiveDraftLength(cheap), AdaptiveDraftLength(cheap)
    for c in (alone, beside):
        c.record(2, 0)  # acceptance now 0.9 / 2.8, about a third
    beside.retune(cheap, batch=8)
    assert alone.length() > 0 and beside.length() == 0


def test_a_reply_starts_from_the_last_ones_acceptance_and_probes_at_once():
    dear = SpeculationCost(tuple(1.0 + 0.6 * k for k in range(9)))
    fresh = AdaptiveDraftLength(CPU_LIKE)
    fresh.retune(dear)  # even odds on dear rows: off, but it has never tried: a probe now
    assert fresh.length() == fresh.probe_tokens
    fresh.record(fresh.probe_tokens, 0)
    assert fresh.length() == 0  # tried and lost: the next probe waits
    seasoned = AdaptiveDraftLength(dear)
    seasoned.start_from(9.5, 10.0)  # the last reply's drafts were nearly all accepted
    assert seasoned.length() > 2 and seasoned.counts == (9.5, 10.0)
    with pytest.raises(ValueError):
        seasoned.start_from(3.0, 2.0)
