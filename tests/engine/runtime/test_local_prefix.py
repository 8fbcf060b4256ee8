"""LocalEngine and the shared prefix cache: a new chat with a known system prompt copies its
blocks, a chat reopened after a restart copies them from disk (damaged files are ignored), and
the prompt's reading reports its progress. Every reused answer equals a cold engine's on the
same prompt (greedy tokens, and the raw logits' log-probabilities to float32 rounding)."""
from __future__ import annotations

import json
import logging
import os
import threading

import pytest

from tramontane.engine.api import ChatMessage, EngineError, SamplingParams
from tramontane.engine.mistral3.chat_format import EncodedPrompt, encode_chat
from tramontane.engine.runtime.local import LocalEngine
from tramontane.engine.runtime.prefix_disk import PrefixDisk

from support import FIXTURES

MODEL = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
SYSTEM = ChatMessage.text("system", "You answer questions about sailing boats, tides and the weather at sea. " * 3)


def _engine(**kwargs) -> LocalEngine:
    return LocalEngine(MODEL, None, device="cpu", context_length=512, **kwargs)


@pytest.fixture(scope="module")
def cold():
    """A reference engine that never reuses anything: each call starts from an empty cache."""
    eng = _engine(kv_host_budget_mb=0)
    yield eng
    eng.close()


def cold_answer(cold, prompt_ids):
    """The same prompt ids read from nothing."""
    cold.forget_session("cold")
    return cold.generate_from(EncodedPrompt(list(prompt_ids)), GREEDY, session_key="cold")


def assert_same_answer(got, want):
    assert got.prompt_token_ids == want.prompt_token_ids
    assert got.token_ids == want.token_ids
    for a, b in zip(got.logprobs, want.logprobs):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top]


def test_an_unusable_disk_folder_is_refused_before_loading(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    monkeypatch.setattr(LocalEngine, "_load_vision", lambda *a: pytest.fail("loaded before the check"))
    monkeypatch.setattr("tramontane.engine.runtime.local.plan_for_files",
                        lambda *a, **k: pytest.fail("planned before the check"))
    with pytest.raises(EngineError, match="cannot keep the KV cache there"):
        _engine(kv_disk_dir=blocker / "kv")


def test_the_budget_is_shared_not_doubled():
    eng = _engine(kv_host_budget_mb=64)
    # on the CPU the pool is host memory: the budget is more blocks of it, no copies beside it
    per_token = eng.model.kv_bytes_per_token()
    extra = eng.pool.positions - eng.plan.context_length
    assert 0 <= extra - eng._host_kv_budget(64 << 20) // per_token < eng.pool.block
    assert eng.prefix_cache.budget == 0 and eng.prefix_cache.disk is None
    eng.close()


def test_a_new_chat_with_a_known_system_prompt_reuses_its_blocks(cold):
    eng = _engine()
    first = [SYSTEM, ChatMessage.text("user", "When is high tide?")]
    r1 = eng.chat(first, GREEDY, session_key="one")
    assert r1.stats.reused_tokens == 0
    second = [SYSTEM, ChatMessage.text("user", "Which knot holds best?")]
    r2 = eng.chat(second, GREEDY, session_key="two")
    shared = next(i for i, (a, b) in enumerate(zip(r1.prompt_token_ids, r2.prompt_token_ids)) if a != b)
    assert shared >= 32
    # the one slot still holds chat one: the common prefix is kept in place, to the token
    assert r2.stats.reused_tokens == shared
    assert r2.stats.prefilled_tokens == len(r2.prompt_token_ids) - r2.stats.reused_tokens
    assert_same_answer(r2, cold_answer(cold, r2.prompt_token_ids))
    # the reply's blocks are published with its exact ids: the next turn of chat one, asked from
    # a third session (no KV of its own), reuses past the end of the first prompt
    follow = first + [ChatMessage.text("assistant", r1.text), ChatMessage.text("user", "And tomorrow?")]
    r3 = eng.chat(follow, GREEDY, session_key="three")
    assert r3.prompt_token_ids[:len(r1.prompt_token_ids)] == r1.prompt_token_ids
    assert r3.prompt_token_ids[len(r1.prompt_token_ids):][:len(r1.token_ids)] == r1.token_ids
    # every position chat one left in the pool: its prompt and its reply but the last id (never fed)
    assert r3.stats.reused_tokens == len(r1.prompt_token_ids) + len(r1.token_ids) - 1
    assert_same_answer(r3, cold_answer(cold, r3.prompt_token_ids))
    eng.close()


def _long_chat():
    return [SYSTEM, ChatMessage.text("user", "Tell me about the moon and the tides. " * 8)]


def test_a_chat_reopened_after_a_restart_reuses_its_blocks_from_disk(tmp_path, cold):
    folder = tmp_path / "kv-cache"
    messages = _long_chat()
    eng = _engine(kv_disk_dir=folder)
    r1 = eng.chat(messages, GREEDY, session_key="chat")
    eng.close()  # writes what is still queued
    files = os.listdir(folder)
    cached = len(r1.prompt_token_ids) + len(r1.token_ids) - 1  # prompt and reply, all but its last id
    assert sum(f.endswith(".kv") for f in files) == -(-cached // 32)  # the full blocks and the last, in part
    assert sum(f.endswith(".ids") for f in files) == 1  # the reply's sampled ids

    again = messages + [ChatMessage.text("assistant", r1.text), ChatMessage.text("user", "Why?")]
    n1 = len(r1.prompt_token_ids)
    # the reply as sampled is not what its text encodes to: without its ids the blocks past it would not match
    assert encode_chat(cold.tokenizer, again, None).ids[n1:n1 + len(r1.token_ids)] != r1.token_ids
    restarted = _engine(kv_disk_dir=folder)
    assert len(restarted.prefix_cache) == 0  # nothing in memory: every block comes from a file
    r2 = restarted.chat(again, GREEDY, session_key="chat")
    assert r2.prompt_token_ids[n1:n1 + len(r1.token_ids)] == r1.token_ids  # the ids back from disk
    assert r2.stats.reused_tokens == cached > 0
    assert_same_answer(r2, cold_answer(cold, r2.prompt_token_ids))
    restarted.close()

    # a reply ids file that does not decode to the reply's text is not used
    (reply_file,) = [folder / f for f in os.listdir(folder) if f.endswith(".ids")]
    magic, record = reply_file.read_bytes()[:8], json.loads(reply_file.read_bytes()[8:])
    record["ids"] = record["ids"] * 2  # decodes to the text twice
    reply_file.write_bytes(magic + json.dumps(record).encode())
    third = _engine(kv_disk_dir=folder)
    assert third.encode(again).ids == encode_chat(cold.tokenizer, again, None).ids
    third.close()


def test_a_deleted_chat_leaves_no_blocks_or_reply_ids_behind(tmp_path):
    """Deleting a chat takes what the cache holds of its content with it: its blocks in memory
    and their files, and its reply's sampled ids (the ids decode to the reply's text)."""
    folder = tmp_path / "kv-cache"
    messages = _long_chat()
    eng = _engine(kv_disk_dir=folder)
    r1 = eng.chat(messages, GREEDY, session_key="chat")
    eng.prefix_cache.disk.flush()
    assert any(f.endswith(".kv") for f in os.listdir(folder)) and eng.pool.named() > 0
    chat = messages + [ChatMessage.text("assistant", r1.text)]
    eng.forget_chat(chat)
    assert eng.pool.named() == 0 and len(eng.prefix_cache) == 0 and eng.prefix_cache.used == 0
    assert eng.replies.get(r1.text) is None
    eng.close()  # nothing queued comes back at close
    assert os.listdir(folder) == []
    restarted = _engine(kv_disk_dir=folder)
    assert restarted.chat(chat + [ChatMessage.text("user", "Why?")], GREEDY, session_key="chat").stats.reused_tokens == 0
    restarted.close()


def test_damaged_or_foreign_files_are_ignored_after_a_restart(tmp_path, cold, caplog):
    folder = tmp_path / "kv-cache"
    messages = _long_chat()
    eng = _engine(kv_disk_dir=folder)
    r1 = eng.chat(messages, GREEDY, session_key="chat")
    disk = eng.prefix_cache.disk
    from tramontane.engine.runtime.prefix_cache import block_hashes
    from tramontane.engine.runtime.prefix_keys import position_keys

    hashes = block_hashes(position_keys(r1.prompt_token_ids, []), 32)
    eng.close()
    assert len(hashes) >= 3
    first, second = folder / disk.name_of(hashes[0]), folder / disk.name_of(hashes[1])
    data = bytearray(second.read_bytes())
    data[-1] ^= 1
    second.write_bytes(bytes(data))  # block 1: one flipped bit

    restarted = _engine(kv_disk_dir=folder)
    with caplog.at_level(logging.WARNING, logger="tramontane.engine.runtime.prefix_disk"):
        r2 = restarted.chat(messages, GREEDY, session_key="other")
    assert r2.stats.reused_tokens == 32  # block 0 only: the chain stops at the damaged block
    assert "checksum mismatch" in caplog.text
    assert_same_answer(r2, cold_answer(cold, r2.prompt_token_ids))
    restarted.close()
    # the block read again was published again: a good file replaced the damaged one
    assert PrefixDisk(folder, disk.model_id, disk.layout).get(hashes[1]) is not None

    # block 0 cut short, and the folder then opened by another model's engine (another identity)
    first.write_bytes(first.read_bytes()[:1000])
    caplog.clear()
    other = LocalEngine(os.path.join(FIXTURES, "mistral3_tiny-q8_0.gguf"), None, device="cpu",
                        context_length=512, kv_disk_dir=folder)
    assert other.prefix_cache.disk.model_id != disk.model_id
    r3 = other.chat(messages, GREEDY, session_key="x")
    assert r3.stats.reused_tokens == 0
    other.close()
    again = _engine(kv_disk_dir=folder)
    with caplog.at_level(logging.WARNING, logger="tramontane.engine.runtime.prefix_disk"):
        r4 = again.chat(messages, GREEDY, session_key="y")
    assert "truncated" in caplog.text
    assert_same_answer(r4, cold_answer(cold, r4.prompt_token_ids))
    again.close()


def test_prompt_progress_is_reported_chunk_by_chunk(cold):
    eng = _engine()
    eng.model.prefill_chunk = 16
    messages = _long_chat()
    seen = []
    r = eng.chat(messages, GREEDY, session_key="p", on_prompt_progress=lambda done, total: seen.append((done, total)))
    n = len(r.prompt_token_ids)
    assert seen == [(0, n)] + [(min(lo + 16, n), n) for lo in range(0, n, 16)]
    assert_same_answer(r, cold_answer(cold, r.prompt_token_ids))  # the same passes as one forward call

    # the next turn reads only its new tokens: progress counts those
    seen.clear()
    follow = messages + [ChatMessage.text("assistant", r.text), ChatMessage.text("user", "Ok.")]
    r2 = eng.chat(follow, GREEDY, session_key="p", on_prompt_progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (r2.stats.prefilled_tokens, r2.stats.prefilled_tokens)

    # a cancel between chunks stops the reading there
    cancel = threading.Event()
    seen.clear()

    def stop_after_two(done, total):
        seen.append(done)
        if done >= 32:
            cancel.set()

    r3 = eng.chat([ChatMessage.text("user", "Something else entirely. " * 30)], GREEDY, session_key="c",
                  cancel=cancel, on_prompt_progress=stop_after_two)
    assert r3.stats.finish_reason == "cancelled" and seen == [0, 16, 32]
    eng.close()


def test_a_batch_executor_on_the_engine_shares_its_blocks_and_reply_ids(tmp_path, cold):
    from tramontane.engine.server.executor import BatchExecutor

    eng = _engine(kv_disk_dir=tmp_path / "kv")
    executor = BatchExecutor(eng, slots=2)
    assert executor.scheduler.prefix is eng.prefix_cache and executor.scheduler.replies is eng.replies
    messages = _long_chat()
    served = executor.engine.chat(messages, GREEDY)  # an API conversation, through the scheduler
    executor.shutdown()
    # the window's next turn of it, on the engine itself, copies the scheduler's blocks and
    # encodes its reply with the ids the scheduler sampled
    follow = messages + [ChatMessage.text("assistant", served.text), ChatMessage.text("user", "Why?")]
    r = eng.chat(follow, GREEDY, session_key="window")
    n1 = len(served.prompt_token_ids)
    assert r.prompt_token_ids[n1:n1 + len(served.token_ids)] == served.token_ids
    assert r.stats.reused_tokens == n1 + len(served.token_ids) - 1  # every position the API reply left
    assert_same_answer(r, cold_answer(cold, r.prompt_token_ids))
    eng.close()
