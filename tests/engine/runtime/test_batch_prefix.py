"""The shared prefix cache's parts: chained block hashes, the byte-bounded LRU of KV blocks, and
generated replies put back with their exact ids (otherwise the chat format's own encoding,
which tests/engine/mistral3 tie to mistral-common)."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from tramontane.engine.api import ChatMessage, ImagePart
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.chat_format import encode_chat
from tramontane.engine.runtime.kv_cache import KVCache
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


def _cache(capacity=32, layers=2):
    return KVCache(layers, 2, 8, 8, capacity, torch.float32, torch.device("cpu"))


def test_blocks_round_trip_exactly_and_the_lru_stays_in_budget():
    src = _cache()
    g = torch.Generator().manual_seed(0)
    src.k.copy_(torch.randn(src.k.shape, generator=g))
    src.v.copy_(torch.randn(src.v.shape, generator=g))
    src.length = 14  # 3 full blocks
    keys = list(range(100, 114))
    hashes = block_hashes(keys, B)
    block_bytes = 2 * 2 * 2 * B * 8 * 4  # k and v, 2 layers, 2 heads, B positions, 8 dims, f32
    cache = PrefixCache(budget_bytes=3 * block_bytes, block=B)
    assert cache.store(hashes, src) == 3 and cache.used == 3 * block_bytes
    assert cache.store(hashes, src) == 0  # already held
    dst = _cache()
    assert cache.match(hashes) == 3
    cache.load(hashes, dst)
    assert dst.length == 12
    assert torch.equal(dst.k[:, :, :12], src.k[:, :, :12]) and torch.equal(dst.v[:, :, :12], src.v[:, :, :12])
    # a fourth block evicts the least recently used one: match touched 0, 1, 2 in order, so 0
    other = block_hashes(list(range(500, 504)), B)
    src.length = 4
    cache.store(other, src)
    assert cache.used <= cache.budget and len(cache) == 3
    assert cache.match(hashes) == 0  # its first block is gone, so nothing after it is matched
    assert hashes[1] in cache and hashes[2] in cache


def test_a_zero_budget_holds_nothing():
    src = _cache()
    src.length = 8
    cache = PrefixCache(0, block=B)
    assert cache.store(block_hashes(list(range(8)), B), src) == 0 and len(cache) == 0


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
