"""runtime/prefix_cache.py on its own: chained block hashes, PrefixCache (the tier below the KV
pool) keeping a pool's blocks by name through put / get (one pair of tensors per pool part), its
byte budget evicting least recently used first, the disk tier's hooks (a recording stand-in: the
real tier is tests/.../test_prefix_disk.py), its lock, and ReplyMemory with encode_reusing_replies."""
from __future__ import annotations

import threading

import pytest
import torch

from support import FIXTURES
from tramontane.engine.api import ChatMessage, ImagePart, ToolCall
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.chat_format import encode_chat
from tramontane.engine.mistral3.tokenizer import Tokenizer
from tramontane.engine.runtime.kv_cache import KVPool
from tramontane.engine.runtime.prefix_cache import PrefixCache, ReplyMemory, block_hashes, encode_reusing_replies

B = 4
CPU = torch.device("cpu")


def _pool(n_blocks=8, seed=0, parts=None):
    """A random-filled pool of 2 layers, 2 heads, head_dim 8, blocks of B (parts: a split model)."""
    pool = KVPool(2, 8, 8, n_blocks, parts or [(2, torch.float32, CPU)], block=B)
    g = torch.Generator().manual_seed(seed)
    for t in pool.ks + pool.vs:
        t.copy_(torch.randn(t.shape, generator=g))
    return pool


def _equal(a, b) -> bool:
    return len(a[0]) == len(b[0]) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))


# -- block hashes ------------------------------------------------------------------------------

def test_block_hashes_name_full_blocks_and_chain_every_block_before():
    keys = list(range(11))
    hashes = block_hashes(keys, B)
    assert len(hashes) == 2 and all(len(h) == 16 for h in hashes)  # 11 keys: two full blocks
    assert block_hashes(keys[:8], B) == hashes and block_hashes(keys[:7], B) == hashes[:1]
    # the same block after a different first block has another name: a hash names a whole prefix
    other = block_hashes([99] + keys[1:8], B)
    assert other[0] != hashes[0] and other[1] != hashes[1]
    assert block_hashes(keys[:3], B) == []
    # going on from known hashes gives the chain computed from the start
    longer = list(range(20))
    assert block_hashes(longer, B, known=hashes) == block_hashes(longer, B)


def test_an_image_keys_hash_differs_from_its_bare_id():
    ids = [1, 10, 10, 10]
    assert block_hashes([(10, "a" * 64) if k == 10 else k for k in ids], B) != block_hashes(ids, B)
    assert block_hashes([(10, "a" * 64) if k == 10 else k for k in ids], B) != \
           block_hashes([(10, "b" * 64) if k == 10 else k for k in ids], B)
    # where in the block the image stands is part of the name too
    assert block_hashes([1, (10, "a" * 64), 10, 10], B) != block_hashes([1, 10, (10, "a" * 64), 10], B)


# -- put, get ----------------------------------------------------------------------------------

def test_put_then_get_gives_the_pools_block_bit_for_bit():
    pool = _pool()
    hashes = block_hashes(list(range(12)), B)
    pc = PrefixCache(1 << 20, block=B)
    for i, digest in enumerate(hashes):
        pc.put(digest, *pool.read_block(i))
    assert len(pc) == 3 and pc.used == 3 * pool.block_bytes
    pc.put(hashes[0], *pool.read_block(5))  # held already: kept as it was
    assert len(pc) == 3 and pc.used == 3 * pool.block_bytes
    for i, digest in enumerate(hashes):
        assert _equal(pc.get(digest), pool.read_block(i))
    assert pc.get(block_hashes(list(range(1, 5)), B)[0]) is None
    # written back into another pool, the block is the one spilled
    other = _pool(seed=9)
    other.write_block(7, *pc.get(hashes[1]))
    assert _equal(other.read_block(7), pool.read_block(1))
    before = pool.read_block(2)
    for t in pool.ks + pool.vs:  # the tier keeps copies, not views of the pool
        t.zero_()
    assert _equal(pc.get(hashes[2]), before)


def test_a_split_pool_keeps_one_pair_per_part():
    parts = [(1, torch.float32, CPU), (1, torch.float16, CPU)]
    pool = _pool(parts=parts)
    digest = block_hashes(list(range(4)), B)[0]
    pc = PrefixCache(1 << 20, block=B)
    pc.put(digest, *pool.read_block(3))
    ks, vs = pc.get(digest)
    assert [t.dtype for t in ks + vs] == [torch.float32, torch.float16] * 2
    assert [tuple(t.shape) for t in ks] == [(1, 2, B, 8)] * 2
    assert pc.used == pool.block_bytes and _equal((ks, vs), pool.read_block(3))


def test_the_budget_evicts_least_recently_used_first():
    pool = _pool()
    hashes = block_hashes(list(range(16)), B)
    size = pool.block_bytes
    pc = PrefixCache(3 * size, block=B)
    for i in range(3):
        pc.put(hashes[i], *pool.read_block(i))
    assert pc.used == 3 * size
    assert pc.get(hashes[0]) is not None  # block 0 becomes the most recently used
    pc.put(hashes[3], *pool.read_block(3))  # block 1, the least recently used, out
    assert [h in pc for h in hashes] == [True, False, True, True] and pc.used == 3 * size
    assert pc.get(hashes[1]) is None
    pc.forget(hashes[:1])
    assert pc.used == 2 * size and len(pc) == 2 and hashes[0] not in pc
    pc.clear()
    assert pc.used == 0 and len(pc) == 0 and pc.get(hashes[2]) is None


def test_a_block_over_the_budget_and_a_zero_budget_keep_nothing():
    pool = _pool()
    digest = block_hashes(list(range(4)), B)[0]
    for budget in (0, pool.block_bytes - 1):
        pc = PrefixCache(budget, block=B)
        pc.put(digest, *pool.read_block(0))
        assert len(pc) == 0 and pc.used == 0 and pc.get(digest) is None
    assert PrefixCache(-5).budget == 0


# -- the disk tier's hooks ---------------------------------------------------------------------

class RecordingDisk:
    """The PrefixDisk calls PrefixCache makes, on a dict; `full`: put refuses (a queue full)."""

    def __init__(self):
        self.blocks, self.puts, self.deleted, self.flushes, self.closed, self.full = {}, [], [], 0, False, False
        self.put_calls = 0

    def __contains__(self, digest):
        return digest in self.blocks

    def get(self, digest):
        got = self.blocks.get(digest)
        return None if got is None else ([t.clone() for t in got[0]], [t.clone() for t in got[1]])

    def put(self, digest, ks, vs):
        self.put_calls += 1
        if self.full or digest in self.blocks:
            return False
        self.puts.append(digest)
        self.blocks[digest] = (ks, vs)
        return True

    def delete(self, digests=(), reply_texts=()):
        self.deleted += list(digests)
        for d in digests:
            self.blocks.pop(d, None)

    def flush(self):
        self.flushes += 1
        self.full = False

    def close(self):
        self.closed = True


def test_every_block_put_goes_to_the_disk_once():
    pool = _pool()
    hashes = block_hashes(list(range(12)), B)
    disk = RecordingDisk()
    pc = PrefixCache(1 << 20, block=B, disk=disk)
    for _ in range(2):
        for i, digest in enumerate(hashes):
            pc.put(digest, *pool.read_block(i))
    assert disk.puts == hashes and disk.put_calls == 3  # a block the disk holds is not offered again
    assert torch.equal(disk.blocks[hashes[1]][0][0], pool.ks[0][:, 1])
    pc.persist(hashes[0], *pool.read_block(0))  # published blocks are queued the same way
    assert disk.put_calls == 3
    pc.forget(hashes[:1])
    assert disk.deleted == hashes[:1] and hashes[0] not in disk


def test_a_zero_budget_still_puts_to_the_disk():
    pool = _pool()
    digest = block_hashes(list(range(4)), B)[0]
    disk = RecordingDisk()
    pc = PrefixCache(0, block=B, disk=disk)
    pc.put(digest, *pool.read_block(2))
    assert len(pc) == 0 and disk.puts == [digest]
    assert _equal(pc.get(digest), pool.read_block(2))  # read back from its file


def test_a_block_missing_from_memory_is_read_from_disk():
    pool = _pool()
    hashes = block_hashes(list(range(12)), B)
    disk = RecordingDisk()
    first = PrefixCache(1 << 20, block=B, disk=disk)
    for i, digest in enumerate(hashes):
        first.put(digest, *pool.read_block(i))
    restarted = PrefixCache(1 << 20, block=B, disk=disk)  # a new process: memory empty
    assert len(restarted) == 0
    for i, digest in enumerate(hashes):
        assert _equal(restarted.get(digest), pool.read_block(i))
    assert restarted.get(block_hashes(list(range(1, 5)), B)[0]) is None


def test_close_writes_the_blocks_the_disk_lacks_then_stops_it():
    pool = _pool()
    hashes = block_hashes(list(range(8)), B)
    disk = RecordingDisk()
    disk.full = True  # the writer was too far behind when the blocks were put
    pc = PrefixCache(1 << 20, block=B, disk=disk)
    for i, digest in enumerate(hashes):
        pc.put(digest, *pool.read_block(i))
    assert disk.puts == []
    disk.full = True
    pc.close()
    assert sorted(disk.puts) == sorted(hashes) and disk.flushes == 1 and disk.closed
    PrefixCache(1 << 20).close()  # no disk tier: nothing to do


# -- the lock ----------------------------------------------------------------------------------

def test_a_callers_held_lock_keeps_other_threads_out():
    """A caller holding `lock` (the pool's spill under its own lock): another thread's put waits."""
    pool = _pool()
    digest = block_hashes(list(range(4)), B)[0]
    pc = PrefixCache(1 << 20, block=B)
    stored = threading.Event()
    worker = threading.Thread(target=lambda: (pc.put(digest, *pool.read_block(0)), stored.set()))
    with pc.lock:
        assert pc.get(digest) is None  # re-entrant: the holder's own calls go through
        worker.start()
        assert not stored.wait(0.3) and len(pc) == 0
    assert stored.wait(10) and len(pc) == 1
    worker.join()


# -- replies -----------------------------------------------------------------------------------

class RecordingReplyDisk:
    def __init__(self):
        self.replies, self.deleted = {}, []

    def put_reply(self, text, ids):
        self.replies[text] = list(ids)
        return True

    def get_reply(self, text):
        return self.replies.get(text)

    def delete(self, digests=(), reply_texts=()):
        self.deleted += list(reply_texts)


def test_reply_memory_is_a_bounded_lru():
    memory = ReplyMemory(capacity=2)
    memory.remember("a", [1])
    memory.remember("b", [2])
    assert memory.get("a") == [1]  # "a" now the most recent
    memory.remember("c", [3])
    assert (memory.get("a"), memory.get("b"), memory.get("c")) == ([1], None, [3])
    memory.remember("", [4])
    memory.remember("d", [])
    assert memory.get("") is None and memory.get("d") is None
    memory.forget(["a"])
    assert memory.get("a") is None and memory.get("c") == [3]


def test_remember_reply_keeps_only_complete_replies_whose_ids_are_their_text():
    decode = {(1, 2): "hi", (1, 3): "hi!"}.get
    memory = ReplyMemory()
    memory.remember_reply("hi", [1, 3], "stop", lambda ids: decode(tuple(ids)))  # ids say more
    memory.remember_reply("hi", [1, 2], "cancelled", lambda ids: decode(tuple(ids)))
    assert memory.get("hi") is None
    memory.remember_reply("hi", [1, 2], "length", lambda ids: decode(tuple(ids)))
    assert memory.get("hi") == [1, 2]
    off = ReplyMemory(capacity=0)
    off.remember_reply("hi", [1, 2], "stop", lambda ids: decode(tuple(ids)))
    assert off.get("hi") is None


def test_replies_on_disk_are_found_after_a_restart_if_they_pass_the_check():
    disk = RecordingReplyDisk()
    ReplyMemory(disk=disk).remember("hello", [5, 6])
    ReplyMemory(disk=disk).remember("bad", [7])
    assert disk.replies == {"hello": [5, 6], "bad": [7]}
    restarted = ReplyMemory(disk=disk, check=lambda text, ids: text != "bad")
    assert restarted.get("hello") == [5, 6] and restarted.get("bad") is None and restarted.get("x") is None
    disk.replies.clear()
    assert restarted.get("hello") == [5, 6]  # kept in memory once read
    restarted.forget(["hello"])
    assert disk.deleted == ["hello"] and restarted.get("hello") is None


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(open_gguf(FIXTURES / "mistral3_tiny-f32.gguf"))


def _grid(image):
    return (2, 3)


def _other_ids(tok, text):
    """The text as one piece per character: other ids than its canonical tokenization."""
    ids = [i for ch in text for i in tok.encode(ch)]
    assert ids != tok.encode(text) and tok.decode(ids) == text
    return ids


def test_a_remembered_reply_is_put_back_as_its_ids_and_later_images_move_with_it(tok):
    reply = "Sure thing"
    sampled = _other_ids(tok, reply)
    memory = ReplyMemory()
    memory.remember(reply, sampled)
    image = ImagePart(b"not decoded here", "x.png")
    conv = [ChatMessage.text("user", "Hi."), ChatMessage.text("assistant", reply),
            ChatMessage("user", ["Look:", image])]
    plain = encode_chat(tok, conv, _grid)
    got = encode_reusing_replies(tok, conv, _grid, memory)
    canonical = tok.encode(reply)
    at = next(i for i in range(len(plain.ids)) if plain.ids[i:i + len(canonical)] == canonical)
    assert got.ids == plain.ids[:at] + sampled + plain.ids[at + len(canonical):]  # the rest unchanged
    shift = len(sampled) - len(canonical)
    assert [(s.start, s.end, s.image.sha256) for s in got.image_spans] == \
           [(s.start + shift, s.end + shift, s.image.sha256) for s in plain.image_spans]


def test_a_reply_opening_the_conversation_follows_the_bos(tok):
    reply = "Welcome back"
    sampled = _other_ids(tok, reply)
    memory = ReplyMemory()
    memory.remember(reply, sampled)
    conv = [ChatMessage.text("assistant", reply), ChatMessage.text("user", "Thanks.")]
    plain = encode_chat(tok, conv, _grid).ids
    canonical = tok.encode(reply)
    assert plain[:1 + len(canonical)] == [tok.bos_id] + canonical  # what the format writes here
    assert encode_reusing_replies(tok, conv, _grid, memory).ids == [tok.bos_id] + sampled + plain[1 + len(canonical):]


def test_tool_turns_are_encoded_whole(tok):
    reply = "Let me check"
    memory = ReplyMemory()
    memory.remember(reply, _other_ids(tok, reply))
    call = ToolCall("abcdefghi", "lookup", "{}")
    conv = [ChatMessage.text("user", "Weather?"), ChatMessage.text("assistant", reply),
            ChatMessage.text("user", "In Paris."),
            ChatMessage("assistant", [], tool_calls=[call]),
            ChatMessage("tool", ["sunny"], tool_call_id="abcdefghi")]
    assert encode_reusing_replies(tok, conv, _grid, memory).ids == encode_chat(tok, conv, _grid).ids
