"""The shared prefix cache's parts: chained block hashes, the pool's named blocks spilled to the
byte-bounded LRU of host copies, and generated replies put back with their exact ids (otherwise
the chat format's own encoding, which tests/engine/mistral3 tie to mistral-common)."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from tramontane.engine.api import ChatMessage, ImagePart
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.chat_format import encode_chat
from tramontane.engine.runtime.kv_cache import KVCache, KVPool
from tramontane.engine.mistral3.tokenizer import Tokenizer
from tramontane.engine.runtime.prefix_cache import PrefixCache, ReplyMemory, block_hashes, encode_reusing_replies
from tramontane.engine.runtime.prefix_keys import position_keys

from support import FIXTURES

B = 4  # a small block size keeps the cases short


def test_block_hashes_name_the_whole_prefix():
    a = list(range(10, 22))  # 3 full blocks
    h = block_hashes(a, B)
    assert len(h) == 3 and len(set(h)) == 3
    assert block_hashes(a + [1, 2], B) == h  # a partial block is not named
    b = [99] + a[1:]
    hb = block_hashes(b, B)
    assert all(x != y for x, y in zip(h, hb))  # the same later blocks after another first block
    assert block_hashes(a[:8], B) == h[:2]


def test_an_image_changes_its_blocks_and_every_later_one():
    ids = [5] * 12

    class Span:
        def __init__(self, start, end, digest):
            self.start, self.end = start, end
            self.image = type("I", (), {"sha256": digest})()

    one = block_hashes(position_keys(ids, [Span(4, 8, "a" * 64)]), B)
    two = block_hashes(position_keys(ids, [Span(4, 8, "b" * 64)]), B)
    plain = block_hashes(ids, B)
    assert one[0] == two[0] == plain[0]
    assert one[1] != two[1] and one[2] != two[2] and one[1] != plain[1]


def _pool(n_blocks=4, layers=2):
    pool = KVPool(2, 8, 8, n_blocks, [(layers, torch.float32, torch.device("cpu"))], block=B)
    g = torch.Generator().manual_seed(0)
    for t in pool.ks + pool.vs:
        t.copy_(torch.randn(t.shape, generator=g))
    return pool


def _written(pool, keys):
    """A sequence over pool holding len(keys) positions, its full blocks published by name, released."""
    seq = KVCache(pool, pool.positions)
    seq.reserve(len(keys))
    seq.length = len(keys)
    hashes = block_hashes(keys, B)
    seq.publish(hashes)
    blocks = list(seq.blocks)
    seq.release()
    return hashes, blocks


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))


def test_blocks_round_trip_exactly_and_the_lru_stays_in_budget():
    pool = _pool()
    hashes, blocks = _written(pool, list(range(100, 114)))  # 3 full blocks named, kept after release
    assert pool.named() == 3 and pool.in_use() == 0 and pool.available() == 4
    kept = [pool.read_block(b) for b in blocks[:3]]
    cache = PrefixCache(budget_bytes=2 * pool.block_bytes, block=B)
    pool.spill = cache.put
    assert pool.find(hashes[1]) == blocks[1]  # block 1 used again: spilled last
    seq = KVCache(pool, pool.positions)
    seq.reserve(3 * B)  # the free block, then the least recently used named ones: 0, then 2
    assert pool.find(hashes[0]) is None and pool.find(hashes[2]) is None and pool.find(hashes[1]) == blocks[1]
    assert len(cache) == 2 and cache.used == 2 * pool.block_bytes
    assert _same(cache.get(hashes[2]), kept[2]) and _same(cache.get(hashes[0]), kept[0])  # 0 read last
    seq.reserve(4 * B)  # block 1 goes too: the least recently used of the host tier (2, after get(0)) out
    assert pool.named() == 0 and cache.used <= cache.budget and len(cache) == 2
    assert cache.get(hashes[2]) is None and _same(cache.get(hashes[1]), kept[1])
    # read back into a fresh pool's block: the very positions written first
    other = _pool()
    for t in other.ks + other.vs:
        t.zero_()
    other.write_block(3, *cache.get(hashes[0]))
    assert _same(other.read_block(3), kept[0])


def test_a_zero_budget_holds_nothing():
    pool = _pool(n_blocks=2)
    hashes, _ = _written(pool, list(range(8)))
    cache = PrefixCache(0, block=B)
    pool.spill = cache.put
    KVCache(pool, pool.positions).reserve(2 * B)  # both named blocks reused: spilled, none kept
    assert pool.named() == 0 and len(cache) == 0 and cache.used == 0 and cache.get(hashes[0]) is None


def _photo(seed: int) -> ImagePart:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (42, 56, 3), dtype=np.uint8)).save(buf, "PNG")
    return ImagePart(buf.getvalue(), f"p{seed}.png")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(open_gguf(FIXTURES / "mistral3_tiny-f32.gguf"))


def grid(image):
    return (2, 3)


def test_without_remembered_replies_the_encoding_is_encode_chats(tok):
    conv = [ChatMessage.text("system", "Be kind."), ChatMessage("user", [_photo(1), "What is this?"]),
            ChatMessage.text("assistant", "A picture."), ChatMessage("user", ["And this?", _photo(2)])]
    want = encode_chat(tok, conv, grid)
    got = encode_reusing_replies(tok, conv, grid, ReplyMemory())
    assert got.ids == want.ids
    assert [(s.start, s.end, s.image.sha256) for s in got.image_spans] == \
           [(s.start, s.end, s.image.sha256) for s in want.image_spans]
    # a remembered reply whose ids are its canonical tokenization changes nothing, spans included
    memory = ReplyMemory()
    memory.remember("A picture.", tok.encode("A picture."))
    got = encode_reusing_replies(tok, conv, grid, memory)
    assert got.ids == want.ids
    assert [(s.start, s.end) for s in got.image_spans] == [(s.start, s.end) for s in want.image_spans]


def test_a_generated_reply_comes_back_with_the_ids_that_were_sampled(tok):
    text = "Hello there"
    canonical = tok.encode(text)
    # the same text as other ids: one piece per character (what a model may well have sampled)
    sampled = [i for ch in text for i in tok.encode(ch)]
    assert sampled != canonical and tok.decode(sampled) == text
    memory = ReplyMemory()
    memory.remember(text, sampled)
    first = [ChatMessage.text("user", "Greet me.")]
    conv = first + [ChatMessage.text("assistant", text), ChatMessage.text("user", "Again.")]
    got = encode_reusing_replies(tok, conv, grid, memory)
    head = encode_chat(tok, first, grid).ids
    tail = encode_chat(tok, [ChatMessage.text("user", "Again.")], grid).ids[1:]
    assert got.ids == head + sampled + [tok.eos_id] + tail
    # two assistant messages in a row merge in the format: left to encode_chat
    merged = first + [ChatMessage.text("assistant", text), ChatMessage.text("assistant", "more"),
                      ChatMessage.text("user", "Again.")]
    assert encode_reusing_replies(tok, merged, grid, memory).ids == encode_chat(tok, merged, grid).ids


def test_a_finished_reply_is_kept_only_if_its_ids_decode_to_its_text(tok):
    text = "Hello there"
    sampled = [i for ch in text for i in tok.encode(ch)]  # decodes to text, not its canonical ids
    past_stop = tok.encode(text + " STOP")  # a stop string " STOP" cut the text short of these ids
    assert tok.decode(sampled) == text and tok.decode(past_stop) != text
    memory = ReplyMemory()
    memory.remember_reply(text, past_stop, "stop", tok.decode)
    assert memory.get(text) is None
    memory.remember_reply(text, sampled, "cancelled", tok.decode)  # not run to its end
    assert memory.get(text) is None
    memory.remember_reply(text, sampled, "stop", tok.decode)
    assert memory.get(text) == sampled
    memory.remember_reply("", [], "length", tok.decode)  # nothing sampled: nothing kept
    assert memory.get("") is None
