"""The decoder's fused native CPU ops (RoPE + KV write, causal attention, SwiGLU) against the
same model with every such step on its torch reference (`_native_f32` answering False).

With float32 matmuls (cpu_exact) the two differ only by float32 rounding in attention and the
SwiGLU's exp: logits within 1e-5 of the largest |logit| (measured ~1e-6), greedy tokens
identical. With the native (int8-activation) matmuls too: greedy tokens identical. Prefill in
one pass, in chunks and a token at a time agree within the same bound.
"""
from __future__ import annotations

import os

import pytest
import torch

from support import FIXTURES
from support.fixture_models import greedy_tokens
from tramontane.engine.mistral3 import text as text_mod
from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.engine.runtime.decoder import decode, new_cache
from tramontane.kernels import cpu_native
from support.cpu_kernels import cpu_exact

pytestmark = [pytest.mark.skipif(not cpu_native.AVAILABLE, reason="native CPU kernels not built"),
              pytest.mark.cpu_variants]  # once per kernel variant this CPU can force


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 2048, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", ["mistral3_tiny-f32", "ministral3_tiny-f32", "mistral3_q256-llamacpp-Q4_K_M"])
def test_fused_ops_agree_with_the_torch_steps(monkeypatch, name):
    path = os.path.join(FIXTURES, f"{name}.gguf")
    ids = _ids(48, 21)
    with cpu_exact():
        model = Mistral3Text.load(path, device="cpu", dense_on_cpu=False)
        fused = model.logits(ids, all_logits=True)
        fused_tokens = greedy_tokens(model, ids[:12], 12)
        with monkeypatch.context() as m:
            m.setattr(text_mod, "_native_f32", lambda *tensors: False)
            torch_steps = model.logits(ids, all_logits=True)
            torch_tokens = greedy_tokens(model, ids[:12], 12)
    assert (fused - torch_steps).abs().max() <= 1e-5 * torch_steps.abs().max()
    assert fused_tokens == torch_tokens

    native = Mistral3Text.load(path, device="cpu")  # int8-activation matmuls as well
    tokens = greedy_tokens(native, ids[:12], 12)
    monkeypatch.setattr(text_mod, "_native_f32", lambda *tensors: False)
    assert tokens == greedy_tokens(native, ids[:12], 12)


def test_chunked_and_token_by_token_prefill_match_one_pass(monkeypatch):
    """Rows after a cached prefix see exactly their causal window (attention with start > 0)."""
    path = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
    ids = _ids(40, 22)
    with cpu_exact():
        model = Mistral3Text.load(path, device="cpu", dense_on_cpu=False)
        whole = model.logits(ids, all_logits=True)
        model.prefill_chunk = 16
        chunked = model.logits(ids, all_logits=True)
        cache = new_cache(model, len(ids))
        rows = [model.logits(ids[:25], 0, cache)] + [decode(model, t, cache) for t in ids[25:]]
    scale = whole.abs().max()
    assert (chunked - whole).abs().max() <= 1e-5 * scale
    assert (torch.stack(rows[:-1]) - whole[24:-1]).abs().max() <= 1e-5 * scale
