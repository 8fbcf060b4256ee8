"""KV prefix reuse across turns: what is reused, what is prefilled, and that reuse never changes
the answer (logits equal a cold run on the whole prompt)."""
import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

from tramontane.engine.api import ChatMessage, EngineError, ImagePart, SamplingParams
from tramontane.engine.runtime.local import LocalEngine

from support import FIXTURES
from support.batch_runs import PrefillSpy
from support.engines import local_engine_fixture
MODEL = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
MMPROJ = os.path.join(FIXTURES, "mmproj-mistral3_tiny-f32.gguf")
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def png(seed: int, size=(70, 50)) -> ImagePart:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return ImagePart(buf.getvalue(), f"noise{seed}.png")


engine = local_engine_fixture(MODEL, MMPROJ, context_length=1024)


def cold_logits(engine, messages):
    prompt = engine.encode(messages)
    return engine.model.forward(engine.prompt_rows(prompt), 0, None)


def turn(engine, messages, key="chat"):
    with PrefillSpy(engine) as spy:
        result = engine.chat(messages, GREEDY, session_key=key)
    start, rows, logits = spy.prefill
    return result, start, rows, logits


def test_second_turn_prefills_only_the_new_tokens(engine):
    m1 = [ChatMessage.text("system", "Be brief."), ChatMessage.text("user", "Hello there, how are you?")]
    r1, start, rows, _ = turn(engine, m1, "t2")
    assert start == 0 and rows == len(r1.prompt_token_ids) and r1.stats.reused_tokens == 0
    m2 = m1 + [ChatMessage.text("assistant", r1.text), ChatMessage.text("user", "And the weather?")]
    r2, start, rows, logits = turn(engine, m2, "t2")
    p1, p2 = r1.prompt_token_ids, r2.prompt_token_ids
    assert p2[: len(p1)] == p1
    assert r2.stats.reused_tokens >= len(p1)
    assert start == r2.stats.reused_tokens and rows == len(p2) - start == r2.stats.prefilled_tokens
    torch.testing.assert_close(logits, cold_logits(engine, m2), rtol=0, atol=1e-5)


def test_regenerate_reuses_all_but_one_token(engine):
    m = [ChatMessage.text("user", "Write a haiku about the wind.")]
    r1, *_ = turn(engine, m, "regen")
    r2, start, rows, logits = turn(engine, m, "regen")
    assert r2.stats.reused_tokens == len(r2.prompt_token_ids) - 1 and rows == 1
    assert r2.token_ids == r1.token_ids  # greedy: the same answer again
    torch.testing.assert_close(logits, cold_logits(engine, m), rtol=0, atol=1e-5)


def test_edit_in_the_middle_truncates_at_the_first_changed_token(engine):
    m = [ChatMessage.text("user", "Tell me about Paris."), ChatMessage.text("assistant", "It is in France."),
         ChatMessage.text("user", "And Rome?")]
    r1, *_ = turn(engine, m, "edit")
    edited = [ChatMessage.text("user", "Tell me about Lyon."), *m[1:]]
    old, new = r1.prompt_token_ids, engine.encode(edited).ids
    first_diff = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    r2, start, rows, logits = turn(engine, edited, "edit")
    assert r2.stats.reused_tokens == first_diff == start
    assert rows == len(new) - first_diff
    torch.testing.assert_close(logits, cold_logits(engine, edited), rtol=0, atol=1e-5)


def test_image_then_text_then_same_and_different_image(engine):
    cat = png(1)
    m1 = [ChatMessage("user", [cat, "What is this?"])]
    r1, *_ = turn(engine, m1, "img")
    span = engine.encode(m1).image_spans[0]
    misses = engine.vision.cache_misses

    # Turn 2, text only: the image block is reused whole and never re-encoded.
    m2 = m1 + [ChatMessage.text("assistant", r1.text), ChatMessage.text("user", "Are you sure?")]
    r2, start, rows, logits = turn(engine, m2, "img")
    assert r2.stats.reused_tokens >= len(r1.prompt_token_ids) > span.end
    assert engine.vision.cache_misses == misses
    torch.testing.assert_close(logits, cold_logits(engine, m2), rtol=0, atol=1e-5)

    # Turn 3 re-sends the same picture: its features come from the content-hash cache.
    m3 = m2 + [ChatMessage.text("assistant", r2.text), ChatMessage("user", [cat, "Look again."])]
    r3, start, rows, logits = turn(engine, m3, "img")
    assert engine.vision.cache_misses == misses
    assert r3.stats.reused_tokens >= len(r2.prompt_token_ids)
    torch.testing.assert_close(logits, cold_logits(engine, m3), rtol=0, atol=1e-5)

    # A different picture of the same size in turn 1: same [IMG] ids, but the cache is cut
    # exactly where that image starts.
    other = [ChatMessage("user", [png(2), "What is this?"])]
    assert engine.encode(other).ids == engine.encode(m1).ids
    r4, start, rows, logits = turn(engine, other, "img")
    assert r4.stats.reused_tokens == span.start == start
    assert engine.vision.cache_misses == misses + 1
    torch.testing.assert_close(logits, cold_logits(engine, other), rtol=0, atol=1e-5)


def test_switching_chats_restores_kv_from_the_prefix_cache(engine):
    a = [ChatMessage.text("user", "First chat, first question, " * 5)]
    b = [ChatMessage.text("user", "Second chat is about something else entirely, " * 5)]
    ra, *_ = turn(engine, a, "A")
    turn(engine, b, "B")  # takes the slot: A's KV stays as the prefix cache's blocks
    a2 = a + [ChatMessage.text("assistant", ra.text), ChatMessage.text("user", "Go on.")]
    r, start, rows, logits = turn(engine, a2, "A")
    block = engine.prefix_cache.block
    assert r.stats.reused_tokens >= (len(ra.prompt_token_ids) + len(ra.token_ids) - 1) // block * block > 0
    torch.testing.assert_close(logits, cold_logits(engine, a2), rtol=0, atol=1e-5)
    # A chat whose blocks were dropped is recomputed transparently.
    b2 = b + [ChatMessage.text("assistant", "ok"), ChatMessage.text("user", "More.")]
    engine.forget_chat(b2)
    engine.forget_session("B")
    r, start, rows, logits = turn(engine, b2, "B")
    assert r.stats.reused_tokens == 0 and start == 0
    torch.testing.assert_close(logits, cold_logits(engine, b2), rtol=0, atol=1e-5)


def test_context_overflow_and_no_projector_are_clear_errors():
    eng = LocalEngine(MODEL, None, device="cpu", context_length=32)
    with pytest.raises(EngineError, match="context length of 32"):
        eng.chat([ChatMessage.text("user", "word " * 100)], GREEDY)
    with pytest.raises(EngineError, match="no vision projector"):
        eng.chat([ChatMessage("user", [png(3), "hi"])], GREEDY)
    # The engine is still usable after both.
    assert eng.chat([ChatMessage.text("user", "hi")], SamplingParams(max_tokens=2, temperature=0)).token_ids
