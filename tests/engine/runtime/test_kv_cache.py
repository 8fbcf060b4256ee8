"""Paged KV on its own: a pool of blocks per model (one (layers, n_blocks, kv_heads, block, d)
pair per segment, per-layer pools in layer order, CPU zeros committed only when written), and a
sequence's block table over it: blocks taken as positions are reserved, shared by reference,
copied before a shared or named block is written, given back on truncation; named blocks kept
for later prompts and spilled least recently used to the tier below when the pool runs out."""
from __future__ import annotations

import sys

import pytest
import torch

from support.rss import pages_present
from tramontane.engine.api import EngineError
from tramontane.engine.runtime.kv_cache import KVCache, KVPool, KVPoolFull

CPU = torch.device("cpu")


def _pool(n_blocks: int = 8, block: int = 4, parts=None) -> KVPool:
    return KVPool(2, 8, 6, n_blocks, parts or [(3, torch.float32, CPU)], block=block)


def test_layout_and_bytes():
    pool = _pool()
    # one block more than asked: the scratch block padding rows write to, never handed out
    assert [k.shape for k in pool.ks] == [(3, 9, 2, 4, 8)] and [v.shape for v in pool.vs] == [(3, 9, 2, 4, 6)]
    assert pool.scratch == 8 and pool.available() == 8
    assert len(pool.layer_k) == 3 and pool.layer_k[1].shape == (9, 2, 4, 8)
    assert pool.layer_k[1].data_ptr() == pool.ks[0][1].data_ptr()  # views, not copies
    assert pool.block_bytes == 3 * 2 * 4 * (8 + 6) * 4 and pool.nbytes == 8 * pool.block_bytes
    assert pool.positions == 32


def test_split_parts_give_one_pair_per_segment_in_layer_order():
    pool = _pool(parts=[(2, torch.float16, CPU), (3, torch.float32, CPU)])
    assert [k.dtype for k in pool.ks] == [torch.float16, torch.float32]
    assert len(pool.layer_k) == 5 and pool.layer_k[2].dtype == torch.float32
    pool.layer_k[3][1, 1, 2, 5] = 7.0  # layer 3 is the second part's layer 1
    assert pool.ks[1][1, 1, 1, 2, 5] == 7.0 and pool.ks[1].count_nonzero() == 1


@pytest.mark.parametrize("blocks", [0, -1])
def test_a_pool_without_blocks_is_refused(blocks):
    with pytest.raises(EngineError, match="needs blocks"):
        _pool(blocks)


def test_reserve_takes_blocks_as_positions_are_written_and_truncate_gives_them_back():
    pool = _pool()
    seq = KVCache(pool, 20)
    seq.reserve(5)
    assert len(seq.blocks) == 2 and pool.available() == 6
    seq.length = 5
    seq.reserve(3)  # positions 5..7 fit the second block
    assert len(seq.blocks) == 2
    seq.length = 8
    seq.truncate(3)
    assert len(seq.blocks) == 1 and pool.available() == 7
    with pytest.raises(ValueError, match="length 3 to 4"):
        seq.truncate(4)
    with pytest.raises(EngineError, match="context full: 3 \\+ 18 tokens exceed the context length 20"):
        seq.reserve(18)
    seq.release()
    assert seq.length == 0 and seq.blocks == [] and pool.available() == 8 and pool.in_use() == 0


def test_the_table_is_int32_on_the_device_and_follows_the_blocks():
    pool = _pool()
    seq = KVCache(pool, 32)
    seq.reserve(9)
    assert seq.table(CPU).dtype == torch.int32 and seq.table(CPU).tolist() == seq.blocks
    seq.length = 9
    seq.reserve(4)
    assert seq.table(CPU).tolist() == seq.blocks and len(seq.blocks) == 4


def test_a_shared_block_is_copied_before_it_is_written():
    pool = _pool()
    a = KVCache(pool, 32)
    a.reserve(6)
    pool.layer_k[0][a.blocks[1], 0, 0] = 3.0  # position 4 of a
    a.length = 6
    b = KVCache(pool, 32)
    for blk in a.blocks:
        pool.share(blk)
    b.adopt(a.blocks, 5)  # b agrees with a on 5 positions: the second block in part
    assert pool.refs[a.blocks[1]] == 2
    b.reserve(1)  # b writes position 5: into a copy of that block, not into a's
    assert b.blocks[0] == a.blocks[0] and b.blocks[1] != a.blocks[1]
    assert pool.refs[a.blocks[1]] == 1 and pool.refs[b.blocks[1]] == 1
    assert pool.layer_k[0][b.blocks[1], 0, 0, 0] == 3.0  # what it shared came along
    a.release()
    b.release()
    assert pool.available() == 8


def test_named_blocks_stay_for_later_prompts_and_are_never_written_in_place():
    pool = _pool(n_blocks=3)
    a = KVCache(pool, 12)
    a.reserve(6)
    a.length = 6
    a.publish([b"first"])
    assert pool.find(b"first") == a.blocks[0]
    kept = a.blocks[0]
    a.truncate(2)  # inside the named block: the next write copies it
    a.reserve(1)
    assert a.blocks[0] != kept and pool.find(b"first") == kept
    a.release()
    assert pool.find(b"first") == kept and pool.named() == 1  # nobody holds it, its content stays
    assert pool.available() == 3  # and it can be taken back when a block is needed


def test_a_second_copy_of_a_named_block_is_swapped_for_the_first():
    pool = _pool()
    a, b = KVCache(pool, 16), KVCache(pool, 16)
    for s in (a, b):
        s.reserve(4)
        s.length = 4
    a.publish([b"same"])
    b.publish([b"same"])
    assert b.blocks == a.blocks and pool.refs[a.blocks[0]] == 2 and pool.in_use() == 1


def test_when_the_pool_is_full_the_least_recently_used_named_block_is_spilled():
    pool = _pool(n_blocks=2)
    spilled = []
    pool.spill = lambda digest, ks, vs: spilled.append((digest, float(ks[0].sum())))
    for name, value in ((b"old", 1.0), (b"new", 2.0)):
        s = KVCache(pool, 4)
        s.reserve(4)
        pool.layer_k[0][s.blocks[0]].fill_(value)
        s.length = 4
        s.publish([name])
        s.release()
    pool.find(b"old")  # used again: now the newer of the two
    s = KVCache(pool, 8)
    s.reserve(1)
    assert spilled == [(b"new", 2.0 * 2 * 4 * 8)] and pool.find(b"new") is None and pool.find(b"old") is not None
    s.length = 4
    s.reserve(4)  # the other one too
    with pytest.raises(KVPoolFull, match="all held by running sequences"):
        KVCache(pool, 4).reserve(1)


def test_forgotten_names_free_their_blocks():
    pool = _pool(n_blocks=2)
    s = KVCache(pool, 8)
    s.reserve(8)
    s.length = 8
    s.publish([b"x", b"y"])
    s.publish_prefixes([(1, b"y-part")])
    s.release()
    pool.forget([b"x", b"y"])
    assert pool.named() == 1  # y's block still has its other name
    pool.forget([b"y-part"])
    assert pool.named() == 0 and pool.available() == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
def test_cpu_zeros_commit_a_page_only_when_it_is_written():
    # 1 layer, 1 head, 128 blocks of 32 positions of 256 float32: 1 KiB a position, 4 MiB in all
    pool = KVPool(1, 256, 256, 128, [(1, torch.float32, CPU)], block=32)
    k = pool.ks[0].numpy()
    assert not any(pages_present(k))  # torch.zeros would have written (committed) every page
    pool.layer_k[0][3, 0, 4:12] = 1.0  # 8 positions: 8 KiB, two pages
    present = pages_present(k)
    assert 1 <= sum(present) <= 3, sum(present)
    assert not any(pages_present(pool.vs[0].numpy()))


def test_an_empty_cpu_part_is_still_a_tensor():
    # a segment with no layers (a zero-byte mapping is impossible): plain zeros of that shape
    pool = KVPool(1, 4, 4, 2, [(0, torch.float32, CPU), (2, torch.float32, CPU)], block=4)
    assert pool.ks[0].shape == (0, 3, 1, 4, 4) and len(pool.layer_k) == 2
