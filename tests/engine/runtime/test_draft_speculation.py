"""Speculation with a draft model inside the one scheduler (issue 38 item 2): the draft proposes
k tokens for every drafting sequence in one call, the target verifies them as k+1 rows of the
step, and greedy output is the plain output token for token — alone, across turns (the draft's
KV rolled back with the target's), and in a batch mixing drafting, prompt-lookup and plain
sequences; a draft of another vocabulary is refused when the engine loads, naming both files."""
from __future__ import annotations

import pytest

from tramontane.engine.api import EngineError, SamplingParams
from tramontane.engine.runtime.batch import BatchScheduler
from tramontane.engine.runtime.local import LocalEngine

from support import FIXTURES
from support.batch_runs import random_prompts

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
DRAFT = FIXTURES / "mistral3_q256-Q4_K_M.gguf"  # another model of the same vocabulary: it often disagrees


def _params(mode: str, k: int = 4, n: int = 24) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, speculation=mode, spec_tokens=k)


@pytest.fixture(scope="module")
def engines():
    plain = LocalEngine(MODEL, device="cpu", context_length=512)
    own = LocalEngine(MODEL, device="cpu", context_length=512, draft_model=MODEL)  # its own draft: all accepted
    yield plain, own
    plain.close()
    own.close()


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_with_the_model_as_its_own_draft_is_the_plain_output_and_accepts_every_draft(engines, k):
    plain, own = engines
    prompt = random_prompts(plain, [30], seed=51)[0]
    want = plain.generate_from(prompt, _params("off")).token_ids
    got = own.generate_from(prompt, _params("draft", k))
    assert got.token_ids == want
    assert got.stats.drafted_tokens > 0 and got.stats.accepted_tokens == got.stats.drafted_tokens


def test_a_draft_that_disagrees_costs_nothing_in_output_and_rolls_back_across_turns():
    plain = LocalEngine(MODEL, device="cpu", context_length=512)
    other = LocalEngine(MODEL, device="cpu", context_length=512, draft_model=DRAFT)
    try:
        prompt = random_prompts(plain, [40], seed=52)[0]
        first = plain.generate_from(prompt, _params("off"))
        got = other.generate_from(prompt, _params("draft", 4))
        assert got.token_ids == first.token_ids and got.stats.drafted_tokens > 0
        assert got.stats.accepted_tokens < got.stats.drafted_tokens  # it does disagree
        turn2 = type(prompt)(prompt.ids + first.token_ids + random_prompts(plain, [10], seed=53)[0].ids[1:])
        assert other.generate_from(turn2, _params("draft", 4)).token_ids == \
            plain.generate_from(turn2, _params("off")).token_ids
    finally:
        plain.close()
        other.close()


def test_a_batch_mixing_draft_lookup_and_plain_sequences_equals_each_alone(engines):
    plain, own = engines
    prompts = random_prompts(plain, [25, 40, 18, 33], seed=54)
    modes = ["draft", "ngram", "off", "draft"]
    want = [plain.generate_from(p, _params("off")).token_ids for p in prompts]
    sched = BatchScheduler(own.model, own.tokenizer, slots=4, priority_slots=0, context_length=512, step_rows=64)
    sched.draft_model = own.scheduler.draft_model
    futures = [sched.submit(p, _params(m, 3)) for p, m in zip(prompts, modes)]
    while sched.step():
        pass
    assert [f.result(timeout=0).token_ids for f in futures] == want
    assert futures[0].result().stats.drafted_tokens > 0 and futures[2].result().stats.drafted_tokens == 0
    assert own.scheduler.draft_model.keys() == []  # every sequence's draft KV retired when it ended


def test_a_second_reply_to_the_same_prompt_does_not_make_the_draft_read_it_again(engines, monkeypatch):
    """The draft's KV of an ended reply serves the next one (the same prompt again, or the chat's
    next turn), as the prefix cache serves the target: its prompt is not read a second time.
    The draft's pool holds as many positions as the target's, for every sequence at once."""
    plain, own = engines
    drafter = own.scheduler.draft_model
    assert drafter.pool.positions == own.pool.positions
    prompt = random_prompts(plain, [60], seed=55)[0]
    want = plain.generate_from(prompt, _params("off", n=8)).token_ids
    read = []
    real = drafter.model.forward_batch

    def counted(embeds, groups, logits_of):
        if not logits_of:  # a prompt chunk (decode steps ask for every row's logits)
            read.append(sum(n for _, _, n in groups))
        return real(embeds, groups, logits_of)

    monkeypatch.setattr(drafter.model, "forward_batch", counted)
    first = own.generate_from(prompt, _params("draft", 3, n=8))
    assert first.token_ids == want and sum(read) >= len(prompt.ids) - 1
    read.clear()
    again = own.generate_from(prompt, _params("draft", 3, n=8))
    assert again.token_ids == want and again.stats.drafted_tokens > 0
    assert sum(read) == 0


def test_while_drafting_is_off_the_draft_model_is_not_called(engines, monkeypatch):
    """A sequence whose draft length is 0 costs the draft model nothing: no call, no row; its
    draft KV catches up in one pass at its next probe."""
    from tramontane.engine.runtime.speculative import AdaptiveDraftLength

    plain, own = engines
    drafter = own.scheduler.draft_model
    prompt = random_prompts(plain, [30], seed=56)[0]
    want = plain.generate_from(prompt, _params("off", n=12)).token_ids
    calls = []
    real = drafter.draft
    monkeypatch.setattr(drafter, "draft", lambda requests: calls.append(list(requests)) or real(requests))
    monkeypatch.setattr(AdaptiveDraftLength, "length", lambda self: 0)
    got = own.generate_from(prompt, _params("draft", 3, n=12))
    assert got.token_ids == want and got.stats.drafted_tokens == 0
    assert calls == []


def test_a_draft_of_another_vocabulary_is_refused_naming_both_files(tmp_path):
    from gguf import GGUFReader

    from support.gguf_edit import rewrite_gguf

    field = GGUFReader(MODEL).fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    tokens[1500], tokens[1700] = tokens[1700], tokens[1500]
    other = rewrite_gguf(MODEL, tmp_path / "other-vocab.gguf", set_kv={"tokenizer.ggml.tokens": tokens})
    with pytest.raises(EngineError) as info:
        LocalEngine(MODEL, device="cpu", context_length=256, draft_model=other)
    assert str(other) in str(info.value) and str(MODEL) in str(info.value)


def test_serve_and_run_say_a_draft_needs_its_file(tmp_path):
    import argparse

    from tramontane.engine.cli import run, serve

    for module, argv in ((run, ["run", "--model", str(MODEL), "--prompt", "hi"]), (serve, ["serve", "--model", str(MODEL)])):
        parser = argparse.ArgumentParser()
        module.add_parsers(parser.add_subparsers())
        args = parser.parse_args(argv + ["--spec", "draft"])
        with pytest.raises(EngineError, match="--spec draft needs --draft-model FILE"):
            args.func(args)
        args = parser.parse_args(argv + ["--spec", "draft", "--draft-model", str(tmp_path / "none.gguf")])
        with pytest.raises(EngineError, match="none.gguf: no such draft model file"):
            args.func(args)
