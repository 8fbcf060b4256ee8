"""KVCache on its own: one (layers, kv_heads, capacity, head_dim) pair of tensors per segment with
per-layer views into them, truncation within [0, length], and CPU zeros that commit no memory
until a position is written."""
from __future__ import annotations

import sys

import pytest
import torch

from support.rss import pages_present
from tramontane.engine.api import EngineError
from tramontane.engine.runtime.kv_cache import KVCache

CPU = torch.device("cpu")


def test_one_part_layout_and_bytes():
    cache = KVCache(3, 2, 8, 6, 40, torch.float32, CPU)
    assert cache.k.shape == (3, 2, 40, 8) and cache.v.shape == (3, 2, 40, 6)  # v_head_dim apart
    assert (cache.capacity, cache.dtype, cache.device, cache.length) == (40, torch.float32, CPU, 0)
    assert cache.nbytes == 3 * 2 * 40 * (8 + 6) * 4
    assert len(cache.layer_k) == len(cache.layer_v) == 3
    assert cache.decode_graphs is None and cache.native_steps == {}
    # zero-initialised: masked-out slots must be finite
    assert not cache.k.any() and not cache.v.any()


def test_split_layout_gives_one_pair_per_segment_and_views_in_layer_order():
    parts = [(2, torch.float16, CPU), (3, torch.float32, CPU)]
    cache = KVCache(5, 2, 4, 4, 16, torch.float32, CPU, parts)
    assert [k.shape for k in cache.ks] == [(2, 2, 16, 4), (3, 2, 16, 4)]
    assert [k.dtype for k in cache.ks] == [v.dtype for v in cache.vs] == [torch.float16, torch.float32]
    assert cache.nbytes == 2 * 2 * 16 * 8 * 2 + 3 * 2 * 16 * 8 * 4
    assert [t.dtype for t in cache.layer_k] == [torch.float16] * 2 + [torch.float32] * 3
    # layer 3 is the second segment's layer 1: a view, so a step's write lands in the segment tensor
    cache.layer_k[3][1, 5, 2] = 7.0
    cache.layer_v[0][0, 1, 0] = -2.0
    assert cache.ks[1][1, 1, 5, 2] == 7.0 and cache.ks[1].count_nonzero() == 1
    assert cache.vs[0][0, 0, 1, 0] == -2.0 and cache.vs[1].count_nonzero() == 0
    with pytest.raises(AttributeError, match="one tensor per segment"):
        cache.k
    with pytest.raises(AttributeError, match="one tensor per segment"):
        cache.v


@pytest.mark.parametrize("capacity", [0, -3])
def test_a_non_positive_capacity_is_refused(capacity):
    with pytest.raises(EngineError, match=f"context length must be positive, got {capacity}"):
        KVCache(1, 1, 4, 4, capacity, torch.float32, CPU)


def test_truncate_only_within_the_valid_positions():
    cache = KVCache(1, 1, 4, 4, 10, torch.float32, CPU)
    cache.length = 7
    cache.truncate(7)
    assert cache.length == 7
    cache.truncate(3)
    assert cache.length == 3
    for bad in (4, -1):  # past what is valid, or negative
        with pytest.raises(ValueError, match=f"length 3 to {bad}"):
            cache.truncate(bad)
    assert cache.length == 3
    cache.truncate(0)
    assert cache.length == 0
    cache.length = 5
    cache.reset()
    assert cache.length == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
def test_cpu_zeros_commit_a_page_only_when_it_is_written():
    # 1 layer, 1 head, 4096 positions of 256 float32: 1 KiB a position, 4 MiB in all
    cache = KVCache(1, 1, 256, 256, 4096, torch.float32, CPU)
    k = cache.k.numpy()
    assert not any(pages_present(k))  # torch.zeros would have written (committed) every page
    cache.layer_k[0][0, 100:108] = 1.0  # 8 positions: 8 KiB, two pages
    present = pages_present(k)
    assert 1 <= sum(present) <= 3, sum(present)
    assert not any(pages_present(cache.v.numpy()))
    assert float(cache.k.sum()) == 8 * 256 and float(cache.k[0, 0, :100].abs().sum()) == 0.0


def test_an_empty_cpu_part_is_still_a_tensor():
    # a segment with no layers (a zero-byte mapping is impossible): plain zeros of that shape
    cache = KVCache(2, 1, 4, 4, 8, torch.float32, CPU, [(0, torch.float32, CPU), (2, torch.float32, CPU)])
    assert cache.ks[0].shape == (0, 1, 8, 4) and len(cache.layer_k) == 2
