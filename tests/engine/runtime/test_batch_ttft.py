"""Time to first token under continuous batching: a burst of clients is read in one step (the
requests the server has taken are announced, and a new prompt's step waits a little for them;
those queued while a step is set up join it); a request that arrives while streams decode gets
its first token at the end of the next step, drawn before the streams' tokens; prompts being
read share a step (the oldest always advances, the rest goes to the closest to a first token);
neither a lone request nor the window's priority lane waits for anyone. Replies stay what each
request gets alone (the reference: LocalEngine's own prefill and decode, tied to HF and
llama.cpp by other tests)."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from tramontane.engine.api import SamplingParams
from tramontane.engine.runtime.batch import BatchedEngine, BatchScheduler
from tramontane.engine.server.executor import BatchExecutor

from support import FIXTURES
from support.engines import local_engine_fixture
from support.batch_runs import Recorder, alone, greedy, random_prompts

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"


engine = local_engine_fixture(MODEL, context_length=512)


def eventually(condition, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.01)


def test_a_burst_of_announced_requests_is_read_in_one_step(engine):
    prompts = random_prompts(engine, [21, 9, 30], seed=31)
    expected = [alone(engine, p, greedy(6)).token_ids for p in prompts]
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=128,
                           gather_s=30.0)  # bounded by the arrivals here, not by the clock
    arrivals = [sched.arrival() for _ in prompts]  # three requests taken by the server
    rec = Recorder(engine.model)
    sched.start()
    try:
        first = sched.submit(prompts[0], greedy(6))
        arrivals[0].done()
        time.sleep(0.3)  # the others are still being encoded: the first must not be read alone
        assert rec.steps == []
        later = []
        for p, a in zip(prompts[1:], arrivals[1:]):
            later.append(sched.submit(p, greedy(6)))
            a.done()
        results = [f.result(timeout=60) for f in [first, *later]]
    finally:
        sched.close()
        rec.close()
    assert rec.steps[0] == [21, 9, 30]  # one step read the whole burst
    assert all(s == [1, 1, 1] for s in rec.steps[1:])
    assert [r.token_ids for r in results] == expected


def test_a_request_queued_while_the_step_is_set_up_joins_it(engine):
    prompts = random_prompts(engine, [17, 12], seed=32)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=128,
                           gather_s=0.0)
    second = []

    def queue_another(read, total):  # on the step's thread, while the first is being admitted
        if not second:
            second.append(sched.submit(prompts[1], greedy(4)))

    rec = Recorder(engine.model)
    try:
        first = sched.submit(prompts[0], greedy(4), on_prompt_progress=queue_another)
        while sched.step():
            pass
    finally:
        rec.close()
    assert rec.steps[0] == [17, 12]
    assert first.result().token_ids == alone(engine, prompts[0], greedy(4)).token_ids
    assert second[0].result().token_ids == alone(engine, prompts[1], greedy(4)).token_ids


def test_a_request_arriving_mid_stream_gets_its_first_token_from_the_next_step(engine):
    prompts = random_prompts(engine, [40, 25], seed=33)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=64)
    stream_pieces, new_pieces = [], []
    stream = sched.submit(prompts[0], greedy(30), on_piece=stream_pieces.append)
    for _ in range(5):
        sched.step()
    assert not stream.done()
    new = sched.submit(prompts[1], greedy(1), on_piece=new_pieces.append)
    sched.step()
    # its prompt was read beside the stream's decode row, and its token sampled then
    assert new.done() and len(new.result().token_ids) == 1
    assert new.result().token_ids == alone(engine, prompts[1], greedy(1)).token_ids
    while sched.step():
        pass
    assert stream.result().token_ids == alone(engine, prompts[0], greedy(30)).token_ids


def test_a_lone_request_and_the_window_do_not_wait_for_announced_ones(engine):
    prompts = random_prompts(engine, [15, 15], seed=34)
    gather_s = 1.5  # far above a step of the tiny model, even on a busy machine
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=2, priority_slots=1, context_length=512,
                           gather_s=gather_s)
    # nothing announced: the step starts at once
    sched.submit(prompts[0], greedy(1))
    t0 = time.perf_counter()
    sched.step()
    assert time.perf_counter() - t0 < gather_s / 2
    # announced but never queued (its encoding is slow): waited for at most gather_s
    late = sched.arrival()
    sched.submit(prompts[1], greedy(1))
    t0 = time.perf_counter()
    sched.step()
    assert gather_s <= time.perf_counter() - t0 < 3 * gather_s
    # the window's prompt is read alone, at once, whatever is announced
    window = sched.submit(prompts[0], greedy(1), priority=True)
    t0 = time.perf_counter()
    sched.step()
    assert time.perf_counter() - t0 < gather_s / 2 and window.done()
    late.done()
    late.done()  # idempotent
    assert sched.arriving == 0


def test_a_server_job_that_never_generates_is_not_waited_for(engine):
    executor = BatchExecutor(engine, slots=2, workers=1)
    try:
        release = threading.Event()
        blocking = executor.submit(lambda e: release.wait(30))
        queued = executor.submit(lambda e: e.complete([1, 2, 3], greedy(1)))
        assert executor.scheduler.arriving == 2
        assert queued.cancel()  # its client left before it ran
        failing = executor.submit(lambda e: 1 / 0)
        release.set()
        blocking.result(timeout=30)
        with pytest.raises(ZeroDivisionError):
            failing.result(timeout=30)
        eventually(lambda: executor.scheduler.arriving == 0)  # the done callbacks run after result()
        prompt = random_prompts(engine, [8], seed=36)[0]
        reply = executor.submit(lambda e: e.complete(prompt.ids, greedy(2))).result(timeout=60)
        assert reply.token_ids == alone(engine, prompt, greedy(2)).token_ids
        eventually(lambda: executor.scheduler.arriving == 0)
    finally:
        executor.shutdown()


def test_the_choices_of_a_job_release_its_announcement(engine):
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=3, context_length=512).start()
    try:
        job_engine = BatchedEngine(engine, sched).for_job()
        assert sched.arriving == 1
        prompt = random_prompts(engine, [11], seed=35)[0]
        results = job_engine.run_together(lambda e, i: e.generate_from(prompt, greedy(3)), 2)
        assert sched.arriving == 0
        assert results[0].token_ids == results[1].token_ids == alone(engine, prompt, greedy(3)).token_ids
    finally:
        sched.close()


def test_a_short_prompt_behind_a_long_one_is_read_in_the_next_step(engine):
    prompts = random_prompts(engine, [200, 10, 12], seed=37)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=32)
    rec = Recorder(engine.model)
    try:
        long = sched.submit(prompts[0], greedy(3))
        sched.step()
        sched.step()
        short = sched.submit(prompts[1], greedy(1))
        sched.step()
        # the short one's whole prompt and its first token in the step after it came; the long
        # one kept reading in that step with the rest of the budget
        assert short.done() and rec.steps[2] == [22, 10]
        other = sched.submit(prompts[2], greedy(2))
        sched.step()
        # in arrival order; the long one gets what the short leaves (the new one's BOS is the first
        # short one's, named in the pool when that one ended: 11 rows of its 12 to read)
        assert rec.steps[3] == [21, 11]
        while sched.step():
            pass
    finally:
        rec.close()
    assert sum(n for step in rec.steps for n in step if n > 1) == 200 + 10 + 12 - 1  # each prompt read once (the third's BOS was known)
    for f, p, n in ((long, prompts[0], 3), (short, prompts[1], 1), (other, prompts[2], 2)):
        assert f.result().token_ids == alone(engine, p, greedy(n)).token_ids


def test_the_oldest_prompt_advances_and_the_rest_goes_to_the_closest_to_its_first_token(engine):
    prompts = random_prompts(engine, [100, 90, 80], seed=38)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=60)
    rec = Recorder(engine.model)
    try:
        futures = [sched.submit(p, greedy(2)) for p in prompts]
        while sched.step():
            pass
    finally:
        rec.close()
    # the oldest gets its third of the step, the one with the fewest rows left the rest
    assert rec.steps[:2] == [[20, 40], [20, 40]]  # the 80-row prompt's first token after two steps
    assert rec.steps[2] == [1, 60]  # its second token; the oldest, now also the closest, read to its end
    assert rec.steps[3] == [1, 60]  # the oldest's second token; the 90-row one alone, a whole step
    for f, p in zip(futures, prompts):
        assert f.result().token_ids == alone(engine, p, greedy(2)).token_ids


def test_a_burst_too_big_for_one_step_finishes_all_but_the_last_in_it(engine):
    prompts = random_prompts(engine, [17] * 8, seed=39)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=8, context_length=512, step_rows=128)
    rec = Recorder(engine.model)
    try:
        futures = [sched.submit(p, greedy(1)) for p in prompts]
        sched.step()
        assert rec.steps[0] == [17] * 7 + [9] and sum(f.done() for f in futures) == 7
        while sched.step():
            pass
    finally:
        rec.close()
    for f, p in zip(futures, prompts):
        assert f.result().token_ids == alone(engine, p, greedy(1)).token_ids


def test_a_new_requests_first_token_is_drawn_before_the_streams_tokens(engine, monkeypatch):
    from tramontane.engine.runtime import batch

    prompts = random_prompts(engine, [12, 14, 9], seed=40)
    sampled = SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    streams = [dataclasses.replace(sampled, seed=i) for i in range(2)]
    new = dataclasses.replace(sampled, seed=99, max_tokens=2)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512)
    futures = [sched.submit(p, params) for p, params in zip(prompts[:2], streams)]
    sched.step()
    sched.step()
    drawn = []
    inner = batch.draw_token

    def spy(logits, params, *args):
        drawn.append(params)
        return inner(logits, params, *args)

    monkeypatch.setattr(batch, "draw_token", spy)
    late = sched.submit(prompts[2], new)
    sched.step()  # the two streams' rows and the new prompt in one step
    assert drawn[0] is new and drawn[1:] == streams
    while sched.step():
        pass
    monkeypatch.undo()
    for f, p, params in zip((*futures, late), prompts, (*streams, new)):
        assert f.result().token_ids == alone(engine, p, params).token_ids


def test_server_jobs_are_announced_when_taken_so_a_slow_to_encode_burst_is_read_together(engine):
    prompts = random_prompts(engine, [13, 19, 8], seed=41)
    engine.pool.forget_all()  # no earlier test's blocks (their BOS would be reused)
    executor = BatchExecutor(engine, slots=4, gather_s=30.0)
    rec = Recorder(engine.model)
    try:
        def job(prompt, encoding_s):
            def run(e):
                time.sleep(encoding_s)  # a long conversation being encoded
                return e.complete(prompt.ids, greedy(3))
            return run

        futures = [executor.submit(job(p, delay)) for p, delay in zip(prompts, (0.0, 0.3, 0.5))]
        results = [f.result(timeout=60) for f in futures]
    finally:
        rec.close()
        executor.shutdown()
    assert rec.steps[0] == [13, 19, 8]
    for r, p in zip(results, prompts):
        assert r.token_ids == alone(engine, p, greedy(3)).token_ids
