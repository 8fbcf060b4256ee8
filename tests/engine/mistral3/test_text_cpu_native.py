"""The decoder on the native CPU kernels against the float32 torch path (cpu_exact) end to end.

The native kernels quantize activations to int8 per block (llama.cpp's method), so logits are
not bit-equal to the float32 path. Stated tolerances, from what these fixtures show (measured:
greedy identical, perplexity within 2e-3 relative, F16 within 1e-8):
  greedy tokens identical for 16 steps; perplexity within 5e-3 relative (1e-6 for F16, whose
  activations stay float32); logits within 3% of the largest |logit|.
A kernel error (a wrong nibble order, scale or offset) moves logits by O(1).
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from support import FIXTURES
from tramontane.engine.cli.run import token_nll
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.tokenizer import Tokenizer
from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.kernels import cpu_native
from support.cpu_kernels import cpu_exact
from support.fixture_models import greedy_tokens

pytestmark = [pytest.mark.skipif(not cpu_native.AVAILABLE, reason="native CPU kernels not built"),
              pytest.mark.cpu_variants]  # once per kernel variant this CPU can force

FILES = ["mistral3_tiny-q8_0", "mistral3_q256-Q4_K_M", "mistral3_q256-Q6_K", "mistral3_q256-Q5_K",
         "mistral3_q256-Q4_0", "mistral3_q256-llamacpp-Q4_K_M", "mistral3_tiny-f16"]


@pytest.mark.parametrize("name", FILES)
def test_native_cpu_model_agrees_with_float32_path(name):
    path = os.path.join(FIXTURES, f"{name}.gguf")
    ids = torch.randint(0, 2048, (160,), generator=torch.Generator().manual_seed(4)).tolist()
    native = Mistral3Text.load(path, device="cpu")
    with open_gguf(path) as gf:
        tok = Tokenizer.from_gguf(gf)
    assert not native.dense_weights and native.layers[0].wqkv is None  # mapped, not copied
    with cpu_exact():
        exact = Mistral3Text.load(path, device="cpu", dense_on_cpu=False)
        want_logits = exact.logits(ids[:40], all_logits=True)
        want_tokens = greedy_tokens(exact, ids[:16], 16)
        nll_e, n_e = token_nll(exact, tok, ids, 64, 32)
    logits = native.logits(ids[:40], all_logits=True)
    assert (logits - want_logits).abs().max() <= 0.03 * want_logits.abs().max()
    assert greedy_tokens(native, ids[:16], 16) == want_tokens
    nll_n, n_n = token_nll(native, tok, ids, 64, 32)
    assert n_n == n_e
    ppl_e, ppl_n = math.exp(nll_e / n_e), math.exp(nll_n / n_n)
    tol = 1e-6 if name.endswith("f16") else 5e-3
    assert abs(ppl_n - ppl_e) <= tol * ppl_e, (ppl_n, ppl_e)
