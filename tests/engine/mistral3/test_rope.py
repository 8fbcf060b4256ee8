"""mistral3/rope.py against transformers' rotary embedding (the reference nobody here wrote):
plain RoPE's and YaRN's inverse frequencies and attention factor (ROPE_INIT_FUNCTIONS), and the
tables applied to rows in the file's interleaved-pair order equal to Ministral 3's
apply_rotary_pos_emb on the same rows in HF's half-split order, with its position-dependent query
scale (get_llama_4_attn_scale) on the queries."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is the reference (test extra)")

from transformers import Ministral3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.ministral3.modeling_ministral3 import (  # noqa: E402
    Ministral3RotaryEmbedding, apply_rotary_pos_emb, get_llama_4_attn_scale)

from support.cpu_reference import rope_reference  # noqa: E402
from tramontane.engine.mistral3.config import TextConfig  # noqa: E402
from tramontane.engine.mistral3.rope import build_rope_tables, query_scale, rope_inv_freq  # noqa: E402

HEAD_DIM = 32

# (name, TextConfig's rope fields): plain, Ministral 3's own (mscale_all_dim 1), other betas and
# log multipliers, none (get_mscale(factor) alone) and an attention factor the file states.
CASES = [
    ("plain", {}),
    ("ministral3", dict(rope_scaling="yarn", yarn_factor=16.0, yarn_original_context=16384,
                        yarn_log_multiplier=1.0, attn_temperature_scale=0.1)),
    ("betas", dict(rope_scaling="yarn", yarn_factor=8.0, yarn_original_context=4096, yarn_beta_fast=16.0,
                   yarn_beta_slow=2.0, yarn_log_multiplier=0.707)),
    ("no-log-multiplier", dict(rope_scaling="yarn", yarn_factor=4.0, yarn_original_context=8192)),
    ("stated-factor", dict(rope_scaling="yarn", yarn_factor=32.0, yarn_original_context=64,
                           yarn_attn_factor=0.9, attn_temperature_scale=0.25)),
]


def text_config(theta: float = 1e6, **rope) -> TextConfig:
    return TextConfig(arch="mistral3", n_layers=1, hidden=64, n_heads=2, n_kv_heads=1, head_dim=HEAD_DIM,
                      v_head_dim=HEAD_DIM, ffn=128, vocab_size=100, norm_eps=1e-5, rope_theta=theta,
                      rope_dim=HEAD_DIM, context_length=1 << 17, tied_embeddings=False, **rope)


def hf_config(cfg: TextConfig) -> Ministral3Config:
    params: dict = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "yarn":
        params = {"rope_type": "yarn", "rope_theta": cfg.rope_theta, "factor": cfg.yarn_factor,
                  "original_max_position_embeddings": cfg.yarn_original_context,
                  "beta_fast": cfg.yarn_beta_fast, "beta_slow": cfg.yarn_beta_slow,
                  "mscale": 1.0, "mscale_all_dim": cfg.yarn_log_multiplier,
                  "llama_4_scaling_beta": cfg.attn_temperature_scale}
        if cfg.yarn_attn_factor is not None:
            params["attention_factor"] = cfg.yarn_attn_factor
    return Ministral3Config(hidden_size=cfg.hidden, num_attention_heads=cfg.n_heads,
                            num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                            intermediate_size=cfg.ffn, vocab_size=cfg.vocab_size, num_hidden_layers=1,
                            max_position_embeddings=cfg.context_length, rope_parameters=params)


@pytest.mark.parametrize("rope", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_inverse_frequencies_and_attention_factor_are_transformers(rope):
    cfg = text_config(**rope)
    hf = hf_config(cfg)
    kind = hf.rope_parameters["rope_type"]
    init = Ministral3RotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    want_freq, want_factor = init(hf)
    freq, factor = rope_inv_freq(cfg)
    torch.testing.assert_close(freq, want_freq.to(torch.float32), rtol=1e-6, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)


def test_query_scale_is_llama4_attn_scale_and_absent_without_beta():
    cfg = text_config(rope_scaling="yarn", yarn_factor=16.0, yarn_original_context=64, attn_temperature_scale=0.1)
    positions = torch.arange(1000)
    want = get_llama_4_attn_scale(positions[None, :].float(), 0.1, 64)[0, 0, :, 0]
    torch.testing.assert_close(query_scale(cfg, positions), want, rtol=1e-6, atol=0)
    assert query_scale(text_config(), positions) is None


def _half_split(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs (x0, x1), (x2, x3)... -> HF's order: every pair's first member, then
    every second member (the permutation the GGUF converter undoes)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


@pytest.mark.parametrize("rope", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_tables_rotate_rows_as_transformers_does(rope):
    """Positions past the original context (the query scale's steps) for each case."""
    cfg = text_config(**rope)
    hf = hf_config(cfg)
    n = 300
    tables = build_rope_tables(cfg, n, torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    q = torch.randn(n, cfg.n_heads, HEAD_DIM, generator=g)
    k = torch.randn(n, cfg.n_kv_heads, HEAD_DIM, generator=g)
    positions = torch.arange(n)[None, :]
    cos, sin = Ministral3RotaryEmbedding(hf)(q, positions)
    q_hf, k_hf = (_half_split(t).transpose(0, 1)[None] for t in (q, k))  # (1, heads, n, d)
    want_q, want_k = apply_rotary_pos_emb(q_hf, k_hf, cos, sin)
    if cfg.attn_temperature_scale:
        want_q = want_q * get_llama_4_attn_scale(positions.float(), cfg.attn_temperature_scale,
                                                 cfg.yarn_original_context)
    got_q = _half_split(rope_reference(q, tables.cos_q, tables.sin_q)).transpose(0, 1)[None]
    got_k = _half_split(rope_reference(k, tables.cos_k, tables.sin_k)).transpose(0, 1)[None]
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    assert tables.length == n


def test_tables_take_the_compute_dtype_and_device():
    tables = build_rope_tables(text_config(), 8, torch.bfloat16, torch.device("cpu"))
    assert {t.dtype for t in (tables.cos_k, tables.sin_k, tables.cos_q, tables.sin_q)} == {torch.bfloat16}
    assert tables.cos_k.shape == (8, HEAD_DIM) and tables.cos_k.is_contiguous()
