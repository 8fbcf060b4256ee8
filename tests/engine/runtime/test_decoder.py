"""runtime/decoder.py on its own, on the tiny fixture model (a 512-token file): the default context
(the plan's, capped by the file's), the KV dtypes it refuses, the sequences new_cache makes over a
pool of their own (whole blocks, bytes, per segment dtype, the free-memory refusal, rope tables for
every position) and decoding up to a full context, where it stops with a clear error and leaves
the cache as it was."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from support import FIXTURES
from tramontane.engine.api import EngineError
from tramontane.engine.mistral3.text import Mistral3Text, Segment
from tramontane.engine.runtime import decoder
from tramontane.engine.runtime.decoder import cpu_kv_dtype, decode, default_context_length, new_cache
from tramontane.engine.runtime.kv_cache import BLOCK_TOKENS
from tramontane.engine.runtime.memory import DEFAULT_CONTEXT
from tramontane.kernels import cpu_native

CPU = torch.device("cpu")
FILE_CONTEXT = 512  # mistral3_tiny's context_length


@pytest.fixture(scope="module")
def model():
    m = Mistral3Text.load(FIXTURES / "mistral3_tiny-f32.gguf", device="cpu")
    assert m.cfg.context_length == FILE_CONTEXT and m.cfg.n_layers == 2
    return m


@pytest.fixture
def planned(model):
    """The model's planned context and segments, restored after the test changes them."""
    before = model.planned_context, model.segments
    yield model
    model.planned_context, model.segments = before


def test_default_context_is_the_plans_capped_by_the_files(planned):
    planned.planned_context = 0  # no plan: DEFAULT_CONTEXT, but never more than the file's 512
    assert DEFAULT_CONTEXT > FILE_CONTEXT and default_context_length(planned) == FILE_CONTEXT
    planned.planned_context = 100
    assert default_context_length(planned) == 100
    planned.planned_context = 10_000
    assert default_context_length(planned) == FILE_CONTEXT
    planned.planned_context = 100
    assert new_cache(planned).capacity == 100


def test_a_plan_less_model_with_a_large_file_gets_default_context(planned, monkeypatch):
    monkeypatch.setattr(planned, "cfg", dataclasses.replace(planned.cfg, context_length=1 << 20))
    planned.planned_context = 0
    assert default_context_length(planned) == DEFAULT_CONTEXT


def test_cpu_kv_dtype_refusals(monkeypatch):
    assert cpu_kv_dtype("f32") == torch.float32
    for bad in ("bf16", "q8_0", ""):
        with pytest.raises(EngineError, match="not one of f32, f16"):
            cpu_kv_dtype(bad)
    monkeypatch.setattr(cpu_native, "AVAILABLE", True)
    assert cpu_kv_dtype("f16") == torch.float16
    monkeypatch.setattr(cpu_native, "AVAILABLE", False)
    with pytest.raises(EngineError, match="needs the native CPU kernels.*use kv_type f32"):
        cpu_kv_dtype("f16")
    assert cpu_kv_dtype("f32") == torch.float32  # f32 needs nothing


def test_new_cache_sizes(model):
    cache = new_cache(model, 48)
    cfg, pool = model.cfg, cache.pool
    # a pool of its own, in whole blocks: 48 positions are 2 blocks of BLOCK_TOKENS
    assert BLOCK_TOKENS == 32 and pool.n_blocks == 2 and pool.block == BLOCK_TOKENS
    # and the scratch block (padding rows of a graph bucket write there), never handed out
    assert [k.shape for k in pool.ks] == [(cfg.n_layers, 3, cfg.n_kv_heads, BLOCK_TOKENS, cfg.head_dim)]
    assert [v.shape for v in pool.vs] == [(cfg.n_layers, 3, cfg.n_kv_heads, BLOCK_TOKENS, cfg.v_head_dim)]
    assert cache.capacity == 48 and cache.dtype == torch.float32 and cache.length == 0
    assert cache.decode_graphs is None
    assert pool.nbytes == 2 * BLOCK_TOKENS * model.kv_bytes_per_token()
    assert cache.nbytes == 0  # a sequence's bytes are its blocks': none before a position is reserved
    cache.reserve(BLOCK_TOKENS + 1)
    assert len(cache.blocks) == 2 and cache.nbytes == pool.nbytes
    assert new_cache(model, 5000).capacity == FILE_CONTEXT  # capped by the file's context
    assert model.rope.length >= FILE_CONTEXT  # rope tables for every position the cache holds
    for bad in (0, -1):
        with pytest.raises(EngineError, match=f"context length must be positive, got {bad}"):
            new_cache(model, bad)


def test_f16_kv_is_for_cpu_segments_only(planned, monkeypatch):
    monkeypatch.setattr(cpu_native, "AVAILABLE", True)  # the dtype choice, not the kernels, under test
    meta = torch.device("meta")  # stands for an accelerator segment: keeps its own dtype
    planned.segments = [Segment("cpu", CPU, torch.float32, range(0, 1)),
                        Segment("meta", meta, torch.bfloat16, range(1, 2))]
    monkeypatch.setattr(planned, "ensure_rope", lambda n: None)  # no rope tables on "meta"
    cache = new_cache(planned, 16, kv_type="f16")
    assert [(k.shape[0], k.dtype, k.device.type) for k in cache.pool.ks] == \
           [(1, torch.float16, "cpu"), (1, torch.bfloat16, "meta")]
    assert [v.dtype for v in cache.pool.vs] == [torch.float16, torch.bfloat16]
    cache = new_cache(planned, 16)  # f32: each segment's own dtype
    assert [k.dtype for k in cache.pool.ks] == [torch.float32, torch.bfloat16]


def test_a_cache_larger_than_free_memory_is_refused(model, monkeypatch):
    need = 256 * model.kv_bytes_per_token()
    monkeypatch.setattr(decoder.host, "available_ram", lambda: need - 1)
    with pytest.raises(EngineError, match=r"KV cache of 256 tokens needs .* GiB.*lower the context length"):
        new_cache(model, 256)
    assert new_cache(model, 255).capacity == 255  # 255 tokens fit
    monkeypatch.setattr(decoder.host, "available_ram", lambda: 0)  # unknown: no refusal
    assert new_cache(model, 256).capacity == 256


def test_decode_fills_the_context_then_stops(model):
    prompt, tokens = [1, 5, 9, 33, 70], [11, 12, 13]
    cache = new_cache(model, len(prompt) + len(tokens))
    model.logits(prompt, 0, cache)
    assert cache.length == len(prompt)
    steps = [decode(model, t, cache) for t in tokens]
    assert cache.length == cache.capacity
    # each step's logits are the prefill's over the same ids (decode at cache.length, not elsewhere)
    full = model.logits(prompt + tokens, 0, new_cache(model, 16), all_logits=True)
    want = full[len(prompt):]
    got = torch.stack(steps)
    assert got.shape == (3, model.cfg.vocab_size) and got.dtype == torch.float32
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    blocks, before = list(cache.blocks), [t.clone() for t in cache.pool.ks + cache.pool.vs]
    with pytest.raises(EngineError, match=f"context full: the context length is {cache.capacity} tokens"):
        decode(model, 14, cache)
    assert cache.length == cache.capacity and cache.blocks == blocks
    assert all(torch.equal(t, b) for t, b in zip(cache.pool.ks + cache.pool.vs, before))


def test_decode_over_a_split_cpu_model(planned):
    """Two CPU segments: a cache of one pair per segment, and the same logits as one segment."""
    ids = [1, 5, 9, 33]
    whole = new_cache(planned, 8)
    planned.logits(ids, 0, whole)
    want = decode(planned, 40, whole)
    planned.segments = [Segment("cpu", CPU, torch.float32, range(0, 1)),
                        Segment("cpu:1", CPU, torch.float32, range(1, 2))]
    split = new_cache(planned, 8)
    assert len(split.pool.ks) == 2 and [k.shape[0] for k in split.pool.ks] == [1, 1]
    assert len(split.layer_k) == 2  # one pool per layer across the segments
    planned.logits(ids, 0, split)
    got = decode(planned, 40, split)
    assert split.length == 5
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
