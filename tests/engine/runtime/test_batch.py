"""The continuous-batching scheduler: every sequence of a batch gets what it gets alone.

The reference for each sequence is the same request run alone by LocalEngine (prefill, then one
decode step a token: the path tied to HF and llama.cpp by other tests). Sequences of different
lengths join and leave mid-way, prompts are read in chunks between decode rows, with and
without images; a priority request overtakes; a second conversation reuses a known system
prompt from the shared prefix cache; a generated reply comes back with its exact ids."""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from PIL import Image

from tramontane.engine.api import ChatMessage, EngineError, ImagePart, SamplingParams
from tramontane.engine.mistral3.chat_format import EncodedPrompt, encode_chat
from tramontane.engine.runtime.batch import BatchedEngine, BatchScheduler
from tramontane.engine.runtime.prefix_cache import BLOCK_TOKENS

from support.scripted import ScriptedLogits
from support import FIXTURES
from support.engines import local_engine_fixture
from support.batch_runs import Recorder, alone, greedy, random_prompts

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"


engine = local_engine_fixture(MODEL, MMPROJ, context_length=512)


def photo(seed: int, size=(56, 42)) -> ImagePart:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (size[1] // 7, size[0] // 7, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize(size, Image.BILINEAR).save(buf, "PNG")
    return ImagePart(buf.getvalue(), f"photo{seed}.png")


@pytest.mark.parametrize("n_seqs", [1, 3, 8])
def test_sequences_joining_and_leaving_get_their_tokens_alone(engine, n_seqs):
    lengths = [7, 150, 33, 2, 90, 18, 61, 120][:n_seqs]
    budgets = [9, 14, 5, 20, 11, 7, 16, 12][:n_seqs]
    prompts = random_prompts(engine, lengths, seed=n_seqs)
    expected = [alone(engine, p, greedy(n)).token_ids for p, n in zip(prompts, budgets)]
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=8, context_length=512, step_rows=24)
    rec = Recorder(engine.model)
    try:
        futures = []
        for i, (p, n) in enumerate(zip(prompts, budgets)):
            futures.append(sched.submit(p, greedy(n)))
            for _ in range(i % 3 + 1):  # the next one joins 1-3 steps later, mid-way
                sched.step()
        while sched.step():
            pass
    finally:
        rec.close()
    for i, (f, want) in enumerate(zip(futures, expected)):
        got = f.result(timeout=0)
        assert got.token_ids == want, i
        assert got.finish_reason == "length"
        assert got.stats.prompt_tokens == len(prompts[i].ids)
    assert max(sum(s) for s in rec.steps) <= 24 + n_seqs
    if n_seqs > 1:  # prompt chunks ran next to decode rows: streams kept flowing
        assert any(1 in s and max(s) > 1 for s in rec.steps)
        assert max(len(s) for s in rec.steps) >= min(n_seqs, 3)


def test_eos_stop_strings_and_sampling_settings_per_sequence(engine):
    prompts = random_prompts(engine, [12, 40, 25], seed=9)
    settings = [SamplingParams(max_tokens=30, temperature=0.0),  # until EOS or 30
                SamplingParams(max_tokens=25, temperature=0.9, top_k=40, seed=1234, ignore_eos=True),
                SamplingParams(max_tokens=25, temperature=0.0, repetition_penalty=1.3, ignore_eos=True)]
    expected = [alone(engine, p, s) for p, s in zip(prompts, settings)]
    text = expected[2].text
    stop = text[len(text) // 2: len(text) // 2 + 3] if len(text) > 6 else None
    if stop:
        settings[2].stop = [stop]
        expected[2] = alone(engine, prompts[2], settings[2])
    # log-probabilities, and a logits processor (a scripted reply, as a grammar's mask would steer it)
    prompts += random_prompts(engine, [17, 8], seed=10)
    script = ScriptedLogits([900, 901, 1500, 77], engine.tokenizer.eos_id)
    settings += [SamplingParams(max_tokens=10, temperature=0.0, logprobs=3, ignore_eos=True),
                 SamplingParams(max_tokens=10, temperature=0.0, logits_processors=(script,))]
    expected += [alone(engine, p, s) for p, s in zip(prompts[3:], settings[3:])]
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=4, context_length=512, step_rows=16)
    pieces = [[] for _ in prompts]
    futures = [sched.submit(p, s, on_piece=pieces[i].append) for i, (p, s) in enumerate(zip(prompts, settings))]
    while sched.step():
        pass
    for i, (f, want) in enumerate(zip(futures, expected)):
        got = f.result(timeout=0)
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason), i
        assert "".join(pieces[i]) == want.text
    assert expected[4].token_ids == [900, 901, 1500, 77] and expected[4].finish_reason == "stop"
    got, want = futures[3].result().logprobs, expected[3].logprobs
    assert [(x.token_id, [a.token_id for a in x.top]) for x in got] == [(x.token_id, [a.token_id for a in x.top]) for x in want]
    assert max(abs(x.logprob - y.logprob) for x, y in zip(got, want)) < 1e-4


def test_images_are_encoded_outside_the_step_and_replies_match_alone(engine):
    convs = [
        [ChatMessage("user", [photo(1), "What is in this picture?"])],
        [ChatMessage.text("system", "Be brief."), ChatMessage.text("user", "Tell me about the wind.")],
        [ChatMessage("user", ["Compare", photo(2, (84, 56)), "and", photo(3)])],
        [ChatMessage("user", [photo(1), "And now in one word?"])],  # the first picture again
    ]
    params = greedy(12)
    expected = [engine.chat(c, params, session_key=f"img-{i}") for i, c in enumerate(convs)]
    sched = BatchScheduler(engine.model, engine.tokenizer, engine.vision, slots=4, context_length=512,
                           step_rows=20).start()
    batched = BatchedEngine(engine, sched)
    threads_seen = []
    inner = engine.vision.encode_image_parts

    def spy(images):
        threads_seen.append(threading.current_thread().name)
        return inner(images)

    engine.vision.encode_image_parts = spy
    try:
        results = [None] * len(convs)

        def ask(i):
            results[i] = batched.chat(convs[i], params)

        workers = [threading.Thread(target=ask, args=(i,)) for i in range(len(convs))]
        for t in workers:
            t.start()
        for t in workers:
            t.join(60)
    finally:
        del engine.vision.encode_image_parts
        sched.close()
    for i, (got, want) in enumerate(zip(results, expected)):
        assert got is not None and got.token_ids == want.token_ids, i
        assert got.prompt_token_ids == want.prompt_token_ids
    assert threads_seen and "tramontane-batch" not in threads_seen


def test_a_priority_request_overtakes_the_queue_and_reads_its_prompt_first(engine):
    prompts = random_prompts(engine, [30, 30, 30, 60], seed=4)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=2, priority_slots=1, context_length=512,
                           step_rows=32)
    order = []
    futures = [sched.submit(p, greedy(40)) for p in prompts[:3]]
    for f, name in zip(futures, "abc"):
        f.add_done_callback(lambda _, name=name: order.append(name))
    for _ in range(3):
        sched.step()  # a and b decode; c waits for a slot
    assert sched.active == 2
    rec = Recorder(engine.model)
    try:
        window = sched.submit(prompts[3], greedy(5), priority=True)
        window.add_done_callback(lambda _: order.append("window"))
        sched.step()
        # the window's reply joined at once (its own slot) and its prompt was read alone (the
        # streams paused for that step), a whole chunk, before c's
        assert rec.steps[0] == [32]
        while sched.step():
            pass
        assert rec.steps[1] == [28] and rec.steps[2] == [1, 1, 1]  # then everyone decodes again
    finally:
        rec.close()
    assert order.index("window") < order.index("c")
    assert order[0] == "window"
    assert window.result().token_ids == alone(engine, prompts[3], greedy(5)).token_ids
    assert futures[2].result().token_ids == alone(engine, prompts[2], greedy(40)).token_ids


def test_cancel_stops_one_sequence_and_leaves_the_others_alone(engine):
    prompts = random_prompts(engine, [20, 45, 10], seed=6)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=3, context_length=512, step_rows=16)
    cancel = threading.Event()
    futures = [sched.submit(p, greedy(15), cancel=cancel if i == 1 else None) for i, p in enumerate(prompts)]
    left = threading.Event()
    waiting = sched.submit(prompts[0], greedy(15), cancel=left)  # no slot for it yet
    for _ in range(6):
        sched.step()
    left.set()
    sched.step()
    assert waiting.done() and waiting.result().finish_reason == "cancelled"  # dropped while it waited
    assert waiting.result().token_ids == []
    cancel.set()
    while sched.step():
        pass
    cut = futures[1].result()
    assert cut.finish_reason == "cancelled" and len(cut.token_ids) < 15
    for i in (0, 2):
        assert futures[i].result().token_ids == alone(engine, prompts[i], greedy(15)).token_ids


def test_a_known_system_prompt_is_reused_by_a_new_conversation(engine):
    system = ChatMessage.text("system", "You are a careful assistant. " * 12)
    a = [system, ChatMessage.text("user", "First question?")]
    b = [system, ChatMessage.text("user", "Something else entirely.")]
    sched = BatchScheduler(engine.model, engine.tokenizer, engine.vision, slots=2, context_length=512,
                           step_rows=64)
    batched = BatchedEngine(engine, sched)
    fa = sched.submit(batched.encode(a), greedy(20))
    for _ in range(3):
        sched.step()  # a's prompt is read in chunks (its blocks stored as they fill); a decodes in its slot
    fb = sched.submit(batched.encode(b), greedy(8))  # a still holds its slot: b gets the other one
    while sched.step():
        pass
    ra, rb = fa.result(), fb.result()
    shared = next(i for i, (x, y) in enumerate(zip(ra.prompt_token_ids, rb.prompt_token_ids)) if x != y)
    assert ra.stats.reused_tokens == 0
    assert rb.stats.reused_tokens == shared // BLOCK_TOKENS * BLOCK_TOKENS > 0
    assert rb.stats.prefilled_tokens == len(rb.prompt_token_ids) - rb.stats.reused_tokens
    assert rb.token_ids == engine.chat(b, greedy(8), session_key="sys-b").token_ids


def test_the_next_turn_reuses_the_reply_with_its_exact_ids(engine):
    sched = BatchScheduler(engine.model, engine.tokenizer, engine.vision, slots=2, context_length=512,
                           step_rows=64)
    batched = BatchedEngine(engine, sched)
    turn1 = [ChatMessage.text("user", "Write something.")]
    params = SamplingParams(max_tokens=16, temperature=0.0)
    f1 = sched.submit(batched.encode(turn1), params)
    while sched.step():
        pass
    r1 = f1.result()
    assert engine.tokenizer.decode(r1.token_ids) == r1.text  # remembered: its text says exactly these ids
    turn2 = turn1 + [ChatMessage.text("assistant", r1.text), ChatMessage.text("user", "More.")]
    prompt2 = batched.encode(turn2)
    n1 = len(r1.prompt_token_ids)
    assert prompt2.ids[:n1 + len(r1.token_ids)] == r1.prompt_token_ids + r1.token_ids
    f2 = sched.submit(prompt2, params)
    while sched.step():
        pass
    r2 = f2.result()
    in_cache = n1 + len(r1.token_ids) - (1 if r1.finish_reason == "length" else 0)
    assert r2.stats.reused_tokens == in_cache  # everything the first turn left, nothing re-read
    assert r2.token_ids == alone(engine, prompt2, params).token_ids


def test_a_short_shared_opening_does_not_take_another_conversations_slot(engine):
    """A slot's cached prefix wins a request only if it covers at least half of its prompt
    (llama-server's --slot-prompt-similarity 0.5): two conversations that share only their first
    few tokens each keep their own slot while another is free, so each one's next turn reuses
    its own KV instead of reading it again."""
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=3, priority_slots=0, context_length=512,
                           step_rows=64)
    batched = BatchedEngine(engine, sched)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    def run(messages):
        future = sched.submit(batched.encode(messages), params)
        while sched.step():
            pass
        return future.result()

    firsts = [[ChatMessage.text("user", f"Client {c} asks about topic number {c * 7}.")] for c in range(2)]
    replies = [run(first) for first in firsts]  # client 1 shares "[INST]Client" with client 0's slot
    for first, r1 in zip(firsts, replies):
        second = first + [ChatMessage.text("assistant", r1.text), ChatMessage.text("user", "And?")]
        r2 = run(second)
        assert r2.stats.reused_tokens >= len(r1.prompt_token_ids), "its first turn was overwritten"


def test_refusals_in_words(engine):
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=1, context_length=64)
    with pytest.raises(EngineError, match="more than the context length of 64"):
        sched.submit(EncodedPrompt(list(range(3, 80))), greedy(4))
    with pytest.raises(EngineError, match="bad sampling settings"):
        sched.submit(EncodedPrompt([1, 5]), SamplingParams(top_p=0))
    with pytest.raises(EngineError, match="no vision projector"):
        prompt = encode_chat(engine.tokenizer, [ChatMessage("user", [photo(1), "hi"])], engine.vision.grid)
        sched.submit(prompt, greedy(4))
    sched.close()
    with pytest.raises(EngineError, match="closed"):
        sched.submit(EncodedPrompt([1, 5]), greedy(4))


def test_a_scored_prompt_beside_decoding_streams_gets_the_log_probabilities_of_one_pass(engine):
    """prompt_logprobs (perplexity's windows, a completion's echo): read in 32-row chunks between
    two streams' decode rows, and whole even when the slot holds its prefix; each token's
    log-probability equals log_softmax of one forward pass over the prompt (float32 rounding)."""
    import torch

    prompts = random_prompts(engine, [40, 25, 150], seed=9)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=3, priority_slots=0, context_length=512,
                           step_rows=32)
    streams = [sched.submit(p, greedy(30)) for p in prompts[:2]]
    for _ in range(3):
        sched.step()
    scored_params = SamplingParams(max_tokens=0, temperature=0.0, prompt_logprobs=True)
    first = sched.submit(prompts[2], scored_params)
    rec = Recorder(engine.model)
    try:
        while sched.step():
            pass
    finally:
        rec.close()
    assert any(len(groups) == 3 for groups in rec.steps)  # read beside the two streams
    ids = prompts[2].ids
    want = torch.log_softmax(engine.model.logits(ids, all_logits=True), dim=-1)[:-1].gather(
        1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    got = first.result().prompt_logprobs
    assert len(got) == len(ids) - 1 and first.result().token_ids == []
    torch.testing.assert_close(torch.tensor(got), want, rtol=0, atol=2e-5)
    again = sched.submit(prompts[2], scored_params)  # the slot holds the prompt: read whole anyway
    while sched.step():
        pass
    assert again.result().stats.reused_tokens == 0
    torch.testing.assert_close(torch.tensor(again.result().prompt_logprobs), want, rtol=0, atol=2e-5)
    assert all(f.result().finish_reason == "length" for f in streams)
