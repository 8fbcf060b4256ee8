"""The batch scheduler's shared work: requests with one prompt (a request's `n` choices) read it
once and decode as rows of the same steps; a prompt's reading is reported chunk by chunk; on a
GPU the slots are carved out of the engine's planned KV instead of beside it.

The reference for every sequence is the same request run alone by LocalEngine (the path tied to
HF and llama.cpp by other tests)."""
from __future__ import annotations

import threading
import time

import pytest

from tramontane.engine.api import EngineError, SamplingParams
from tramontane.engine.runtime.batch import BatchedEngine, BatchScheduler, carve_kv, planned_slot_sizes
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


# ----------------------------------------------------------------------------- the planned KV, shared

def test_carved_slots_are_the_engines_planned_kv_and_give_what_alone_gives():
    engine = LocalEngine(MODEL, device="cpu", context_length=512)
    try:
        planned = engine.plan.placements[0].kv
        assert engine.cache.nbytes == planned  # the one context the plan counted
        caches = carve_kv(engine.cache, [256, 256])
        assert [c.capacity for c in caches] == [256, 256]
        assert sum(c.nbytes for c in caches) == planned  # all of it, and no byte more
        for part in range(len(engine.cache.ks)):
            for whole, pieces in ((engine.cache.ks[part], [c.ks[part] for c in caches]),
                                  (engine.cache.vs[part], [c.vs[part] for c in caches])):
                lo, hi = whole.data_ptr(), whole.data_ptr() + whole.numel() * whole.element_size()
                spans = sorted((p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in pieces)
                assert all(p.is_contiguous() for p in pieces)
                assert spans[0][0] == lo and spans[-1][1] == hi and spans[0][1] <= spans[1][0]  # disjoint, inside
        prompts = random_prompts(engine, [60, 25], seed=16)
        want = [alone(engine, p, greedy(7)).token_ids for p in prompts]
        sched = BatchScheduler(engine.model, engine.tokenizer, slots=1, priority_slots=1, caches=carve_kv(engine.cache, [256, 256]),
                               step_rows=64)
        futures = [sched.submit(prompts[0], greedy(7)), sched.submit(prompts[1], greedy(7), priority=True)]
        while sched.step():
            pass
        assert [f.result(timeout=0).token_ids for f in futures] == want
        assert sched.context_size == 256
    finally:
        engine.close()


def test_too_many_slots_for_the_planned_context_are_refused_in_words():
    engine = LocalEngine(MODEL, device="cpu", context_length=512)
    try:
        with pytest.raises(EngineError) as info:
            carve_kv(engine.cache, planned_slot_sizes(512, 3))
        words = str(info.value)
        assert "3 sequences at once would get 170 tokens of context each" in words
        assert "serve fewer at once or raise the context length" in words
        assert str(MODEL.parent) not in words
    finally:
        engine.close()


def test_the_kept_slots_get_half_of_the_planned_context_and_the_lanes_their_own_limit():
    assert planned_slot_sizes(4096, 8) == [512] * 8  # serve -np 8: a llama-server -np 8 -c 4096 split
    assert planned_slot_sizes(4096, 8, 1) == [256] * 8 + [2048]  # the window's own replies keep half
    engine = LocalEngine(MODEL, device="cpu", context_length=512)
    try:
        sizes = planned_slot_sizes(512, 2, 1)
        assert sizes == [128, 128, 256]
        sched = BatchScheduler(engine.model, engine.tokenizer, slots=2, priority_slots=1, step_rows=128,
                               caches=carve_kv(engine.cache, sizes, min_context=64))
        long_prompt = random_prompts(engine, [200], seed=17)[0]
        with pytest.raises(EngineError, match=r"200 tokens \(needs 201 positions with the reply\), more than the context length of 128"):
            sched.submit(long_prompt, greedy(4))
        want = alone(engine, long_prompt, greedy(4)).token_ids
        sched = BatchScheduler(engine.model, engine.tokenizer, slots=2, priority_slots=1, step_rows=128,
                               caches=carve_kv(engine.cache, sizes, min_context=64))
        window = sched.submit(long_prompt, greedy(4), priority=True)  # only the kept slot holds it
        while sched.step():
            pass
        assert window.result(timeout=0).token_ids == want
        assert window.result().stats.context_size == 256
    finally:
        engine.close()


def test_on_a_simulated_gpu_the_slots_add_up_to_the_kv_the_plan_counted():
    # The planner's accounting for a GPU (a simulated machine, as test_runtime_memory's): the
    # carved slots hold no more positions than the one context whose KV it counted there.
    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.runtime import memory
    from tramontane.engine.runtime.device_map import Budget, DeviceInfo, Machine, plan_devices, sizes_of_files

    with open_gguf(MODEL) as gf:
        sizes = sizes_of_files(gf)
    plan = plan_devices(sizes, Machine((DeviceInfo("cuda:0", 8 << 30),), DeviceInfo("cpu", 64 << 30)), Budget(512))
    (gpu,) = [p for p in plan.placements if p.device.kind == "cuda"]
    assert len(gpu.layers) == sizes.n_layers
    per_position = memory.kv_bytes(1, sizes.kv_width, sizes.n_layers, 2)  # bf16 on a GPU
    assert gpu.kv == plan.context_length * per_position
    for slots, kept in ((8, 0), (3, 0), (8, 1), (2, 1)):
        assert sum(planned_slot_sizes(plan.context_length, slots, kept)) * per_position <= gpu.kv
