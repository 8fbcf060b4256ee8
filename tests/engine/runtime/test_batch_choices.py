"""The batch scheduler's shared work: requests with one prompt (a request's `n` choices) read it
once and decode as rows of the same steps; a prompt's reading is reported chunk by chunk; every
sequence takes blocks of one pool (a shared system prompt held once, more conversations than
fixed slots would hold, preemption when it runs out).

The reference for every sequence is the same request run alone by LocalEngine (the path tied to
HF and llama.cpp by other tests)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from tramontane.engine.api import EngineError, SamplingParams
from tramontane.engine.mistral3.chat_format import EncodedPrompt
from tramontane.engine.runtime.batch import BatchedEngine, BatchScheduler
from tramontane.engine.runtime.decoder import new_pool
from tramontane.engine.runtime.local import LocalEngine

from support import FIXTURES
from support.engines import local_engine_fixture
from support.batch_runs import Recorder, alone, greedy, random_prompts

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"


engine = local_engine_fixture(MODEL, context_length=512)


def test_choices_of_one_prompt_read_it_once_and_decode_together(engine):
    prompt = random_prompts(engine, [70], seed=11)[0]
    want = alone(engine, prompt, greedy(9)).token_ids
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=48)
    rec = Recorder(engine.model)
    try:
        futures = [sched.submit(prompt, greedy(9)) for _ in range(3)]
        while sched.step():
            pass
    finally:
        rec.close()
    results = [f.result(timeout=0) for f in futures]
    assert [r.token_ids for r in results] == [want] * 3
    # the prompt was read once, in two chunks, by the first; the others started from its KV
    assert rec.steps[:3] == [[48], [22], [1, 1, 1]]
    assert sum(n for step in rec.steps for n in step if n > 1) == 70
    assert [r.stats.reused_tokens for r in results] == [0, 70, 70]
    assert all(r.stats.prompt_tokens == 70 and r.finish_reason == "length" for r in results)


def test_run_together_admits_the_choices_in_one_step_whatever_their_threads_do(engine):
    prompt = random_prompts(engine, [30], seed=18)[0]
    want = alone(engine, prompt, greedy(6)).token_ids
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=64).start()
    rec = Recorder(engine.model)
    try:
        batched = BatchedEngine(engine, sched)
        arrived = threading.Barrier(3)

        def choice(view, i):
            if i:  # the later choices come late: the first would have read the prompt alone by then
                arrived.wait()
                time.sleep(0.05)
            else:
                arrived.wait()
            return view.generate_from(prompt, greedy(6)).token_ids

        got = batched.run_together(choice, 3)
    finally:
        rec.close()
        sched.close()
    assert got == [want] * 3
    assert rec.steps[:2] == [[30], [1, 1, 1]]  # read once, then three rows of one step

    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=64).start()
    try:  # one that fails before generating does not hold the others
        def flaky(view, i):
            if i == 1:
                raise ValueError("no")
            return view.generate_from(prompt, greedy(6)).token_ids

        with pytest.raises(ValueError):
            BatchedEngine(engine, sched).run_together(flaky, 3)
    finally:
        sched.close()


def test_sampled_choices_each_follow_their_own_seed(engine):
    prompt = random_prompts(engine, [40], seed=12)[0]
    params = [SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, seed=100 + i, ignore_eos=True)
              for i in range(3)]
    want = [alone(engine, prompt, p).token_ids for p in params]
    assert len({tuple(w) for w in want}) > 1  # the seeds do give different replies
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=3, context_length=512, step_rows=64)
    futures = [sched.submit(prompt, p) for p in params]
    while sched.step():
        pass
    assert [f.result(timeout=0).token_ids for f in futures] == want


def test_when_the_first_is_cancelled_while_reading_the_others_read_the_prompt(engine):
    prompt = random_prompts(engine, [90], seed=13)[0]
    want = alone(engine, prompt, greedy(6)).token_ids
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=3, context_length=512, step_rows=32)
    cancel = threading.Event()
    first = sched.submit(prompt, greedy(6), cancel=cancel)
    others = [sched.submit(prompt, greedy(6)) for _ in range(2)]
    sched.step()  # the first reads 32 rows; the others wait for it
    assert sched.active == 1
    cancel.set()
    while sched.step():
        pass
    assert first.result(timeout=0).finish_reason == "cancelled"
    assert [f.result(timeout=0).token_ids for f in others] == [want, want]


def test_more_choices_than_free_slots_wait_for_one(engine):
    prompt = random_prompts(engine, [20], seed=14)[0]
    want = alone(engine, prompt, greedy(5)).token_ids
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=2, context_length=512, step_rows=64)
    futures = [sched.submit(prompt, greedy(5)) for _ in range(3)]
    while sched.step():
        pass
    assert [f.result(timeout=0).token_ids for f in futures] == [want] * 3


def test_prompt_reading_is_reported_chunk_by_chunk(engine):
    prompt = random_prompts(engine, [100], seed=15)[0]
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=2, context_length=512, step_rows=32)
    seen, at_step = [], []

    def progress(read, total):
        seen.append((read, total))
        at_step.append(sched.steps)

    first = sched.submit(prompt, greedy(3), on_prompt_progress=progress)
    while sched.step():
        pass
    assert first.result().stats.reused_tokens == 0
    assert seen == [(0, 100), (32, 100), (64, 100), (96, 100), (100, 100)]
    assert at_step == [0, 1, 2, 3, 4]  # when it joined, then after each chunk's step
    again = sched.submit(prompt, greedy(3), on_prompt_progress=lambda read, total: seen.append((read, total)))
    while sched.step():
        pass
    # the next request reuses the slot's KV: only the last prompt token is read (for its logits)
    assert again.result().stats.reused_tokens == 99 and seen[5:] == [(0, 1), (1, 1)]


# ----------------------------------------------------------------------------- one pool for every sequence

def _system_prompts(engine, n: int, system: int, own: int, seed: int) -> list[EncodedPrompt]:
    """n prompts that open with the same `system` tokens, then `own` tokens of their own."""
    g = torch.Generator().manual_seed(seed)
    vocab = engine.tokenizer.vocab_size
    shared = [engine.tokenizer.bos_id] + torch.randint(1000, vocab, (system - 1,), generator=g).tolist()
    return [EncodedPrompt(shared + torch.randint(1000, vocab, (own,), generator=g).tolist()) for _ in range(n)]


def test_a_pool_of_8_slots_runs_32_conversations_at_once_their_system_prompt_stored_once(engine):
    # llama-server -np 8 -c 4096 gives 8 slots of 512; the same KV as blocks holds 32
    # conversations of 102 positions together (scaled to the tiny model's 512-token context)
    pool = new_pool(engine.model, 8 * 512, capture_graphs=False)
    prompts = _system_prompts(engine, 32, system=64, own=30, seed=21)
    want = [alone(engine, p, greedy(8)).token_ids for p in prompts]
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=32, priority_slots=0, pool=pool, context_length=512,
                           step_rows=4096, gather_s=0.0)
    seen = {"rows": 0, "shared": 0, "held": 0}
    inner = engine.model.forward_batch

    def spy(embeds, groups, logits_of):
        if len(groups) >= seen["rows"]:  # the last of the widest steps: decoding, every prompt read
            seen["rows"] = len(groups)
            caches = [c for c, _, _ in groups]
            first = caches[0].blocks[:2]  # the system prompt's two blocks
            seen["shared"] = sum(c.blocks[:2] == first for c in caches)
            seen["held"] = len({b for c in caches for b in c.blocks})
        return inner(embeds, groups, logits_of)

    engine.model.forward_batch = spy
    try:
        futures = [sched.submit(p, greedy(8)) for p in prompts]
        while sched.step():
            pass
    finally:
        del engine.model.forward_batch
    assert [f.result(timeout=0).token_ids for f in futures] == want
    assert seen["rows"] == 32 and sched.preempted == 0  # all 32 decoded in the same steps
    assert seen["shared"] == 32  # one copy of the system prompt's blocks for every conversation
    assert seen["held"] <= 2 + 32 * 2  # and two blocks of their own each
    # read in the same first step, the copies of the system prompt's blocks were given back for the first's
    assert pool.in_use() == 0 and pool.named() >= 2


def test_a_pool_too_small_for_everyone_preempts_and_the_output_is_unchanged(engine):
    pool = new_pool(engine.model, 12 * 32, capture_graphs=False)  # 12 blocks for 6 sequences of 3 each
    prompts = random_prompts(engine, [40, 52, 45, 60, 38, 50], seed=22)
    want = [alone(engine, p, greedy(40)).token_ids for p in prompts]
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=6, priority_slots=0, pool=pool, context_length=512,
                           step_rows=512, gather_s=0.0)
    futures = [sched.submit(p, greedy(40)) for p in prompts]
    while sched.step():
        pass
    assert [f.result(timeout=0).token_ids for f in futures] == want
    assert sched.preempted > 0 and pool.in_use() == 0


def test_a_prompt_longer_than_the_pool_is_refused_in_words(engine):
    pool = new_pool(engine.model, 128, capture_graphs=False)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=2, priority_slots=0, pool=pool, context_length=512)
    with pytest.raises(EngineError, match=r"200 tokens \(needs 201 positions with the reply\), more than the context length of 128"):
        sched.submit(random_prompts(engine, [200], seed=23)[0], greedy(4))


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_chat_evicted_to_host_memory_or_disk_comes_back_exactly(engine, tier, tmp_path):
    """Chat A's blocks are pushed out of a small pool by other chats (into host copies, or only
    files), and A's next turn reads them back: as much reused as A left, the same greedy output
    as the turn run cold."""
    from tramontane.engine.runtime.prefix_cache import PrefixCache
    from tramontane.engine.runtime.prefix_disk import PrefixDisk, block_layout

    pool = new_pool(engine.model, 8 * 32, capture_graphs=False)  # 8 blocks: one chat of ~100 positions at a time
    disk = PrefixDisk(tmp_path / "kv", "test-model", block_layout(pool)) if tier == "disk" else None
    host = PrefixCache(1 << 30 if tier == "host" else 0, disk=disk)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=1, priority_slots=0, pool=pool, context_length=256,
                           prefix_cache=host, gather_s=0.0)

    def run(prompt, n):
        future = sched.submit(prompt, greedy(n))
        while sched.step():
            pass
        return future.result(timeout=0)

    a1 = random_prompts(engine, [90], seed=31)[0]
    first = run(a1, 6)
    for other in random_prompts(engine, [150, 150, 150], seed=32):  # more than the pool: A's blocks spill
        run(other, 4)
    # A's blocks after its first are gone from the pool (the first is every prompt's: its BOS keeps it in use)
    assert all(pool.find(h) is None for h in block_hashes_of(a1)[1:])
    if disk is not None:
        disk.flush()
    a2 = EncodedPrompt(a1.ids + first.token_ids[:-1] + random_prompts(engine, [12], seed=33)[0].ids[1:])
    again = run(a2, 6)
    kept = len(a1.ids) + len(first.token_ids) - 1
    assert again.stats.reused_tokens >= kept // 32 * 32 > 0  # whole blocks, at least, back from the tier
    assert again.token_ids == alone(engine, a2, greedy(6)).token_ids
    host.close()


def block_hashes_of(prompt: EncodedPrompt) -> list[bytes]:
    from tramontane.engine.runtime.prefix_cache import block_hashes
    from tramontane.engine.runtime.prefix_keys import position_keys

    return block_hashes(position_keys(prompt.ids, prompt.image_spans))
