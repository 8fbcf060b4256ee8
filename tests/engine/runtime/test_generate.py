"""Sampling functions against transformers' logits processors, and the generation loop
(EOS, stop strings, max tokens, cancel from another thread, seeds, streaming) on a tiny model."""
from __future__ import annotations

import os
import threading

import pytest
import torch

from support import FIXTURES  # noqa: E402

from tramontane.engine.api import EngineError, SamplingParams  # noqa: E402
from tramontane.engine.runtime.batch import generate  # noqa: E402
from tramontane.engine.runtime.generate import (  # noqa: E402
    StopStringFilter, apply_repetition_penalty, apply_temperature, check_params, make_generator,
    min_p_filter, process_logits, sample, top_k_filter, top_p_filter)
from tramontane.engine.gguf import open_gguf  # noqa: E402
from tramontane.engine.mistral3.text import Mistral3Text  # noqa: E402
from tramontane.engine.mistral3.tokenizer import Tokenizer  # noqa: E402
from tramontane.engine.runtime.decoder import new_cache  # noqa: E402

MINISTRAL3_F32 = os.path.join(FIXTURES, "ministral3_tiny-f32.gguf")
MINISTRAL3_HF = os.path.join(FIXTURES, "ministral3_tiny")
VOCAB = 2048


def _logits(seed: int, n: int = VOCAB, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale


# ------------------------------------------------------------------ vs transformers

SEEDS = range(8)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_repetition_penalty_equals_hf(seed, penalty):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = _logits(seed)
    history = torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(100 + seed))  # with repeats
    ref = RepetitionPenaltyLogitsProcessor(penalty)(history[None], logits[None].clone())[0]
    assert torch.equal(apply_repetition_penalty(logits, history, penalty), ref)
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[history] = True
    assert torch.equal(apply_repetition_penalty(logits, mask, penalty), ref)
    # sign handling: a seen token always moves toward "less likely" when penalty > 1
    seen = mask & (logits != 0)
    out = apply_repetition_penalty(logits, mask, penalty)
    if penalty > 1:
        assert (out[seen] < logits[seen]).all()
    assert torch.equal(out[~mask], logits[~mask])


@pytest.mark.parametrize("seed", SEEDS)
def test_filters_equal_hf_warpers(seed):
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    logits = _logits(seed)
    ids = torch.zeros(1, 1, dtype=torch.long)
    for t in (0.3, 0.7, 1.5):
        assert torch.equal(apply_temperature(logits, t), TemperatureLogitsWarper(t)(ids, logits[None].clone())[0])
    for k in (1, 5, 40, 2047):
        assert torch.equal(top_k_filter(logits, k), TopKLogitsWarper(k)(ids, logits[None].clone())[0])
    for p in (0.05, 0.5, 0.9, 0.999):
        assert torch.equal(top_p_filter(logits, p), TopPLogitsWarper(p)(ids, logits[None].clone())[0])
    for m in (0.01, 0.1, 0.5, 1.0):
        assert torch.equal(min_p_filter(logits, m), MinPLogitsWarper(m)(ids, logits[None].clone())[0])


def test_top_k_keeps_ties_like_hf():
    from transformers.generation.logits_process import TopKLogitsWarper

    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0, 0.5])
    ref = TopKLogitsWarper(3)(torch.zeros(1, 1, dtype=torch.long), logits[None].clone())[0]
    assert torch.equal(top_k_filter(logits, 3), ref)
    assert torch.isfinite(top_k_filter(logits, 3)).sum() == 4  # 3, 3, 2, 2: both 2s tie the 3rd


@pytest.mark.parametrize("seed", SEEDS)
def test_whole_chain_equals_hf_processor_list_in_hf_order(seed):
    from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                        RepetitionPenaltyLogitsProcessor,
                                                        TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    logits = _logits(seed)
    history = torch.randint(0, VOCAB, (50,), generator=torch.Generator().manual_seed(seed))
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.2)
    chain = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.8),
                                 TopKLogitsWarper(50), TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)])
    ref = chain(history[None], logits[None].clone())[0]
    assert torch.equal(process_logits(logits, params, history), ref)


# ------------------------------------------------------------------ properties

@pytest.mark.parametrize("seed", SEEDS)
def test_filter_properties(seed):
    logits = _logits(seed, scale=2.0)
    probs = logits.softmax(-1)
    for k in (1, 7, 100):
        assert torch.isfinite(top_k_filter(logits, k)).sum() == k  # no ties in random floats
        kept = torch.isfinite(top_k_filter(logits, k))
        assert logits[kept].min() >= logits[~kept].max()
    for p in (0.1, 0.5, 0.95):
        kept = torch.isfinite(top_p_filter(logits, p))
        mass = probs[kept].sum()
        assert mass >= p - 1e-6  # enough mass
        assert mass - probs[kept].min() < p + 1e-6  # and minimal: without its least token, not enough
        assert probs[kept].min() >= probs[~kept].max()  # the most likely ones
    for m in (0.05, 0.3):
        kept = torch.isfinite(min_p_filter(logits, m))
        assert (probs[kept] >= m * probs.max()).all() and (probs[~kept] < m * probs.max()).all()
    assert top_k_filter(logits, 0) is logits and top_p_filter(logits, 1.0) is logits and min_p_filter(logits, 0) is logits


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    params = SamplingParams(temperature=1.0, seed=1234)
    logits = _logits(3, scale=0.5)
    draws = lambda seed: [sample(logits, params, g) for g in [make_generator(seed, "cpu")] for _ in range(50)]  # noqa: E731
    assert draws(1234) == draws(1234)
    assert draws(1234) != draws(4321)
    small = torch.tensor([0.0, 1.0, 2.0, -1.0])
    g = make_generator(7, "cpu")
    counts = torch.bincount(torch.tensor([sample(small, params, g) for _ in range(4000)]), minlength=4).float()
    assert (counts / 4000 - small.softmax(-1)).abs().max() < 0.03
    # filtered tokens never come out; the kept ones in their renormalised proportions
    g = make_generator(8, "cpu")
    k2 = SamplingParams(temperature=1.0, top_k=2)
    draws2 = torch.tensor([sample(small, k2, g) for _ in range(4000)])
    assert set(draws2.tolist()) == {1, 2}
    assert abs((draws2 == 2).float().mean().item() - torch.tensor([1.0, 2.0]).softmax(-1)[1].item()) < 0.03
    # greedy ignores the generator; with top_k=1 sampling is greedy too
    assert sample(logits, SamplingParams(temperature=0.0)) == int(logits.argmax())
    assert sample(logits, SamplingParams(temperature=5.0, top_k=1), make_generator(0, "cpu")) == int(logits.argmax())


def test_the_draw_never_lands_on_a_filtered_token_at_either_end_of_the_unit_interval(monkeypatch):
    """The draw inverts the cumulative sum at one uniform number u in [0, 1): at u = 0 and at
    u * total rounded up to the total (u = 1 here, forced), the token is still one that the
    filters kept, never a masked one before, between or after them."""
    logits = torch.tensor([float("-inf"), 0.0, float("-inf"), 1.0, float("-inf"), float("-inf")])
    params = SamplingParams(temperature=1.0)
    for u in (0.0, 1.0):
        monkeypatch.setattr(torch, "rand", lambda *a, u=u, **k: torch.full((1,), u, dtype=k.get("dtype")))
        assert sample(logits, params, make_generator(0, "cpu")) == (1 if u == 0.0 else 3)


def test_bad_params_are_one_clear_error():
    with pytest.raises(EngineError, match="top_p"):
        generate(None, None, [1], SamplingParams(top_p=0.0), None)
    with pytest.raises(EngineError, match="repetition_penalty"):
        generate(None, None, [1], SamplingParams(repetition_penalty=-1.0), None)
    for seed in (1 << 64, -(1 << 63) - 1):  # was torch's "Overflow when unpacking long long"
        with pytest.raises(EngineError, match="seed must fit in 64 bits"):
            generate(None, None, [1], SamplingParams(temperature=0.7, seed=seed), None)
    for seed in (-(1 << 63), (1 << 64) - 1):  # the ends of what the generator takes
        check_params(SamplingParams(seed=seed))
        make_generator(seed, "cpu")


# ------------------------------------------------------------------ stop strings

def test_stop_string_filter_holds_back_and_trims():
    f = StopStringFilter(["</end>", "STOP"])
    shown = [f.feed(p) for p in ["Hello <", "/en", "d> tail"]]
    assert "".join(shown) == "Hello " and f.stopped and f.text == "Hello "
    f = StopStringFilter(["ab"])
    assert f.feed("xa") == "x"  # "a" might start "ab"
    assert f.feed("c") == "ac"  # it did not
    assert f.feed("a", final=True) == "a" and not f.stopped
    f = StopStringFilter(["aaa", "ab"])
    assert "".join(f.feed(c) for c in "xaab") == "xa" and f.text == "xa"  # earliest occurrence wins
    f = StopStringFilter([""])
    assert f.feed("anything") == "anything"


# ------------------------------------------------------------------ the loop

@pytest.fixture(scope="module")
def model():
    return Mistral3Text.load(MINISTRAL3_F32, device="cpu")


@pytest.fixture(scope="module")
def tok():
    with open_gguf(MINISTRAL3_F32) as gf:
        return Tokenizer.from_gguf(gf)


class _EosAs:
    """The real tokenizer with another eos id (to make a random model stop where we want)."""

    def __init__(self, tok, eos_id):
        self._tok, self.eos_id = tok, eos_id

    def stream(self):
        return self._tok.stream()


PROMPT = [1, 3, 1500, 1200, 1700, 1100, 1300, 1900, 4]


def _run(model, tok, params, prompt=PROMPT, **kw):
    pieces = []
    cache = kw.pop("cache", None) or new_cache(model, 64)
    out = generate(model, cache, prompt, params, tok, on_piece=pieces.append, **kw)
    return out, pieces, cache


def _hf_greedy(n: int, prompt=PROMPT, penalty: float = 1.0) -> list[int]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(MINISTRAL3_HF, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          repetition_penalty=penalty, pad_token_id=11, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_greedy_matches_hf_generate_and_streams_the_decoded_text(model, tok):
    out, pieces, cache = _run(model, tok, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    assert out.token_ids == _hf_greedy(20)
    assert out.stats.finish_reason == "length" and len(out.token_ids) == 20
    assert "".join(pieces) == out.text == tok.decode(out.token_ids)
    assert cache.length == len(PROMPT) + len(out.cached_ids) and out.cached_ids == out.token_ids[:-1]
    s = out.stats
    assert s.prompt_tokens == s.prefilled_tokens == len(PROMPT) and s.generated_tokens == 20
    assert s.ttft_s > 0 and s.prefill_tok_s > 0 and s.decode_tok_s > 0 and s.context_size == 64


def test_repetition_penalty_in_the_loop_matches_hf_generate(model, tok):
    out, _, _ = _run(model, tok, SamplingParams(temperature=0.0, max_tokens=15, ignore_eos=True,
                                                repetition_penalty=1.8))
    assert out.token_ids == _hf_greedy(15, penalty=1.8)


def test_eos_stops_and_is_not_part_of_the_output(model, tok):
    free, _, _ = _run(model, tok, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    eos = free.token_ids[5]
    first = free.token_ids.index(eos)
    out, pieces, cache = _run(model, _EosAs(tok, eos), SamplingParams(temperature=0.0, max_tokens=12))
    assert out.stats.finish_reason == "stop" and out.token_ids == free.token_ids[:first]
    assert cache.length == len(PROMPT) + first  # every kept token was fed back
    ignored, _, _ = _run(model, _EosAs(tok, eos), SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert ignored.token_ids == free.token_ids


def test_stop_string_is_trimmed_and_never_streamed(model, tok):
    free, _, _ = _run(model, tok, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    text = free.text
    assert len(text) > 12
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = text.find(stop)
    out, pieces, _ = _run(model, tok, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True,
                                                     stop=["\x00never", stop]))
    assert out.stats.finish_reason == "stop_string"
    assert out.text == text[:cut] == "".join(pieces)
    assert out.token_ids == free.token_ids[:len(out.token_ids)] and len(out.token_ids) < 30


def test_seeded_generation_is_reproducible(model, tok):
    p = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=99, ignore_eos=True)
    a, _, _ = _run(model, tok, p)
    b, _, _ = _run(model, tok, p)
    c, _, _ = _run(model, tok, SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=100, ignore_eos=True))
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_cancel_from_another_thread_stops_within_one_token(model, tok, monkeypatch):
    cancel = threading.Event()
    reached, release = threading.Event(), threading.Event()
    calls = []
    real_forward = model.forward_batch

    def slow_decode(embeds, groups, logits_of):
        if sum(n for _, _, n in groups) == 1:  # a decode step (the prompt is read in one pass)
            calls.append(groups)
            if len(calls) == 4:
                reached.set()
                release.wait(10)
        return real_forward(embeds, groups, logits_of)

    monkeypatch.setattr(model, "forward_batch", slow_decode)
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=_run(
        model, tok, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True), cancel=cancel)[0]))
    worker.start()
    assert reached.wait(30)
    cancel.set()  # from this (another) thread, while step 4 runs
    release.set()
    worker.join(30)
    out = result["out"]
    assert out.stats.finish_reason == "cancelled"
    assert len(calls) == 4 and len(out.token_ids) == 5  # the step in flight finishes, nothing after


def test_cancelled_before_start_does_nothing(model, tok):
    cancel = threading.Event()
    cancel.set()
    out, pieces, cache = _run(model, tok, SamplingParams(max_tokens=5), cancel=cancel)
    assert out.token_ids == [] and out.stats.finish_reason == "cancelled" and cache.length == 0 and not pieces


def test_embeddings_prompt_and_continuation(model, tok):
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    ref, _, _ = _run(model, tok, greedy)
    emb, _, _ = _run(model, tok, greedy, prompt=model.embed(PROMPT), history_ids=PROMPT)
    assert emb.token_ids == ref.token_ids
    # a second turn on the same cache continues after what the cache holds
    cache = new_cache(model, 64)
    first = generate(model, cache, PROMPT[:5], greedy, tok)
    held = PROMPT[:5] + first.cached_ids
    second = generate(model, cache, [4, 1500], greedy, tok)
    again = generate(model, new_cache(model, 64), held + [4, 1500], greedy, tok)
    assert second.token_ids == again.token_ids
    # start_pos below the cache length rewinds: the same as a fresh run of that prefix
    third = generate(model, cache, PROMPT[5:], greedy, tok, start_pos=5)
    assert third.token_ids == ref.token_ids


def test_context_full_ends_with_length(model, tok):
    cache = new_cache(model, len(PROMPT) + 3)
    out = generate(model, cache, PROMPT, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True), tok)
    assert out.stats.finish_reason == "length" and len(out.token_ids) == 4 and cache.length == cache.capacity
    with pytest.raises(EngineError, match="more than the context length of 4"):
        generate(model, new_cache(model, 4), PROMPT, SamplingParams(), tok)


def test_nan_logits_are_a_clear_error():
    bad = _logits(0)
    bad[7] = float("nan")
    with pytest.raises(EngineError, match="invalid logits"):
        sample(bad, SamplingParams(temperature=0.0))
    with pytest.raises(EngineError, match="invalid logits"):
        sample(bad, SamplingParams(temperature=1.0), make_generator(0, "cpu"))


@pytest.mark.parametrize("native", [True, False])
def test_greedy_is_the_first_largest_logit_on_either_path(monkeypatch, native):
    """Greedy on CPU logits takes the native one-pass argmax when built; both paths agree."""
    from tramontane.engine.runtime import generate as generate_mod

    monkeypatch.setattr(generate_mod.cpu_native, "AVAILABLE", native and generate_mod.cpu_native.AVAILABLE)
    for seed in range(4):
        logits = _logits(seed, 131075)
        assert sample(logits, SamplingParams(temperature=0.0)) == int(logits.argmax())
    tied = torch.zeros(40)
    tied[[31, 9, 17]] = 1.0
    assert sample(tied, SamplingParams(temperature=0.0)) == 9
    tied[3] = float("nan")
    with pytest.raises(EngineError, match="invalid logits"):
        sample(tied, SamplingParams(temperature=0.0))


def test_cancel_during_a_long_prefill_keeps_a_valid_prefix(model, tok):
    cancel = threading.Event()
    real_layers = model._layers
    passes = []

    def layers_then_cancel(x, groups, keep=None):
        passes.append(groups[0][1])
        cancel.set()  # set by "another thread" while the first chunk runs
        return real_layers(x, groups, keep)

    model._layers = layers_then_cancel
    old_chunk = model.prefill_chunk
    model.prefill_chunk = 4
    try:
        ids = list(range(1000, 1010))
        out, pieces, cache = _run(model, tok, SamplingParams(max_tokens=5), prompt=ids, cancel=cancel)
    finally:
        model.prefill_chunk = old_chunk
        del model._layers
    assert passes == [0] and out.stats.finish_reason == "cancelled" and out.token_ids == []
    assert cache.length == 4  # the chunk done is kept: a prefix of the prompt
    rest = model.logits(ids[4:], 4, cache, all_logits=True)
    assert (rest - model.logits(ids, all_logits=True)[4:]).abs().max().item() <= 1e-5
