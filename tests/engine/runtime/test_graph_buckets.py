"""Batched decode through the (rows, keys) CUDA graph buckets over the paged pool: R sequences,
each at its own length through its own block table, replayed from the bucket of the smallest
row count >= R (the rest padding rows), give what the same steps give eagerly; on the CPU the
capture is stood in for (support/eager_graphs.py) so the bookkeeping runs everywhere, on a GPU
the real graphs (device_check.sh runs the cuda-marked tests)."""
from __future__ import annotations

import pytest
import torch

from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.engine.runtime.decoder import decode_rows, new_pool
from tramontane.engine.runtime.kv_cache import KVCache

from support import FIXTURES
from support.eager_graphs import eager_graph_capture

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"


def _steps(model, graphed: bool, lengths, steps: int = 6):
    """Logits of `steps` batched decode steps of sequences prefilled to `lengths`, the pool with
    or without its graphs; every sequence's K/V read back after."""
    pool = new_pool(model, 512, capture_graphs=graphed, context_length=128)
    if graphed:
        assert pool.decode_graphs is not None
    g = torch.Generator().manual_seed(3)
    seqs = [KVCache(pool, 128) for _ in lengths]
    for seq, n in zip(seqs, lengths):
        model.forward(model.embed(torch.randint(3, 2000, (n,), generator=g).tolist()), 0, seq)
    tokens = [5 + i for i in range(len(seqs))]
    out = []
    for _ in range(steps):
        logits = decode_rows(model, tokens, seqs)
        out.append(logits)
        tokens = logits.argmax(-1).tolist()
    kv = [seq.read_positions(0) for seq in seqs]
    return torch.stack(out), kv


def _check(model, lengths):
    graphed, kv_g = _steps(model, True, lengths)
    eager, kv_e = _steps(model, False, lengths)
    torch.testing.assert_close(graphed, eager, rtol=0, atol=1e-4)
    for (kg, vg), (ke, ve) in zip(kv_g, kv_e):  # padding rows wrote nowhere a sequence reads
        torch.testing.assert_close(kg, ke, rtol=0, atol=1e-5)
        torch.testing.assert_close(vg, ve, rtol=0, atol=1e-5)


@pytest.mark.parametrize("lengths", [[9], [9, 40, 31], [33, 2, 64, 17, 5]])
def test_batched_graph_buckets_equal_eager_steps_with_the_stand_in(monkeypatch, lengths):
    model = Mistral3Text.load(MODEL, device="cpu")
    monkeypatch.setattr("tramontane.engine.runtime.decoder.graphs_enabled", lambda m: True)
    eager_graph_capture(monkeypatch)
    _check(model, lengths)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("lengths", [[9], [9, 40, 31], [33, 2, 64, 17, 5, 12, 8, 90]])
def test_batched_graph_buckets_equal_eager_steps_on_a_gpu(lengths):
    model = Mistral3Text.load(MODEL, device="cuda", dtype=torch.float32)
    _check(model, lengths)
